"""Relaying a store's due rows once, synchronously, inside a test.

``drain`` (or ``await drain_async``) does what the workers would, on two connections of its own
and without a worker: it probes every lane, sends the lanes with a due head in lane batches
(per-key order, parked keys, fenced outcomes: the relay's own code), sends the unordered rows,
and repeats until a round makes no progress. Rows it leaves are future-dated, belong to parked
keys, or could not be sent (``Drained.errors`` says why).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from relayer.relay.batch import LaneRelay
from relayer.relay.results import Scan, after_probe
from relayer.relay.unordered import UnorderedSender
from relayer.settings import StoreSettings
from relayer.store import RelayStore
from relayer.store.driver import connect
from relayer.transports.base import Transport
from relayer.transports.routing import Routing

MEMBER = "relayer-testing"
# Lanes per batch transaction (the worker's coalescer serves as many together).
_LANES_PER_BATCH = 64
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Drained:
    """What one drain did: rows acknowledged (and deleted), rows that failed (an ordered row's
    key is parked; an unordered row is retried later), and why batches could not send."""

    sent: int = 0
    failed: int = 0
    errors: tuple[str, ...] = ()


def routes(
    store: StoreSettings, transport: Transport | Mapping[str, Transport]
) -> dict[str, Transport]:
    """``transport`` under each transport name the store knows (one transport: all of them)."""
    if isinstance(transport, Mapping):
        return dict(transport)
    names = {*store.transports, transport.name}
    if store.default_transport is not None:
        names.add(store.default_transport)
    return dict.fromkeys(names, transport)


async def drain_async(
    store: StoreSettings,
    transport: Transport | Mapping[str, Transport],
    *,
    member: str = MEMBER,
    rounds: int = 100,
) -> Drained:
    """Relay every due row of ``store`` through ``transport`` (started: see ``routes``); at
    most ``rounds`` rounds. Database trouble raises StoreError."""
    routing = Routing(store, routes(store, transport))
    relay = LaneRelay(store, routing, member)
    # Unordered rows are claimed at once, not after the grace the workers give the writers.
    unordered = UnorderedSender(store.model_copy(update={"unordered_grace": timedelta(0)}), routing)
    database = RelayStore(store)
    sent = failed = 0
    errors: list[str] = []
    probe = await connect(store, purpose="testing probe")
    batch = await connect(store, autocommit=False, purpose="testing batch")
    try:
        await database.prepare(probe)
        lanes = range(store.lanes)
        for _ in range(rounds):
            progress = False
            heads = await database.probe(probe, lanes)
            due = [head.lane for head in heads if after_probe(head, member, relay.poll) is None]
            for start in range(0, len(due), _LANES_PER_BATCH):
                for result in await relay.send_lanes(batch, due[start : start + _LANES_PER_BATCH]):
                    sent += result.sent
                    failed += result.failed
                    progress = progress or bool(result.sent or result.failed or result.cut_short)
                    if result.scan in (Scan.FAILED, Scan.UNAVAILABLE) or result.detail:
                        errors.append(f"lane {result.lane}: {result.detail}")
            outcome = await unordered.recover(batch, store.batch_size)
            sent += outcome.sent
            failed += outcome.failed
            progress = progress or bool(outcome.sent or outcome.failed)
            if outcome.error:
                errors.append(f"unordered rows: {outcome.error}")
            if not progress:
                break
    finally:
        await batch.close()
        await probe.close()
    return Drained(sent, failed, tuple(dict.fromkeys(errors)))


def drain(
    store: StoreSettings,
    transport: Transport | Mapping[str, Transport],
    *,
    member: str = MEMBER,
    rounds: int = 100,
) -> Drained:
    """``drain_async`` for synchronous tests (in a thread of its own if an event loop runs)."""
    return run_sync(drain_async(store, transport, member=member, rounds=rounds))


def run_sync(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coroutine`` to completion from synchronous code, even under a running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    result: list[_T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coroutine))
        except BaseException as exc:  # handed to the caller's thread below
            failure.append(exc)

    thread = threading.Thread(target=target, name="relayer-testing")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
