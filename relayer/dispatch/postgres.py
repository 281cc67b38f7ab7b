"""Cluster-wide pause state and concurrency limits, kept by PostgreSQL.

One long-lived *dispatcher* connection per process and store holds a session advisory lock
``(queue key, n)`` for every running job of a limited queue, with ``n`` in ``0 .. limit-1``.
PostgreSQL never grants one of those locks twice, so at most ``limit`` jobs of the queue run
across the cluster at any moment; a lock disappears when its job finishes (unlock) or when
the holder's connection dies (process killed, host gone), with no sweep and no stale count.

A pass is one statement: it reads the pause flags and limits of every queue of the pass and
calls the store's PL/pgSQL claim function (migration 0005), which unlocks finished slots
and walks the planner's order taking slots until the budget is spent. Queues without a limit
take no lock. Every lock the function takes comes back as a row, so none is taken and then
lost; if a call fails half-way, the connection's own locks are compared with the ones it should
hold and any stray lock is released (or the connection is closed, which releases everything).

A limit applies to claims made while it is set: lowering it never stops running jobs, and
jobs of a queue claimed while it had no limit hold no slot and are not counted.

Behind a transaction pooler (``pooler = "transaction"``) a session lock would stay on a server
connection that other clients get next. There the dispatcher keeps a transaction open for as
long as it holds a slot, so its server connection stays its own (the slot locks are session
locks all the same, taken and released one by one inside it); each claim runs under a
savepoint, so a failed one leaves the transaction usable for the stray-lock check; and once no
slot is held it releases every lock and commits, handing the server connection back. A process
that dies mid-transaction makes the pooler close that server connection, which frees the slots.

A worker's stores of one database share one dispatcher connection
(relayer.dispatch.dispatcher.DispatcherConnection): each store's state keeps its own slots, the
connection, its lock and its transaction are shared.

The statements are the gateway's (relayer.store.dispatch); this module keeps the slots'
bookkeeping and decides what a failed statement means.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from relayer.dispatch.cluster import (
    ClaimRequest,
    ClaimResult,
    GateState,
    Grant,
    QueueGate,
    Slot,
)
from relayer.dispatch.control import (
    CLAIM_SCHEMA_VERSION,
    queue_lock_key,
    require_dispatch_schema,
)
from relayer.dispatch.dispatcher import Connector, DispatcherConnection
from relayer.errors import DispatchError, RelayerError
from relayer.observability.throttle import ThrottledLog, shape
from relayer.settings import StoreSettings
from relayer.store.dispatch import (
    ClaimRow,
    SlotStatementError,
    SlotStatements,
    backend_pid,
    in_transaction,
    usable,
)
from relayer.store.driver import Connection, connect, hang_up

logger = logging.getLogger(__name__)


class PostgresClusterState:
    """The cluster gate of one store's queues, through one dispatcher connection.

    Use ``async with PostgresClusterState(store) as state`` (or ``open``/``close``). Several
    worker groups of a process may share one; the states of several stores of one database
    may share a ``dispatcher`` connection (by default each has its own). If the connection is
    lost, the slots it held are gone (other processes may take them); ``acquire`` raises
    DispatchError and reconnects on the next call.
    """

    def __init__(
        self,
        store: StoreSettings,
        *,
        connector: Connector | None = None,
        dispatcher: DispatcherConnection | None = None,
    ) -> None:
        self.store = store
        self._names = store.names
        if dispatcher is None:
            dispatcher = DispatcherConnection(
                connector or (lambda: connect(store, purpose=f"dispatcher:{store.name}")),
                pinned=store.pooler == "transaction",
            )
        self._shared = dispatcher
        # Behind a transaction pooler: hold slots only inside an open transaction (see above).
        self._pinned = dispatcher.pinned
        self._statements = SlotStatements(store.names, pinned=self._pinned)
        self._checked = -1  # the connection generation this store's schema was checked on
        self._keys: dict[str, int] = {}
        self._held: set[tuple[int, int]] = set()
        self._pending: list[tuple[int, int]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        # While the database is down every pass reconnects: one line per cause.
        self._log = ThrottledLog(logger)

    def __repr__(self) -> str:
        return f"PostgresClusterState(store={self.store.name!r}, held={len(self._held)})"

    async def __aenter__(self) -> PostgresClusterState:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def _lock(self) -> asyncio.Lock:
        return self._shared.lock

    @property
    def _epoch(self) -> int:
        return self._shared.epoch

    @property
    def held(self) -> int:
        """Slots this process holds for running jobs."""
        return len(self._held)

    @property
    def backend_pid(self) -> int | None:
        """The server process of the dispatcher connection (its locks show under this pid);
        None behind a transaction pooler, which reports a number of its own."""
        conn = self._shared.conn
        if conn is None or self._pinned:
            return None
        return backend_pid(conn)

    def holds_slots(self) -> bool:
        return bool(self._held or self._pending)

    def lost_connection(self) -> None:
        """The shared connection is gone, and this store's slots with it."""
        if self._held:
            self._log.warning(
                ("slots_lost",),
                "dispatch: store %r lost its dispatcher connection while holding %d slot(s); "
                "their jobs keep running but other processes may take the slots",
                self.store.name,
                len(self._held),
                extra={"action": "slots_lost", "store": self.store.name},
            )
        self._held.clear()
        self._pending.clear()

    async def open(self, *, schema_checked: bool = False) -> None:
        """Connect and check the schema (errors propagate). ``schema_checked``: the caller
        has just found the store's schema at this relayer's version (a worker's store joining
        checks it before), so the dispatcher connection is not asked again."""
        await self._shared.attach(self)
        try:
            async with self._lock:
                await self._connection(checked=schema_checked)
        except BaseException:
            await self._detach()
            raise

    async def close(self) -> None:
        """Unlock this store's slots; the last store of the connection closes it (call when
        the groups have stopped)."""
        async with self._lock:
            conn = self._shared.open()
            if conn is not None and self._shared.gates != [self]:
                # Others keep using the connection: unlock only this store's slots.
                pairs, self._pending = sorted(self._held) + self._pending, []
                self._held.clear()
                if pairs:
                    try:
                        await self._statements.unlock(conn, pairs)
                        await self._unpin_when_idle(conn)
                    except SlotStatementError as exc:
                        await self._recover(conn, exc)
            self._held.clear()
            self._pending.clear()
        await self._detach()

    async def _detach(self) -> None:
        if not self._shared.detach(self):
            return
        async with self._lock:
            conn = self._shared.open()
            if conn is not None:
                # The server ends a closed connection's backend a moment later; unlocking first
                # frees the slots before close() returns.
                with contextlib.suppress(SlotStatementError):
                    await self._statements.release_all(conn)
            await self._shared.close()
        self._shared.closed()

    def lock_key(self, queue: str) -> int:
        key = self._keys.get(queue)
        if key is None:
            key = self._keys[queue] = queue_lock_key(self._names, queue)
        return key

    async def acquire(self, request: ClaimRequest) -> ClaimResult:
        task = asyncio.ensure_future(self._acquire(request))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # The call goes on without us; whatever it grants must not stay held.
            self._keep(task).add_done_callback(self._give_back)
            raise

    def release(self, slot: Slot) -> None:
        if slot.number is None or slot.epoch != self._epoch:
            return  # no lock, or one that died with an earlier connection
        pair = (self.lock_key(slot.queue), slot.number)
        if pair not in self._held:
            return
        self._held.discard(pair)
        self._pending.append(pair)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # released by the next acquire, or by closing the connection
        self._keep(loop.create_task(self.flush()))

    async def flush(self) -> None:
        """Unlock the released slots now (``release`` schedules this by itself)."""
        async with self._lock:
            if not self._pending:
                return
            pairs, self._pending = self._pending, []
            conn = self._shared.open()
            if conn is None:
                return  # the locks died with the connection
            try:
                await self._statements.unlock(conn, pairs)
                await self._unpin_when_idle(conn)
            except SlotStatementError as exc:
                await self._recover(conn, exc)

    # -- internals -------------------------------------------------------------------------

    async def _acquire(self, request: ClaimRequest) -> ClaimResult:
        keys = [self.lock_key(queue) for queue in request.queues]
        async with self._lock:
            try:
                conn = await self._connection()
            except RelayerError as exc:
                raise DispatchError(f"store {self.store.name!r}: {exc}") from exc
            releases, self._pending = self._pending, []
            held = sorted(self._held)
            wanted = [index + 1 for index in request.order]
            try:
                rows = await self._statements.claim(
                    conn,
                    request.queues,
                    keys,
                    wanted=wanted,
                    budget=request.budget,
                    held=held,
                    releases=releases,
                )
            except SlotStatementError as exc:
                await self._recover(conn, exc)
                raise DispatchError(
                    f"store {self.store.name!r}: claiming queue slots failed: {exc}"
                ) from exc
            result = self._result(request, keys, rows)
            if self._pinned and self._shared.idle():
                self._keep(asyncio.ensure_future(self._end_idle_transaction(conn)))
            return result

    async def _end_idle_transaction(self, conn: Connection) -> None:
        """After a claim that left no slot held: hand the server connection back (off the
        claim's path; the next claim waits for it, or continues the transaction first)."""
        async with self._lock:
            if conn is not self._shared.open():
                return
            try:
                await self._unpin_when_idle(conn)
            except SlotStatementError as exc:
                await self._recover(conn, exc)

    async def _unpin_when_idle(self, conn: Connection) -> None:
        if self._pinned and self._shared.idle():
            await self._statements.unpin(conn)

    def _result(self, request: ClaimRequest, keys: list[int], rows: list[ClaimRow]) -> ClaimResult:
        grants: list[Grant] = []
        gates = [QueueGate(GateState.OPEN)] * len(request.queues)
        for position, index, slot_number, state, limit in rows:
            if state == "granted":
                if slot_number is not None:
                    self._held.add((keys[index], slot_number))
                slot = Slot(request.queues[index], slot_number, self._epoch)
                grants.append(Grant(position, index, slot))
            else:
                gates[index] = QueueGate(GateState(state), limit)
        return ClaimResult(tuple(grants), tuple(gates))

    async def _connection(self, *, checked: bool = False) -> Connection:
        """The shared connection (call under the lock), this store's schema checked on it
        (``checked``: already checked by the caller)."""
        conn = self._shared.open()
        if conn is None:
            conn = await self._shared.connect()
        if self._checked != self._epoch:
            if not checked:
                await self._check_schema(conn)
            self._checked = self._epoch
        return conn

    async def _check_schema(self, conn: Connection) -> None:
        """Refuse a store whose schema lacks the claim function. Inside a pinned transaction
        (other stores hold slots) under a savepoint, so a failed check leaves it usable."""
        if not in_transaction(conn):
            try:
                await require_dispatch_schema(conn, self.store, CLAIM_SCHEMA_VERSION)
            except BaseException:
                if len(self._shared.gates) <= 1:
                    await self._shared.close()  # nobody else on it: as before, start afresh
                raise
            return
        async with self._statements.savepoint(conn):
            await require_dispatch_schema(conn, self.store, CLAIM_SCHEMA_VERSION)

    def _forget_connection(self) -> None:
        self._shared.forget()

    async def _recover(self, conn: Connection, exc: SlotStatementError) -> None:
        """After a failed call: release stray locks, or drop the connection (which does; behind
        a transaction pooler, leaving mid-transaction makes it close the server connection)."""
        if usable(conn):
            try:
                locks = await self._statements.own_slot_locks(conn, list(self._keys.values()))
                held = self._held.union(*(gate._held for gate in self._others()))
                stray = [pair for pair in locks if pair not in held]
                if stray:
                    await self._statements.unlock(conn, stray)
                await self._unpin_when_idle(conn)
                return
            except SlotStatementError:
                pass
        self._log.warning(
            ("dispatcher_reconnect", shape(str(exc))),
            "dispatch: store %r: dispatcher connection failed (%s); reconnecting",
            self.store.name,
            exc,
            extra={"action": "dispatcher_reconnect", "store": self.store.name},
        )
        await hang_up(conn)  # its locks are gone once its server process is
        self._forget_connection()

    def _others(self) -> list[PostgresClusterState]:
        """The other stores' states on the shared connection (a lock key may, rarely, be
        shared between stores: never unlock a slot one of them holds)."""
        return [
            gate
            for gate in self._shared.gates
            if gate is not self and isinstance(gate, PostgresClusterState)
        ]

    def _keep(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _give_back(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        result: ClaimResult = task.result()
        for grant in result.grants:
            self.release(grant.slot)
