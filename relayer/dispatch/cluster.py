"""The cluster gate: pause state and concurrency limits shared by every process.

A worker group asks its gate once per pass: "here are my queues, my preference order and how
many slots I have free". The gate answers with the grants, in order, and each queue's state.
:class:`~relayer.dispatch.postgres.PostgresClusterState` answers from a store's tables in one
database round trip; :class:`RoutedClusterState` sends each queue to the gate of its own store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from relayer.errors import DispatchError
from relayer.throttle import ThrottledLog

logger = logging.getLogger(__name__)


class GateState(StrEnum):
    OPEN = "open"  # not paused; had free slots for every entry it was asked for
    PAUSED = "paused"  # the queue, or every queue, is paused
    FULL = "full"  # at its concurrency limit: some entries were refused
    UNAVAILABLE = "unavailable"  # the gate could not be asked (database unreachable)


@dataclass(frozen=True, slots=True)
class Slot:
    """The right to run one job of ``queue``; ``number`` None when the queue has no limit."""

    queue: str
    number: int | None = None
    epoch: int = 0  # the gate's connection generation that holds it


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    queues: tuple[str, ...]
    order: tuple[int, ...]  # queue indices, most preferred first (the planner's order)
    budget: int  # grant at most this many


@dataclass(frozen=True, slots=True)
class Grant:
    position: int  # index into the request's order
    queue_index: int
    slot: Slot


@dataclass(frozen=True, slots=True)
class QueueGate:
    state: GateState
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class ClaimResult:
    grants: tuple[Grant, ...]  # in order of position
    gates: tuple[QueueGate, ...]  # per queue of the request


class ClusterState(Protocol):
    async def acquire(self, request: ClaimRequest) -> ClaimResult:
        """Grant up to ``request.budget`` entries of the order, skipping refused queues."""
        ...

    def release(self, slot: Slot) -> None:
        """Give a slot back as soon as possible; never blocks and never raises."""
        ...


def grant_locally(request: ClaimRequest) -> ClaimResult:
    """The answer of a gate with no pause and no limits: the first ``budget`` entries."""
    grants = tuple(
        Grant(position, index, Slot(request.queues[index]))
        for position, index in enumerate(request.order[: request.budget])
    )
    return ClaimResult(grants, tuple(QueueGate(GateState.OPEN) for _ in request.queues))


class RoutedClusterState:
    """Sends each queue to the gate of its own store (queues of different databases).

    Each gate is asked concurrently with the full budget, so a pass still costs one round trip
    of latency; grants past the budget (possible only when several gates grant) are returned at
    once. Queues without a route use ``default``, or have no pause and no limit when it is None.
    """

    def __init__(
        self, routes: Mapping[str, ClusterState], default: ClusterState | None = None
    ) -> None:
        self._routes = dict(routes)
        self._default = default
        self._log = ThrottledLog(logger)
        # Each queue's gate state as its gate last answered (reported for the queues whose
        # gate a claim did not need to ask).
        self._last: dict[str, QueueGate] = {}

    def gate_for(self, queue: str) -> ClusterState | None:
        return self._routes.get(queue, self._default)

    def route(self, queues: Iterable[str], gate: ClusterState) -> None:
        """Send ``queues`` to ``gate`` from the next claim on (a store joins the worker)."""
        for queue in queues:
            self._routes[queue] = gate

    def unroute(self, queues: Iterable[str]) -> None:
        """Forget the routes of ``queues`` (a store left: its jobs and slots are done)."""
        for queue in queues:
            self._routes.pop(queue, None)
            self._last.pop(queue, None)

    async def acquire(self, request: ClaimRequest) -> ClaimResult:
        """Ask the gates of the queues the claim wants slots of, together; the other gates
        are not asked (a worker serving hundreds of stores would otherwise pay a round trip
        to each store's gate on every pass), their queues reported as they last answered."""
        wanted = set(request.order)
        groups: dict[int, tuple[ClusterState | None, list[int]]] = {}
        for index, queue in enumerate(request.queues):
            gate = self.gate_for(queue)
            groups.setdefault(id(gate), (gate, []))[1].append(index)
        parts = await asyncio.gather(
            *(
                self._ask(gate, members, request)
                for gate, members in groups.values()
                if not wanted.isdisjoint(members)
            )
        )
        opened = QueueGate(GateState.OPEN)
        gates: list[QueueGate] = [self._last.get(queue, opened) for queue in request.queues]
        grants: list[Grant] = []
        for part_grants, part_gates in parts:
            grants.extend(part_grants)
            for index, gate_state in part_gates.items():
                gates[index] = gate_state
                self._last[request.queues[index]] = gate_state
        grants.sort(key=lambda grant: grant.position)
        for extra in grants[request.budget :]:
            self.release(extra.slot)
        return ClaimResult(tuple(grants[: request.budget]), tuple(gates))

    def release(self, slot: Slot) -> None:
        gate = self.gate_for(slot.queue)
        if gate is not None:
            gate.release(slot)

    async def _ask(
        self, gate: ClusterState | None, members: Sequence[int], request: ClaimRequest
    ) -> tuple[list[Grant], dict[int, QueueGate]]:
        local = {index: position for position, index in enumerate(members)}
        positions = [p for p, index in enumerate(request.order) if index in local]
        sub = ClaimRequest(
            tuple(request.queues[index] for index in members),
            tuple(local[request.order[p]] for p in positions),
            request.budget,
        )
        if gate is None:
            result = grant_locally(sub)
        else:
            try:
                result = await gate.acquire(sub)
            except DispatchError as exc:
                self._log.warning(
                    ("cluster_state_unavailable", sub.queues),
                    "dispatch: cannot reach the cluster state of queues %s: %s",
                    ", ".join(sub.queues),
                    exc,
                    extra={"action": "cluster_state_unavailable", "queue": sub.queues[0]},
                )
                down = QueueGate(GateState.UNAVAILABLE)
                return [], {members[i]: down for i in range(len(members))}
        grants = [
            Grant(positions[grant.position], members[grant.queue_index], grant.slot)
            for grant in result.grants
        ]
        return grants, {members[i]: gate for i, gate in enumerate(result.gates)}


class MemoryClusterState:
    """Pause and concurrency limits within one process: the PostgreSQL gate without a database.

    It walks the order exactly as the database function does, so tests of worker groups can
    pause queues and cap them without PostgreSQL; it also serves single-process deployments.
    """

    def __init__(self) -> None:
        self._paused: set[str] = set()
        self._all_paused = False
        self._limits: dict[str, int] = {}
        self._in_use: dict[str, set[int]] = {}

    def pause(self, queue: str | None = None) -> None:
        if queue is None:
            self._all_paused = True
        else:
            self._paused.add(queue)

    def resume(self, queue: str | None = None) -> None:
        if queue is None:
            self._all_paused = False
        else:
            self._paused.discard(queue)

    def set_limit(self, queue: str, limit: int | None) -> None:
        if limit is None:
            self._limits.pop(queue, None)
        elif isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise DispatchError(f"a concurrency limit is an integer >= 1 or None, got {limit!r}")
        else:
            self._limits[queue] = limit

    def in_use(self, queue: str) -> int:
        return len(self._in_use.get(queue, ()))

    async def acquire(self, request: ClaimRequest) -> ClaimResult:
        paused = [self._all_paused or queue in self._paused for queue in request.queues]
        refused = list(paused)
        grants: list[Grant] = []
        for position, index in enumerate(request.order):
            if len(grants) >= request.budget:
                break
            if refused[index]:
                continue
            queue = request.queues[index]
            limit = self._limits.get(queue)
            number: int | None = None
            if limit is not None:
                taken = self._in_use.setdefault(queue, set())
                number = next((n for n in range(limit) if n not in taken), None)
                if number is None:
                    refused[index] = True
                    continue
                taken.add(number)
            grants.append(Grant(position, index, Slot(queue, number)))
        gates = tuple(
            QueueGate(
                GateState.PAUSED
                if paused[index]
                else GateState.FULL
                if refused[index]
                else GateState.OPEN,
                self._limits.get(queue),
            )
            for index, queue in enumerate(request.queues)
        )
        return ClaimResult(tuple(grants), gates)

    def release(self, slot: Slot) -> None:
        if slot.number is not None:
            self._in_use.get(slot.queue, set()).discard(slot.number)
