"""What the Kafka transport logs: librdkafka's lines and errors, named after the transport,
once per cause; and no asyncio report for the acknowledgements a caller abandoned."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError

from relayer.transports.kafka import KafkaTransport
from relayer.transports.kafka.log import LibrdkafkaLog
from tests.unit.transports.test_kafka_producer import FakeProducer, message, until

GAPLESS = (
    "[thrd:app]: Configuration property enable.gapless.guarantee is experimental: When set to "
    "`true`, any error that could result in a gap in the produced message series when a batch "
    "of messages fails, will raise a fatal error (ERR__GAPLESS_GUARANTEE) and stop the producer."
)
REFUSED = (
    "[thrd:127.0.0.1:9/bootstrap]: 127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: "
    "Connection refused (after 0ms in state CONNECT)"
)


def test_librdkafka_lines_name_the_transport_and_drop_the_gapless_notice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="relayer.transports.kafka")
    log = LibrdkafkaLog("stores.orders.transports.kafka", "orders")
    # confluent-kafka calls logger.log(level, "%s [%s] %s", facility, client, text)
    log.log(logging.WARNING, "%s [%s] %s", "CONFWARN", "rdkafka#producer-1", GAPLESS)
    log.log(
        logging.WARNING,
        "%s [%s] %s",
        "CONFWARN",
        "rdkafka#producer-1",
        "[thrd:app]: Configuration property group.id is a consumer property and will be ignored",
    )
    for _ in range(50):
        log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", REFUSED)
    records = caplog.records
    shown = [(r.levelno, r.getMessage()) for r in records]
    assert shown == [
        (
            logging.WARNING,
            "stores.orders.transports.kafka: librdkafka CONFWARN: Configuration property "
            "group.id is a consumer property and will be ignored",
        ),
        # The error callback reports the same failure with a hint: this copy is DEBUG, once.
        (
            logging.DEBUG,
            "stores.orders.transports.kafka: librdkafka FAIL: 127.0.0.1:9/bootstrap: Connect to "
            "ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT)",
        ),
    ]
    assert {r.action for r in records} == {"transport_log"}  # type: ignore[attr-defined]
    assert {r.store for r in records} == {"orders"}  # type: ignore[attr-defined]


async def test_errors_are_logged_once_per_cause_with_the_store_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="relayer.transports.kafka")
    producers: list[FakeProducer] = []
    transport = KafkaTransport(
        "kafka",
        {"bootstrap.servers": "fake:9092"},
        producer_factory=lambda config: FakeProducer(config, producers),
        store="orders",
    )
    await transport.start()
    try:
        report = producers[0].config["error_cb"]
        for _ in range(200):
            report(KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:9 failed"))
            report(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    finally:
        await transport.close()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings[:2]] == [
        "stores.orders.transports.kafka: _TRANSPORT: Connect to ipv4#127.0.0.1:9 failed; check "
        "bootstrap.servers, the network and that the brokers run; rows wait (no attempt is "
        "counted) and are sent once a broker answers",
        "stores.orders.transports.kafka: _ALL_BROKERS_DOWN: 1/1 brokers are down; check "
        "bootstrap.servers, the network and that the brokers run; rows wait (no attempt is "
        "counted) and are sent once a broker answers",
    ]
    # close() writes what it held back, with the count: 2 more lines, no more.
    assert len(warnings) == 4
    assert [getattr(r, "suppressed", None) for r in warnings[2:]] == [198, 198]
    assert all(getattr(r, "store", None) == "orders" for r in warnings)


class CountingExceptionHandler:
    """The event loop's exception handler: what asyncio reports ("Future exception was never
    retrieved" and the like)."""

    def __init__(self) -> None:
        self.reports: list[str] = []

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.reports.append(f"{context['message']}: {context.get('exception')!r}")


async def test_acknowledgements_abandoned_by_their_caller_are_never_reported() -> None:
    """A stuck producer is rebuilt: every message it held fails ("Purged in queue"). A caller
    that gave up on them (a batch deadline, a stopping worker) must not cause one asyncio
    error line per message."""
    handler = CountingExceptionHandler()
    asyncio.get_running_loop().set_exception_handler(handler)
    producers: list[FakeProducer] = []
    transport = KafkaTransport(
        "kafka",
        {"bootstrap.servers": "fake:9092"},
        producer_factory=lambda config: FakeProducer(config, producers),
    )
    await transport.start()
    try:
        old = producers[0]
        old.deliver = False
        for number in range(200):
            await transport.publish(message(str(number)))  # the acknowledgement is dropped
        with old.lock:
            old.fatal = KafkaError(KafkaError._FATAL, "idempotence broke", fatal=True)
        await until(lambda: len(producers) == 2)
        producers[1].deliver = False
        for number in range(200):
            await transport.publish(message(str(number)))
    finally:
        await transport.close()  # fails what the second producer held
    gc.collect()
    await asyncio.sleep(0.05)
    assert handler.reports == []
