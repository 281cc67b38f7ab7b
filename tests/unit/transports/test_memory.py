"""MemoryTransport: recording, fault injection and the gapless rule, all without I/O."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from relayer.errors import TransportError
from relayer.transports.base import (
    DestinationError,
    OutgoingMessage,
    SendError,
    Transport,
    TransportUnavailableError,
)
from relayer.transports.memory import MemoryTransport


def message(
    key: str | None = "a", destination: str = "orders", body: bytes = b"x"
) -> OutgoingMessage:
    return OutgoingMessage(uuid.uuid4(), destination, body, key=key)


@pytest.fixture
async def memory() -> AsyncIterator[MemoryTransport]:
    transport = MemoryTransport()
    await transport.start()
    yield transport
    await transport.close()


async def outcome(awaitable: object) -> BaseException | None:
    try:
        await awaitable  # type: ignore[misc]
    except Exception as exc:
        return exc
    return None


async def test_is_a_transport_and_records_in_order(memory: MemoryTransport) -> None:
    assert isinstance(memory, Transport)
    sent = [message("a"), message("b", "billing"), message("a")]
    for item in sent:
        assert await outcome(await memory.publish(item)) is None
    assert memory.received("orders") == [sent[0], sent[2]]
    assert memory.received("billing") == [sent[1]]
    assert memory.received_all() == sent
    assert memory.published == sent
    assert [ack.message for ack in memory.acknowledged] == sent
    assert memory.destinations == ["orders", "billing"]


async def test_without_a_stall_the_outcome_is_ready_when_publish_returns(
    memory: MemoryTransport,
) -> None:
    acknowledgement = await memory.publish(message())
    assert isinstance(acknowledgement, asyncio.Future) and acknowledgement.done()


async def test_fail_next_counts_and_carries_retryable_and_text(memory: MemoryTransport) -> None:
    memory.fail_next(2, retryable=False, message="broker said no")
    first, second, third = [await outcome(await memory.publish(message(k))) for k in "abc"]
    assert isinstance(first, SendError) and not first.retryable and str(first) == "broker said no"
    assert isinstance(second, SendError)
    assert third is None
    assert [m.key for m in memory.received_all()] == ["c"]


async def test_fail_key_until_cleared(memory: MemoryTransport) -> None:
    memory.fail_key("a")
    assert isinstance(await outcome(await memory.publish(message("a"))), SendError)
    assert await outcome(await memory.publish(message("b"))) is None
    memory.clear_key("a")
    assert await outcome(await memory.publish(message("a"))) is None


async def test_fail_message_by_id(memory: MemoryTransport) -> None:
    doomed = message("a")
    memory.fail_message(doomed.id, retryable=False)
    error = await outcome(await memory.publish(doomed))
    assert isinstance(error, SendError) and not error.retryable
    memory.clear_faults()
    assert await outcome(await memory.publish(doomed)) is None


async def test_stall_holds_acknowledgements_until_released_in_order(
    memory: MemoryTransport,
) -> None:
    memory.stall()
    acknowledgements = [await memory.publish(message(k)) for k in "abc"]
    assert not any(ack.done() for ack in acknowledgements)  # type: ignore[attr-defined]
    assert memory.held == 3
    assert len(memory.received_all()) == 3  # accepted by the broker, only the acks are held
    assert memory.release(1) == 1
    assert [a.done() for a in acknowledgements] == [True, False, False]  # type: ignore[attr-defined]
    memory.resume()
    assert all(a.done() for a in acknowledgements)  # type: ignore[attr-defined]
    assert [ack.message.key for ack in memory.acknowledged] == ["a", "b", "c"]


async def test_stall_with_a_delay_releases_by_itself(memory: MemoryTransport) -> None:
    memory.stall(delay=0.01)
    acknowledgement = await memory.publish(message())
    assert not acknowledgement.done()  # type: ignore[attr-defined]
    await acknowledgement
    assert memory.held == 0


async def test_gapless_a_failure_fails_later_in_flight_messages_of_its_key(
    memory: MemoryTransport,
) -> None:
    memory.stall()
    first = message("a")
    memory.fail_message(first.id)
    acknowledgements = [
        await memory.publish(m) for m in (first, message("a"), message("b"), message("a"))
    ]
    memory.resume()
    results = [await outcome(a) for a in acknowledgements]
    assert isinstance(results[0], SendError) and isinstance(results[1], SendError)
    assert results[2] is None and isinstance(results[3], SendError)
    assert [m.key for m in memory.received_all()] == ["b"]
    # Once the failure was reported, the key is sendable again (the relay retries it).
    assert await outcome(await memory.publish(message("a"))) is None


async def test_without_pipelining_a_failure_stays_alone() -> None:
    memory = MemoryTransport(pipelines_within_key=False)
    await memory.start()
    assert memory.pipelines_within_key is False
    memory.stall()
    first = message("a")
    memory.fail_message(first.id)
    acknowledgements = [await memory.publish(m) for m in (first, message("a"))]
    memory.resume()
    assert isinstance(await outcome(acknowledgements[0]), SendError)
    assert await outcome(acknowledgements[1]) is None
    await memory.close()


async def test_destinations_can_be_unordered_or_unknown(memory: MemoryTransport) -> None:
    assert await memory.ordered_by_key("orders") is True
    memory.declare_unordered("fanout")
    assert await memory.ordered_by_key("fanout") is False
    memory.declare_unknown("nowhere", "no such place; fix it")
    with pytest.raises(DestinationError, match="no such place"):
        await memory.ordered_by_key("nowhere")
    error = await outcome(await memory.publish(message(destination="nowhere")))
    assert isinstance(error, SendError) and not error.retryable
    memory.declare_ordered("nowhere")
    assert await memory.ordered_by_key("nowhere") is True
    assert memory.lookups == ["orders", "fanout", "nowhere", "nowhere"]


async def test_start_can_fail_and_publish_needs_start() -> None:
    memory = MemoryTransport("broken")
    memory.fail_start()
    with pytest.raises(TransportError, match="injected start failure"):
        await memory.start()
    with pytest.raises(TransportError, match="not started"):
        await memory.publish(message())
    memory.clear_start_failure()
    await memory.start()
    await memory.close()
    with pytest.raises(TransportError, match="closed"):
        await memory.publish(message())


async def test_close_reports_every_held_outcome(memory: MemoryTransport) -> None:
    memory.stall()
    acknowledgements = [await memory.publish(message(k)) for k in "ab"]
    await memory.close()
    assert all(a.done() for a in acknowledgements)  # type: ignore[attr-defined]


async def test_disconnect_fails_held_outcomes_and_publishes(memory: MemoryTransport) -> None:
    memory.stall()
    held = await memory.publish(message())
    memory.disconnect("network down")
    assert isinstance(await outcome(held), TransportUnavailableError)
    with pytest.raises(TransportUnavailableError, match="network down"):
        await memory.publish(message())
    memory.reconnect()
    memory.resume()
    assert await outcome(await memory.publish(message())) is None


def test_from_options() -> None:
    transport = MemoryTransport.from_options(
        "test",
        {
            "pipelines_within_key": "false",
            "unordered_destinations": "a, b",
            "unknown_destinations": ["c"],
        },
    )
    assert transport.name == "test"
    assert transport.pipelines_within_key is False


def test_from_options_refuses_unknown_options() -> None:
    with pytest.raises(TransportError, match="not an option of the memory transport"):
        MemoryTransport.from_options("test", {"pipelined": True})
