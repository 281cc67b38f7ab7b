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

import importlib.abc
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

_MODULE = "relayer.transports.kafka.deliveries"


class _Patcher(importlib.abc.MetaPathFinder):
    """Patches the Kafka transport's deliveries module once it is imported: importing it
    here, at start-up, would load relayer before ``python -m`` put the working folder on
    sys.path."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module
        folder = self.folder

        def exec_module(module: ModuleType) -> None:
            run(module)
            _install(module, folder)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install(deliveries: Any, folder: str) -> None:
    descriptor = os.open(
        os.path.join(folder, f"deliveries-{os.getpid()}.txt"),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        0o644,
    )

    def write(message_id: str, error: Any, report: Any) -> None:
        outcome = "ok" if error is None else error.name()
        line = f"{message_id} {report.partition()} {report.offset()} {outcome}\n"
        os.write(descriptor, line.encode())

    record = deliveries.record_report

    def record_report(reports: Any, placements: Any, target: Any, error: Any, report: Any) -> None:
        write(target[-1], error, report)  # a target's last item is its message id
        record(reports, placements, target, error, report)

    deliveries.record_report = record_report


if _folder := os.environ.get("RELAYER_TEST_DELIVERIES_DIR"):
    sys.meta_path.insert(0, _Patcher(_folder))
