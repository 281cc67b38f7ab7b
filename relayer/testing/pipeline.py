"""Publishing messages through a transport exactly as the relay does, without a store.

``relay_messages`` hands messages to a started transport through the relay's own send pipelines:
ordered messages (with a key) through the lane batch's ``BatchSender`` (per-key order, a key
stops at its first failure, pipelined within a key only where the transport is gapless), and
messages without a key through the ``UnorderedSender`` (all at once). It answers what became
of each message, as the relay would record it. relayer's transport contract suite drives every
transport with it, and the authors of a plug-in transport can do the same against their broker.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from relayer.relay.pipeline import ACKED, FAILED, IN_FLIGHT, BatchSender, SendReport
from relayer.relay.unordered import UnorderedReport, UnorderedSender
from relayer.settings import StoreSettings, store_settings
from relayer.store import LaneRows
from relayer.transports.base import OutboundBatch, OutgoingMessage, Transport
from relayer.transports.routing import Routing

Outcome = Literal["acked", "failed", "unavailable", "unsent", "unacknowledged"]


@dataclass(frozen=True, slots=True)
class Sent:
    """What became of one message: ``acked``; ``failed`` (the row's fault: ``error`` is what
    the relay records, ``permanent`` when only an operator's change can fix it); ``unavailable``
    (its broker could not be used: no attempt counted); ``unsent`` (an earlier message of its
    key failed, so it was not handed over); ``unacknowledged`` (handed over, no answer before
    the deadline)."""

    outcome: Outcome
    error: str = ""
    permanent: bool = False


async def relay_messages(
    transport: Transport, messages: Sequence[OutgoingMessage], *, deadline: float = 30.0
) -> list[Sent]:
    """Publish ``messages`` (in id order) through ``transport`` (started) as the relay does;
    the outcome of each, in order. Admission and acknowledgements end at ``deadline``
    seconds."""
    store = store_settings(
        name="pipeline", transports={transport.name: {"type": "memory"}},
        default_transport=transport.name,
    )  # fmt: skip
    routing = Routing(store, {transport.name: transport})
    outcomes: list[Sent | None] = [None] * len(messages)
    ordered = [index for index, message in enumerate(messages) if message.key is not None]
    unordered = [index for index, message in enumerate(messages) if message.key is None]
    until = time.monotonic() + deadline
    if ordered:
        rows = _lane_rows([messages[index] for index in ordered])
        sender = BatchSender(rows, range(len(rows)), routing, admit_until=until, wait_until=until)
        report = await sender.run()
        for position, index in enumerate(ordered):
            outcomes[index] = _ordered(report, position)
    if unordered:
        sent = await _unordered(store, routing, [messages[index] for index in unordered], until)
        for position, index in enumerate(unordered):
            outcomes[index] = sent[position]
    return [outcome for outcome in outcomes if outcome is not None]


def _lane_rows(messages: Sequence[OutgoingMessage]) -> LaneRows:
    """The rows of one lane batch carrying ``messages``."""
    batch = OutboundBatch(
        [str(message.id) for message in messages],
        [message.key or "" for message in messages],
        [message.destination for message in messages],
        [message.body for message in messages],
        [dict(message.headers) or None for message in messages],
    )
    count = len(messages)
    return LaneRows([0] * count, batch, [None] * count, [False] * count)


def _ordered(report: SendReport, index: int) -> Sent:
    state = report.states[index]
    if state == ACKED:
        return Sent("acked")
    if state == FAILED:
        error, permanent = report.failures[index]
        return Sent("failed", error, permanent)
    if state == IN_FLIGHT:
        return Sent("unacknowledged")
    if index in report.down:
        return Sent("unavailable", report.down[index])
    return Sent("unsent")


async def _unordered(
    store: StoreSettings, routing: Routing, messages: Sequence[OutgoingMessage], until: float
) -> list[Sent]:
    report: UnorderedReport = await UnorderedSender(store, routing).publish(
        [(message, None) for message in messages], until
    )
    acked = set(report.acked)
    failures = {failure.id: failure for failure in report.failures}
    sent: list[Sent] = []
    for message in messages:
        failure = failures.get(message.id)
        if message.id in acked:
            sent.append(Sent("acked"))
        elif failure is not None:
            sent.append(Sent("failed", failure.error, failure.permanent))
        elif report.unavailable:
            sent.append(Sent("unavailable", report.unavailable))
        else:
            sent.append(Sent("unacknowledged"))
    return sent
