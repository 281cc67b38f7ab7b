"""The relay's send pipeline (relayer.relay.pipeline.BatchSender) against the MemoryTransport's
faults, without a database: per-key order, whose fault a failure is, and what stays unsent."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence

import pytest

from relayer.relay.pipeline import IN_FLIGHT, UNSENT, BatchSender
from relayer.settings import store_settings
from relayer.store import LaneRows
from relayer.testing.pipeline import Sent, relay_messages
from relayer.transports.base import OutboundBatch, OutgoingMessage, Settle
from relayer.transports.memory import MemoryTransport
from relayer.transports.routing import Routing


def messages(keys: int, per_key: int, destination: str = "events") -> list[OutgoingMessage]:
    """Rows for each key, interleaved (k0#0, k1#0, ..., k0#1, ...), in id order."""
    return [
        OutgoingMessage(uuid.uuid4(), destination, f"k{key}#{number}".encode(), key=f"k{key}")
        for number in range(per_key)
        for key in range(keys)
    ]


def outcomes(sent: Sequence[Sent]) -> list[str]:
    return [each.outcome for each in sent]


@pytest.fixture(params=[True, False], ids=["gapless", "stop-and-wait"])
async def memory(request: pytest.FixtureRequest) -> MemoryTransport:
    transport = MemoryTransport("memory", pipelines_within_key=request.param)
    await transport.start()
    return transport


async def test_every_row_is_acknowledged_in_order_per_key(memory: MemoryTransport) -> None:
    sent = await relay_messages(memory, messages(20, 5))
    assert outcomes(sent) == ["acked"] * 100
    by_key: dict[str | None, list[str]] = {}
    for message in memory.received("events"):
        by_key.setdefault(message.key, []).append(message.body.decode())
    assert by_key == {f"k{key}": [f"k{key}#{n}" for n in range(5)] for key in range(20)}


async def test_a_failed_row_stops_only_its_key(memory: MemoryTransport) -> None:
    rows = messages(4, 3)
    memory.fail_message(rows[5].id, retryable=False, message="refused")  # k1's second row
    sent = await relay_messages(memory, rows)
    assert (sent[5].outcome, sent[5].error, sent[5].permanent) == ("failed", "refused", True)
    assert sent[9].outcome in ("failed", "unsent")  # k1's third row never goes ahead of it
    others = [each.outcome for index, each in enumerate(sent) if rows[index].key != "k1"]
    assert others == ["acked"] * 9
    assert sent[1].outcome == "acked"  # k1's first row went before the failure
    assert [m.body for m in memory.received("events") if m.key == "k1"] == [b"k1#0"]


async def test_a_broker_that_cannot_be_reached_is_no_rows_fault(memory: MemoryTransport) -> None:
    memory.disconnect("the broker is restarting")
    sent = await relay_messages(memory, messages(3, 2))
    # Each key's first row met the outage; its later rows were never handed over (or met it
    # too): nothing failed, no attempt is counted against any row.
    assert outcomes(sent)[:3] == ["unavailable"] * 3
    assert set(outcomes(sent)[3:]) <= {"unavailable", "unsent"}
    assert all("the broker is restarting" in each.error for each in sent[:3])


async def test_rows_without_an_acknowledgement_by_the_deadline_stay_unresolved() -> None:
    memory = MemoryTransport("memory")
    await memory.start()
    memory.stall()  # accepted, never answered
    sent = await relay_messages(memory, messages(2, 2), deadline=0.05)
    assert set(outcomes(sent)) <= {"unacknowledged", "unsent"}
    assert "unacknowledged" in outcomes(sent)
    memory.resume()


async def test_destinations_that_cannot_keep_order_fail_their_rows_only() -> None:
    memory = MemoryTransport("memory", unordered_destinations=["fanout"])
    memory.declare_unknown("ghost")
    await memory.start()
    rows = [*messages(2, 1, "fanout"), *messages(2, 1, "ghost"), *messages(2, 1, "events")]
    rows = [
        OutgoingMessage(row.id, row.destination, row.body, key=f"{row.destination}-{row.key}")
        for row in rows
    ]
    sent = await relay_messages(memory, rows)
    assert outcomes(sent) == ["failed", "failed", "failed", "failed", "acked", "acked"]
    assert "does not keep per-key order" in sent[0].error
    assert "cannot check destination 'ghost'" in sent[2].error


class BuggyBatches(MemoryTransport):
    """A plug-in whose publish_batch raises what no transport may raise."""

    async def publish_batch(
        self,
        batch: OutboundBatch,
        indexes: Sequence[int],
        settle: Settle,
        admitting: Callable[[], bool],
    ) -> int:
        raise KeyError("a plug-in's bug")


async def test_a_plugin_bug_fails_its_rows_instead_of_the_batch() -> None:
    buggy = BuggyBatches("memory")
    await buggy.start()
    sent = await relay_messages(buggy, messages(2, 2))
    # Every row the call was given fails (their keys are parked); nothing else is lost.
    assert outcomes(sent) == ["failed"] * 4
    assert sent[0].error == 'KeyError: "a plug-in\'s bug"'
    assert not sent[0].permanent


def lane_rows(rows: Sequence[OutgoingMessage], transports: Sequence[str | None]) -> LaneRows:
    batch = OutboundBatch(
        [str(row.id) for row in rows],
        [row.key or "" for row in rows],
        [row.destination for row in rows],
        [row.body for row in rows],
        [None] * len(rows),
    )
    return LaneRows([0] * len(rows), batch, list(transports), [False] * len(rows))


async def test_a_row_naming_an_unconfigured_transport_fails_with_what_to_configure() -> None:
    memory = MemoryTransport("memory")
    await memory.start()
    store = store_settings(
        name="orders", transports={"memory": {"type": "memory"}}, default_transport="memory"
    )
    rows = messages(2, 1)
    sender = BatchSender(
        lane_rows(rows, ["nowhere", None]),
        range(2),
        Routing(store, {"memory": memory}),
        admit_until=float("inf"),
        wait_until=asyncio.get_running_loop().time() + 30,
        clock=asyncio.get_running_loop().time,
    )
    report = await sender.run()
    error, permanent = report.failures[0]
    assert "transport 'nowhere' is not configured for store 'orders'" in error
    assert not permanent
    assert report.states[1] != UNSENT and 1 not in report.failures  # the other row went


async def test_a_stopping_worker_admits_no_new_row_but_waits_for_what_went() -> None:
    memory = MemoryTransport("memory", pipelines_within_key=False)
    await memory.start()
    memory.stall()
    store = store_settings(
        name="orders", transports={"memory": {"type": "memory"}}, default_transport="memory"
    )
    rows = messages(1, 3)  # one key: stop-and-wait sends its first row only
    clock = asyncio.get_running_loop().time
    sender = BatchSender(
        lane_rows(rows, [None] * 3),
        range(3),
        Routing(store, {"memory": memory}),
        admit_until=float("inf"),
        wait_until=clock() + 30,
        clock=clock,
    )
    running = asyncio.ensure_future(sender.run())
    while not memory.held:
        await asyncio.sleep(0)
    sender.stop_admitting()
    memory.release()  # the first row's acknowledgement: its key's next row is not admitted
    report = await running
    assert list(report.states) == [2, UNSENT, UNSENT]  # ACKED, then nothing more
    assert report.cut_short
    assert IN_FLIGHT not in report.states
