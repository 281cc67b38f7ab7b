"""Worker groups: a pool of slots that claims due jobs from its queues with a policy.

Each pass claims only into free slots (a full pool claims nothing: backpressure), asks the
cluster gate once for every queue of the pass (one database round trip with a
PostgresClusterState), issues one claim per queue with a positive allocation and starts one
task per job. Between passes the group sleeps until a slot frees, a source reports earlier
work, the earliest due time comes, or, while a due queue was refused (paused, at its limit,
unreachable), ``recheck_interval`` has passed.

``reconfigure`` changes the policy and the sources between two passes (queues join and leave a
running group): a queue that stays keeps its served count and its Weighted credit, and the jobs
still running for a queue that left keep their slots until they finish (``finished`` waits for
them). A fixed set of queues is dispatched exactly as if the group had never been reconfigured.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, Generic

from relayer.dispatch.clock import Clock, MonotonicClock
from relayer.dispatch.cluster import (
    ClaimRequest,
    ClaimResult,
    ClusterState,
    GateState,
    QueueGate,
    Slot,
    grant_locally,
)
from relayer.dispatch.planner import Planner
from relayer.dispatch.policies import (
    DEFAULT_POOL_SIZE,
    InvalidDispatchError,
    Policy,
    check_pool_size,
    configured_shares,
    validate,
)
from relayer.dispatch.queue import Job, JobSource, KeyT
from relayer.dispatch.telemetry import PassReport, QueueTelemetry, snapshot
from relayer.errors import DispatchError, UsageError
from relayer.observability.throttle import ThrottledLog

logger = logging.getLogger(__name__)

# A handler may return what its job cost (an int: rows sent, bytes...): Weighted then shares
# cost among the queues, not jobs (Planner.settle). None: the job cost what it was charged.
Handler = Callable[[Job[KeyT]], Awaitable[int | None]]
_REFUSED = (GateState.PAUSED, GateState.UNAVAILABLE)


class WorkerGroup(Generic[KeyT]):
    """Runs ``handler`` for due jobs of ``sources``, at most ``pool_size`` at a time.

    The policy and pool size are validated when the group starts (``run`` or ``validate``).
    A handler's exception is logged and never stops the group. ``stop()`` ends the claiming;
    ``run`` then returns once the running handlers have finished. A group whose policy is None
    (with no sources) serves no queue until ``reconfigure`` gives it some.
    """

    def __init__(
        self,
        policy: Policy | None,
        sources: Iterable[JobSource[KeyT]],
        handler: Handler[KeyT],
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        cluster_state: ClusterState | None = None,
        clock: Clock | None = None,
        name: str = "workers",
        recheck_interval: float = 1.0,
    ) -> None:
        self.policy = policy
        self.pool_size = pool_size
        self.name = name
        self.recheck_interval = recheck_interval
        self._given_sources = tuple(sources)
        self._handler = handler
        self._cluster = cluster_state
        self._clock: Clock = clock or MonotonicClock()
        # Built by validate(): a policy that is not valid yet (Weighted([("a", "3")])) must
        # fail there with InvalidDispatchError, not here with whatever the planner trips on.
        self._planner: Planner | None = None
        self._sources: tuple[JobSource[KeyT], ...] = ()
        self._queues: tuple[str, ...] = ()
        self._served: list[int] = []
        self._running: list[int] = []
        self._gates: list[GateState | None] = []
        # Jobs running per source (by id; a running job keeps its source alive), whether the
        # source is still one of the group's or left it in a reconfigure.
        self._jobs_of: dict[int, int] = {}
        self._index: dict[int, int] = {}  # id(source) -> its index among the current sources
        self._pending: tuple[Policy | None, tuple[JobSource[KeyT], ...]] | None = None
        self._pending_waiters: list[asyncio.Future[None]] = []
        self._drain_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._active = False
        self._passes = 0
        self._last: PassReport | None = None
        self._pass_waiters: list[asyncio.Future[PassReport]] = []
        self._spawn: Callable[[Coroutine[Any, Any, None]], object] | None = None
        self._log = ThrottledLog(logger)

    def __repr__(self) -> str:
        return f"WorkerGroup({self.name!r}, {self.policy!r}, pool_size={self.pool_size})"

    # -- public surface --------------------------------------------------------------------

    def validate(self) -> None:
        """Check the policy, the pool size and that each queue has exactly one source."""
        queues, sources = self._checked(self.policy, self._given_sources)
        self._queues = queues
        self._sources = sources
        self._index = {id(source): index for index, source in enumerate(sources)}
        if self._planner is None and self.policy is not None:
            self._planner = Planner(self.policy)
        if len(self._served) != len(queues):
            self._served = [0] * len(queues)
            self._running = [0] * len(queues)
            self._gates = [None] * len(queues)

    def _checked(
        self, policy: Policy | None, given: Sequence[JobSource[KeyT]]
    ) -> tuple[tuple[str, ...], tuple[JobSource[KeyT], ...]]:
        """The queues of ``policy`` and their sources in that order, once each is checked."""
        if policy is None:
            check_pool_size(self.pool_size)
            queues: tuple[str, ...] = ()
        else:
            queues = validate(policy, self.pool_size)
        if not isinstance(self.recheck_interval, int | float) or self.recheck_interval <= 0:
            raise InvalidDispatchError(
                f"A worker group's recheck_interval must be > 0 seconds, got "
                f"{self.recheck_interval!r}."
            )
        by_name: dict[str, JobSource[KeyT]] = {}
        for source in given:
            if source.name in by_name:
                raise InvalidDispatchError(
                    f"Worker group {self.name!r} has two sources named {source.name!r}; "
                    "give each queue one source."
                )
            by_name[source.name] = source
        missing = [queue for queue in queues if queue not in by_name]
        named = set(queues)  # a worker's fleet has hundreds of queues: no scan of a tuple each
        extra = [name for name in by_name if name not in named]
        if missing or extra:
            raise InvalidDispatchError(
                f"Worker group {self.name!r}: the policy serves queues {list(queues)} but the "
                f"sources are {list(by_name)}; give exactly one source per queue of the policy."
            )
        return queues, tuple(by_name[queue] for queue in queues)

    async def reconfigure(self, policy: Policy | None, sources: Iterable[JobSource[KeyT]]) -> None:
        """Serve ``sources`` with ``policy`` from the next pass on (None and no sources: serve
        nothing); returns once that is in force. Checked at once like ``validate``
        (InvalidDispatchError). A queue whose source stays keeps its served count and credit;
        the running jobs of a source that leaves keep their slots until they end (``finished``
        waits for them), and the source is told of each as usual."""
        given = tuple(sources)
        self._checked(policy, given)
        if not self._active:
            self._apply(policy, given)
            return
        self._pending = (policy, given)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending_waiters.append(future)
        self._wake.set()
        await future

    async def finished(self, source: JobSource[KeyT]) -> None:
        """Return once no job claimed from ``source`` is running (at once if none is)."""
        if not self._jobs_of.get(id(source)):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.setdefault(id(source), []).append(future)
        await future

    def _apply_pending(self) -> None:
        if self._pending is None:
            return
        (policy, given), self._pending = self._pending, None
        self._apply(policy, given)
        waiters, self._pending_waiters = self._pending_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _apply(self, policy: Policy | None, given: tuple[JobSource[KeyT], ...]) -> None:
        queues, sources = self._checked(policy, given)
        kept = {id(source) for source in sources}
        served: list[int] = []
        gates: list[GateState | None] = []
        for queue, source in zip(queues, sources, strict=True):
            index = self._index.get(id(source))
            if index is not None and self._queues[index] == queue:
                served.append(self._served[index])
                gates.append(self._gates[index])
            else:
                served.append(0)
                gates.append(None)
        if self._active:  # listening: the sources that leave stop waking it, new ones start
            for source in self._sources:
                if id(source) not in kept:
                    source.unlisten(self.wake)
            for source in sources:
                if id(source) not in self._index:
                    source.listen(self.wake)
        self.policy = policy
        self._given_sources = given
        self._queues = queues
        self._sources = sources
        self._index = {id(source): index for index, source in enumerate(sources)}
        self._served = served
        self._running = [self._jobs_of.get(id(source), 0) for source in sources]
        self._gates = gates
        if policy is None:
            self._planner = None
        elif self._planner is None:
            self._planner = Planner(policy)
        else:
            self._planner = self._planner.carried_to(policy)

    @property
    def clock(self) -> Clock:
        """The clock due times are read against."""
        return self._clock

    @property
    def running(self) -> int:
        """Jobs running now, those of queues that left in a reconfigure included."""
        return sum(self._jobs_of.values())

    @property
    def free(self) -> int:
        return self.pool_size - self.running

    @property
    def last_pass(self) -> PassReport | None:
        return self._last

    def telemetry(self) -> tuple[QueueTelemetry, ...]:
        """Per queue: jobs served, share of service against the configured share, oldest age."""
        if not self._sources:
            self.validate()
        return snapshot(
            queues=self._queues,
            served=self._served,
            configured=configured_shares(self.policy) if self.policy is not None else (),
            next_due=[source.next_due() for source in self._sources],
            running=self._running,
            gates=self._gates,
            now=self._clock.now(),
        )

    def next_pass(self) -> asyncio.Future[PassReport]:
        """A future resolved with the report of the next pass that completes."""
        future: asyncio.Future[PassReport] = asyncio.get_running_loop().create_future()
        self._pass_waiters.append(future)
        return future

    def wake(self) -> None:
        """Run a pass now (sources call this through ``listen``; so does a finishing job)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop claiming; ``run`` returns when the running handlers have finished."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        if self._active:
            raise UsageError(f"worker group {self.name!r} is already running")
        self.validate()
        self._active = True
        # A stop() that came before run() started stands: run returns at once.
        for source in self._sources:
            source.listen(self.wake)
        try:
            async with asyncio.TaskGroup() as tasks:
                self._spawn = tasks.create_task
                while not self._stopping:
                    self._wake.clear()
                    self._apply_pending()
                    deadline = await self._pass()
                    if not self._stopping:
                        await self._clock.wait(self._wake, deadline)
        finally:
            self._spawn = None
            self._apply_pending()
            self._active = False
            self._stopping = False  # the group can run again
            for source in self._sources:
                source.unlisten(self.wake)

    # -- one pass --------------------------------------------------------------------------

    async def _pass(self) -> float | None:
        free = self.free
        claimed = [0] * len(self._sources)
        gates: list[GateState | None] = [None] * len(self._sources)
        planner = self._planner
        if free > 0 and planner is not None:  # None: the group serves no queue
            now = self._clock.now()
            cap = None if planner.exact_counts else free
            due = [source.due_count(now, cap) for source in self._sources]
            if any(due):
                overflow = self._cluster is not None
                plan = planner.plan(free, due, overflow=overflow, running=self._running)
                result = await self._ask_gate(ClaimRequest(self._queues, plan.order, free))
                claimed = self._start(result, [min(count, free) for count in due])
                gates = [gate.state for gate in result.gates]
                self._gates = list(gates)
        return self._finish_pass(free, claimed, gates)

    async def _ask_gate(self, request: ClaimRequest) -> ClaimResult:
        if self._cluster is None:
            return grant_locally(request)
        try:
            return await self._cluster.acquire(request)
        except DispatchError as exc:
            self._log.warning(
                ("cluster_state_unavailable",),
                "dispatch: group %r cannot ask the cluster state, retrying in %ss: %s",
                self.name,
                self.recheck_interval,
                exc,
                extra={"action": "cluster_state_unavailable"},
            )
            down = QueueGate(GateState.UNAVAILABLE)
            return ClaimResult((), tuple(down for _ in request.queues))

    def _start(self, result: ClaimResult, demand: list[int]) -> list[int]:
        """Issue one claim per queue with grants; start the jobs; charge what was issued."""
        slots: list[list[Slot]] = [[] for _ in self._sources]
        for grant in result.grants:
            slots[grant.queue_index].append(grant.slot)
        now = self._clock.now()
        claimed = [0] * len(self._sources)
        for index, queue_slots in enumerate(slots):
            if not queue_slots:
                continue
            jobs = self._sources[index].claim(now, len(queue_slots))
            claimed[index] = len(jobs)
            for job, slot in zip(jobs, queue_slots, strict=False):
                self._launch(index, job, slot)
            for unused in queue_slots[len(jobs) :]:
                self._release(unused)  # another group took the job while we asked the gate
        issued: list[int] = []
        counted = [0] * len(self._sources)
        for grant in result.grants:
            if counted[grant.queue_index] < claimed[grant.queue_index]:
                counted[grant.queue_index] += 1
                issued.append(grant.queue_index)
        # What each queue could have taken: a refused queue nothing, a queue at its limit what
        # it got (so a capped queue does not bank credit it cannot use). A queue whose claim
        # came back short keeps its due count: it was not reached, and it is not charged.
        for index, gate in enumerate(result.gates):
            if gate.state in _REFUSED:
                demand[index] = 0
            elif gate.state is GateState.FULL:
                demand[index] = claimed[index]
        assert self._planner is not None  # run() validated the group
        self._planner.charge(issued, demand)
        return claimed

    def _launch(self, index: int, job: Job[KeyT], slot: Slot) -> None:
        assert self._spawn is not None
        source = self._sources[index]
        self._running[index] += 1
        self._served[index] += 1
        self._jobs_of[id(source)] = self._jobs_of.get(id(source), 0) + 1
        charged = self._planner.cost(index) if self._planner is not None else 1
        self._spawn(self._execute(source, job, slot, charged))

    async def _execute(
        self, source: JobSource[KeyT], job: Job[KeyT], slot: Slot, charged: int
    ) -> None:
        cost: int | None = None
        try:
            cost = await self._handler(job)
        except Exception:
            logger.exception(
                "dispatch: group %r: the handler failed for job %r of queue %r",
                self.name,
                job.key,
                job.queue,
                extra={"action": "job_failed", "queue": job.queue, "key": str(job.key)},
            )
        finally:
            index = self._index.get(id(source))  # None: the queue left the group meanwhile
            if index is not None:
                self._running[index] -= 1
                if isinstance(cost, int) and self._planner is not None:
                    self._planner.settle(index, cost, charged)
            left = self._jobs_of[id(source)] - 1
            if left:
                self._jobs_of[id(source)] = left
            else:
                del self._jobs_of[id(source)]
            source.finish(job)
            self._release(slot)
            self._wake.set()
            if not left:
                for waiter in self._drain_waiters.pop(id(source), ()):
                    if not waiter.done():
                        waiter.set_result(None)

    def _release(self, slot: Slot) -> None:
        if self._cluster is not None:
            self._cluster.release(slot)

    def _finish_pass(
        self, free: int, claimed: Sequence[int], gates: Sequence[GateState | None]
    ) -> float | None:
        self._passes += 1
        report = PassReport(self._passes, free, tuple(claimed), tuple(gates))
        self._last = report
        waiters, self._pass_waiters = self._pass_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(report)
        if report.total and logger.isEnabledFor(logging.DEBUG):
            # Asked first: the arguments (two dicts) would be built on every pass.
            logger.debug(
                "dispatch: group %r pass %d started %s",
                self.name,
                report.number,
                dict(zip(self._queues, claimed, strict=True)),
                extra={"action": "dispatch_pass"},
            )
        if self.free <= 0:
            return None  # only a finishing job can make room
        now = self._clock.now()
        deadline: float | None = None
        for source in self._sources:
            due = source.next_due()
            if due is None:
                continue
            # Work that is due but was not claimed waits on the gate: look again later.
            wake_at = due if due > now else now + self.recheck_interval
            deadline = wake_at if deadline is None else min(deadline, wake_at)
        return deadline
