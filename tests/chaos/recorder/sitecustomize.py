"""Loaded at start-up by the chaos suite's worker processes (their PYTHONPATH holds this
folder): when RELAYER_TEST_DELIVERIES_DIR is set, every Kafka delivery report the worker's
producer hands to the relay is also written to ``deliveries-<pid>.txt`` there, one line each:
``<message id> <partition> <offset> <error name or ok>``.

A row the broker never served although the relay deleted it is then told apart: either the
broker acknowledged it (and at which offset, and what it serves there), or no report said so.
The line is written with one ``os.write`` on an O_APPEND descriptor in the producer's poll
thread, before the report reaches the event loop, so a SIGKILL loses no acknowledged line.
"""

from __future__ import annotations

import os
from typing import Any


def _install(folder: str) -> None:
    from relayer.transports import kafka

    descriptor = os.open(
        os.path.join(folder, f"deliveries-{os.getpid()}.txt"),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        0o644,
    )

    def write(message_id: str, error: Any, report: Any) -> None:
        outcome = "ok" if error is None else error.name()
        line = f"{message_id} {report.partition()} {report.offset()} {outcome}\n"
        os.write(descriptor, line.encode())

    settle, deliver = kafka._record_settle, kafka._record_delivery

    def record_settle(settles: Any, target: Any, error: Any, report: Any) -> None:
        write(target[2], error, report)
        settle(settles, target, error, report)

    def record_delivery(
        delivered: Any, future: Any, message_id: str, error: Any, report: Any
    ) -> None:
        write(message_id, error, report)
        deliver(delivered, future, message_id, error, report)

    kafka._record_settle = record_settle
    kafka._record_delivery = record_delivery


if _folder := os.environ.get("RELAYER_TEST_DELIVERIES_DIR"):
    _install(_folder)
