"""Membership: heartbeats on the database clock and the rank split of lanes.

Each worker instance keeps a ``member:<instance id>`` row alive every lease_duration / 3 on a
connection no batch uses (the housekeeping connection of the store's database in a worker,
where heartbeats go before waiting probes), so slow batches never delay it. Live members,
sorted, divide the lanes by rank (lane % members == rank), so shares differ by at most one
lane. A member only locks lanes of its share, and releases lanes outside it as soon as no
batch holds them; a new owner waits for a lease to expire or be released. If heartbeats fail
for a whole lease, the member stops sending until one succeeds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

from relayer.deadlines import Deadlines
from relayer.errors import DatabaseSilentError, StoreError
from relayer.observability.throttle import ThrottledLog
from relayer.settings import StoreSettings
from relayer.store import Connect, Connection, RelayStore, Session
from relayer.store.housekeeping import LEAST_SILENCE, Housekeeping, next_tick

logger = logging.getLogger(__name__)


def new_instance_id() -> str:
    """A unique, readable member id: host, process and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def share(rank: int, members: int, lanes: int) -> frozenset[int]:
    """The lanes of the member at ``rank`` among ``members`` live members."""
    if members <= 0 or not 0 <= rank < members:
        return frozenset()
    return frozenset(range(rank, lanes, members))


# How often a member beats during its first lease/3 (see Membership.run).
JOINING_BEAT = 1.0


class Membership:
    """Heartbeats one member of one store and tracks the lanes it may send."""

    def __init__(
        self,
        store: StoreSettings,
        member: str,
        connect: Connect | None = None,
        *,
        session: Session | None = None,
        batched: Housekeeping | None = None,
        on_change: Callable[[frozenset[int]], None] = lambda lanes: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.member = member
        self.db = RelayStore(store)
        # Not a batch connection, so slow batches never delay a heartbeat: ``session`` (a
        # worker's housekeeping connection, shared with probes, heartbeats going first), or
        # one of its own that ``connect`` opens (by default an autocommit connection).
        self.session = session or Session(store, connect, purpose="control")
        # With ``batched`` (the housekeeping of the session's database), heartbeats go with
        # those of the database's other stores that beat in the same event-loop turn.
        self._batched = batched
        self._on_change = on_change
        self._clock = clock
        self._token = uuid.uuid4()
        self.members: tuple[str, ...] = ()
        # This member's share: lanes with lane % len(members) == rank (rank -1: none).
        self.rank = -1
        self.lanes: frozenset[int] = frozenset()
        self.last_beat: float | None = None
        self.deadlines = Deadlines.of(store.lease_duration)
        self.interval = self.deadlines.heartbeat
        self.joined = asyncio.Event()
        # Heartbeats are retried every second while the database is down: one line per cause.
        self.log = ThrottledLog(logger)

    async def beat(self, conn: Connection | None = None) -> None:
        """One heartbeat: renew, learn the live members, give up the held lanes outside the
        share they give this member, and apply that share (one statement). ``conn``: send it
        there (the first one, in the transaction of the store's join) instead of on the
        session."""
        if conn is not None:
            live, released = await self.db.heartbeat(conn, self.member, self._token)
        elif self._batched is not None:
            live, released = await self._batched.heartbeat(
                self.session, self.db, self.member, self._token
            )
        else:
            async with self.session.connection(
                "heartbeat", urgent=True, within=max(self.interval, LEAST_SILENCE)
            ) as session:
                live, released = await self.db.heartbeat(session, self.member, self._token)
        self.last_beat = self._clock()
        members = tuple(live)
        rank = members.index(self.member) if self.member in members else -1
        changed = members != self.members or rank != self.rank
        lanes = share(rank, len(members), self.store.lanes) if changed else self.lanes
        if changed:
            logger.info(
                "member %s of store %s: rank %s of %s, %s lanes",
                self.member,
                self.store.name,
                rank,
                len(members),
                len(lanes),
                extra={"action": "rebalance", "store": self.store.name, "member": self.member},
            )
        if released:
            logger.info(
                "released %s lane(s) outside this member's share",
                released,
                extra={"action": "release", "store": self.store.name, "member": self.member},
            )
        self.members = members
        self.rank = rank
        self._set_lanes(lanes)
        self.joined.set()

    async def release_outside(self) -> None:
        """Give up, now, the held lanes outside the share. A heartbeat does it too, but skips
        lanes a batch holds at that moment; the batch calls this when it ends, so that the new
        owner does not wait for the next heartbeat. Failures are left to that heartbeat."""
        try:
            rank = self.rank if self.lanes else -1
            async with self.session.connection("release lanes", urgent=True) as conn:
                released = await self.db.release_lanes(conn, self.member, rank, len(self.members))
        except StoreError as exc:
            logger.debug("releasing lanes of store %s failed: %s", self.store.name, exc)
            return
        if released:
            logger.info(
                "released %s lane(s) outside this member's share",
                released,
                extra={"action": "release", "store": self.store.name, "member": self.member},
            )

    def _set_lanes(self, lanes: frozenset[int]) -> None:
        if lanes != self.lanes:
            self.lanes = lanes
            self._on_change(lanes)

    def expired(self) -> bool:
        """True when no heartbeat succeeded for a whole lease: stop sending."""
        if self.last_beat is None:
            return True
        return self._clock() - self.last_beat >= self.deadlines.lease

    async def run(self, stop: asyncio.Event) -> None:
        """Heartbeat every lease/3 until ``stop`` is set; retry sooner after a failure.

        For the first lease/3 after joining, beat every second (at most): workers started
        together each see only the members that beat before them, and would otherwise keep
        that view, and the lanes it gives them, until their next heartbeat.

        Each wait ends at the next multiple of its length on the monotonic clock (never later
        than the length itself), so that the heartbeats of the stores of one database come
        due together and go in one round trip (relayer.store.housekeeping). A member that
        joined with a heartbeat (``beat`` before ``run``) sends the next one at the next tick."""
        settled_at = self._clock() + self.interval
        if self.last_beat is not None:
            first = next_tick(min(self.interval, JOINING_BEAT), self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), first)
        while not stop.is_set():
            delay = self.interval
            if self._clock() < settled_at:
                delay = min(self.interval, JOINING_BEAT)
            try:
                await self.beat()
            except StoreError as exc:
                delay = min(self.interval, 1.0)
                await self.session.close()
                if self.expired():
                    self.rank = -1
                    self._set_lanes(frozenset())
                # A silent database: its SilenceNotice said it, once for the silence.
                if not (isinstance(exc, DatabaseSilentError) and self._batched is not None):
                    self._failed(exc, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), next_tick(delay, self._clock()))

    def _failed(self, exc: StoreError, delay: float) -> None:
        self.log.warning(
            ("heartbeat_failed",),
            "heartbeat of %s failed: %s; retrying in %.0f s (it stops sending if no "
            "heartbeat succeeds for a lease)",
            self.member,
            exc,
            delay,
            extra={"action": "heartbeat_failed", "store": self.store.name},
        )

    async def leave(self) -> None:
        """Release every lane and the membership (graceful shutdown)."""
        try:
            async with self.session.connection("leave", urgent=True) as conn:
                await self.db.leave(conn, self.member)
            logger.info(
                "member %s left store %s",
                self.member,
                self.store.name,
                extra={"action": "leave", "store": self.store.name, "member": self.member},
            )
        except StoreError as exc:
            logger.warning(
                "leaving store %s failed: %s; its lanes are free when the lease expires",
                self.store.name,
                exc,
                extra={"action": "leave_failed", "store": self.store.name},
            )
        finally:
            self.rank = -1
            self._set_lanes(frozenset())
            await self.session.close()
