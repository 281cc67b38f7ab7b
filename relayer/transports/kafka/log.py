"""What the Kafka transport logs of librdkafka: its log lines and the hints for its errors.

librdkafka reports a broker that cannot be reached twice (a ``FAIL`` log line and the same text
through the error callback) and again at every reconnect attempt, many times a second. Here
each line names the transport's path (``stores.<store>.transports.<name>``), goes out at most
once per facility and interval (relayer.observability.throttle), and lines nobody can act on are
dropped.

This module does not import confluent_kafka: errors are matched by their code's number.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from relayer.observability.throttle import ThrottledLog
from relayer.redact import redact

_LOGGER = logging.getLogger("relayer.transports.kafka.librdkafka")
# librdkafka's thread tag at the start of each line: "[thrd:app]: ", "[thrd:host:9092/1]: ".
_THREAD = re.compile(r"^\[thrd:[^\]]*\]: ")

# librdkafka error codes (rdkafka.h) of a cluster that cannot be reached right now.
_UNREACHABLE = frozenset(
    {
        -195,  # _TRANSPORT: broker transport failure
        -193,  # _RESOLVE: host resolution failure
        -187,  # _ALL_BROKERS_DOWN
        -185,  # _TIMED_OUT
    }
)
_AUTHENTICATION = -169  # _AUTHENTICATION
_SSL = -181  # _SSL


def error_hint(code: int | None) -> str:
    """What to do about a librdkafka error reported through the error callback."""
    if code in _UNREACHABLE:
        return (
            "check bootstrap.servers, the network and that the brokers run; rows wait (no "
            "attempt is counted) and are sent once a broker answers"
        )
    if code == _AUTHENTICATION:
        return "check the transport's sasl.* settings and the user's rights on the brokers"
    if code == _SSL:
        return "check the transport's ssl.* settings (certificates, CA, host name)"
    return "librdkafka retries by itself; if this repeats, check the brokers' logs"


def _is_noise(facility: str, text: str) -> bool:
    # relayer sets enable.gapless.guarantee on purpose (per-key order depends on it); the
    # warning that it is experimental leaves the user nothing to do.
    return facility == "CONFWARN" and "enable.gapless.guarantee" in text


class LibrdkafkaLog:
    """confluent-kafka's ``logger`` for one transport (it calls ``log(level, fmt, *args)``
    with args ``(facility, client name, text)``)."""

    def __init__(self, path: str, store: str | None) -> None:
        self._path = path
        self._store = store
        self._log = ThrottledLog(_LOGGER)

    def log(self, level: int, message: str, *args: Any) -> None:
        if len(args) == 3:
            facility, text = str(args[0]), str(args[2])
        else:
            facility, text = "", message % args if args else message
        if _is_noise(facility, text):
            return
        if facility == "FAIL":
            # The same failure reaches the error callback, which logs it with a hint.
            level = logging.DEBUG
        text = redact(_THREAD.sub("", text))
        self._log.log(
            level,
            (facility, level),
            "%s: librdkafka %s: %s",
            self._path,
            facility,
            text,
            extra={"action": "transport_log", "store": self._store},
        )

    def flush_due(self) -> None:
        self._log.flush_due()

    def flush(self) -> None:
        self._log.flush()
