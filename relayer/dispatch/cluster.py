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
from relayer.observability.throttle import ThrottledLog

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
    order: Sequence[int]  # queue indices, most preferred first (the planner's order, lazy)
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

    The gates of the entries a pass can grant are asked concurrently, so a pass costs one round
    trip of latency (one more for each round of refusals). Queues without a route use
    ``default``, or have no pause and no limit when it is None.
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
        """Ask the gates of the queues the first ``budget`` entries of the order name,
        together; if some refused, the gates of the next entries, as many as slots are left,
        and so on. Each entry is asked of its gate once, in order, so the grants are the ones
        asking every gate for the whole order would give, but a worker serving hundreds of
        stores pays a statement for the few stores a pass can serve, not for each store with
        due work (and reads no further into the order than needed). Queues whose gate was not
        asked are reported as their gate last answered."""
        order = request.order
        budget = request.budget
        groups: dict[int, tuple[ClusterState | None, list[int]]] = {}
        group_of: list[int] = []
        for index, queue in enumerate(request.queues):
            gate = self.gate_for(queue)
            groups.setdefault(id(gate), (gate, []))[1].append(index)
            group_of.append(id(gate))
        opened = QueueGate(GateState.OPEN)
        gates: list[QueueGate] = [self._last.get(queue, opened) for queue in request.queues]
        grants: list[Grant] = []
        cursor = 0
        while len(grants) < budget:
            need = budget - len(grants)
            chunk = order[cursor : cursor + need]
            if not chunk:
                break
            asked: dict[int, list[int]] = {}  # group -> the positions asked of its gate
            for offset, index in enumerate(chunk):
                asked.setdefault(group_of[index], []).append(cursor + offset)
            cursor += len(chunk)
            asking = [
                self._ask(*groups[group], positions, request) for group, positions in asked.items()
            ]
            # One gate (the usual case: one store) is awaited directly; gather would wrap
            # it in a task and a future, two more turns of the event loop for each claim.
            parts = [await asking[0]] if len(asking) == 1 else await asyncio.gather(*asking)
            for part_grants, part_gates in parts:
                grants.extend(part_grants)
                for index, gate_state in part_gates.items():
                    gates[index] = gate_state
                    self._last[request.queues[index]] = gate_state
        grants.sort(key=lambda grant: grant.position)
        return ClaimResult(tuple(grants), tuple(gates))

    def release(self, slot: Slot) -> None:
        gate = self.gate_for(slot.queue)
        if gate is not None:
            gate.release(slot)

    async def _ask(
        self,
        gate: ClusterState | None,
        members: Sequence[int],
        positions: Sequence[int],
        request: ClaimRequest,
    ) -> tuple[list[Grant], dict[int, QueueGate]]:
        """Ask ``gate`` (the gate of the queues ``members``) for the entries of the order at
        ``positions``, each of which names one of its queues."""
        local = {index: number for number, index in enumerate(members)}
        order = request.order
        sub = ClaimRequest(
            tuple(request.queues[index] for index in members),
            tuple(local[order[position]] for position in positions),
            len(positions),
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
