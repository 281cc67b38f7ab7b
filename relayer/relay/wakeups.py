"""Wake-ups: when a store's lanes are looked at, and which of them are scanned.

Three sources wake lanes, all through the lane schedule:

- a writer's notification (LISTEN on the connection the stores of a database share) names the
  lane it wrote to: that lane is scanned without a probe (``woken``); an empty payload wakes
  every lane;
- a probe of the member's whole share (``wake_all``: after a reconnect, a new share, an empty
  notification) schedules the lanes whose heads are due, in one query, and nothing for idle
  lanes;
- the fallback poll (``poll``) does the same every ``poll_interval`` for notifications that were
  lost, less often while the store is idle and LISTEN wakes it (``idle_poll_wait``).

A writer's notifications within one ``wake_linger`` share a batch (``WakeWindow``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Iterable

from relayer.deadlines import Deadlines
from relayer.errors import StoreError
from relayer.relay.membership import Membership
from relayer.relay.probes import Prober
from relayer.relay.results import Scan, after_probe
from relayer.relay.schedule import LaneSchedule
from relayer.relay.stats import StoreStats
from relayer.settings import StoreSettings
from relayer.store import LaneHead
from relayer.store.databases import Database
from relayer.store.housekeeping import next_tick
from relayer.store.notifier import HOT_HOLD, HOT_POLL

logger = logging.getLogger(__name__)

# A wake-up probe of a share over more lanes than twice this looks at the first this many
# lanes first and at the rest in a second query, so that batches start after a fraction of the
# probe (over 65,536 lanes with a backlog in 9,000 of them, the whole probe takes 60-130 ms).
FIRST_PROBE_LANES = 8192
# The longest wait of an idle store's fallback poll while LISTEN wakes it (seconds; at most a
# third of the lease): see Wakeups.idle_poll_wait.
IDLE_POLL_MAX = 10.0


class Wakeups:
    """The wake-ups of one store in this member: notifications, probes, the fallback poll."""

    def __init__(
        self,
        store: StoreSettings,
        member: str,
        *,
        membership: Membership,
        schedule: LaneSchedule,
        prober: Prober,
        database: Database,
        stats: StoreStats,
    ) -> None:
        self.store = store
        self.member = member
        self.membership = membership
        self.schedule = schedule
        self.prober = prober
        self.database = database
        self.statements = prober.statements
        self.stats = stats
        self.poll_interval = store.poll_interval.total_seconds()
        self.longest_poll = max(
            self.poll_interval,
            min(IDLE_POLL_MAX, Deadlines.of(store.lease_duration).longest_retry),
        )
        # Lanes that writers' notifications wake within one wake_linger share a batch.
        self.window = WakeWindow(store.wake_linger.total_seconds())
        self._waking: asyncio.Future[None] | None = None
        self._wake_again = False
        self._wake_fully = False  # a wake-up other than the fallback poll is waiting
        # Consecutive polls that found no row: while every commit is sure to wake the store, an
        # idle store's fallback poll waits twice as long after each (idle_poll_wait).
        self._idle_polls = 0
        self._reliable_wakeups = store.notify == "in_transaction" and database.listener is not None
        self.polls = 0  # fallback polls so far (tests and diagnostics)
        # notify = "after_commit": writers' processes stay quiet for WAKE_QUIET after notifying
        # the store; each notification heard (and a new share) makes the store hot: its lanes
        # are polled every HOT_POLL until HOT_HOLD after the last one (hot_poll).
        # Not behind a transaction pooler: a probe every HOT_POLL would hold its few server
        # connections (writers there stay quiet for no time: relayer.writer.waker).
        self._heats = (
            store.notify == "after_commit"
            and database.listener is not None
            and store.pooler != "transaction"
        )
        self._hot_until = 0.0
        self._hot: asyncio.Future[None] | None = None
        self.hot_polls = 0  # (tests and diagnostics)

    def lanes_changed(self, lanes: frozenset[int]) -> None:
        """The member's share changed: polls start short again, and windows opened by lanes
        outside it open nothing any more."""
        self._idle_polls = 0
        self.window.keep(lanes)
        self._heat()  # writers may be quiet towards the store: the new share is polled hot

    @property
    def hot(self) -> bool:
        """The store's lanes are polled every HOT_POLL now (see __init__)."""
        return self._hot is not None and not self._hot.done()

    def _heat(self) -> None:
        """Poll the store's lanes every HOT_POLL for the next HOT_HOLD (see __init__)."""
        if not self._heats:
            return
        loop = asyncio.get_running_loop()
        self._hot_until = loop.time() + HOT_HOLD
        if self._hot is None or self._hot.done():
            self._hot = asyncio.ensure_future(self._hot_poll())

    async def _hot_poll(self) -> None:
        """While the store is hot: a probe every HOT_POLL (on its multiples, so that the
        probes of the database's hot idle stores go together), of the lanes whose scan is not
        waiting or running already."""
        loop = asyncio.get_running_loop()
        while loop.time() < self._hot_until:
            await asyncio.sleep(next_tick(HOT_POLL, loop.time()))
            if self.membership.lanes and not self.schedule.every_lane_queued():
                self.hot_polls += 1
                self.wake_all(fallback=True)

    def woken(self, payload: str) -> None:
        """A writer's NOTIFY: the payload is a lane to scan now, or empty for every lane."""
        self._heat()
        try:
            lane = int(payload)
        except ValueError:
            self.wake_all()
            return
        self._idle_polls = 0
        if lane in self.membership.lanes:
            # Skip the probe: a row was just committed in this lane.
            schedule = self.schedule
            schedule.due_at(lane, self.window.wake(lane, schedule.now(), lead=schedule.free))

    def _notified(self, payload: str) -> None:
        self.woken(payload)  # looked up on each notification: tests wrap it on a running worker

    def wake_all(self, *, fallback: bool = False) -> None:
        """Probe every owned lane in one query and scan the lanes whose head is due, now (on an
        empty NOTIFY, after a reconnect or a new share; ``fallback``: the poll every
        poll_interval). Idle lanes cost no job and no write, and lanes whose head is known to
        be due (their scan waits) are left out of the probe. The fallback poll is for
        notifications that were lost, so it also leaves out every lane whose scan is waiting
        or running (that scan probes the lane or reschedules it). Wake-ups that arrive during
        a probe fold into one more."""
        if not fallback:
            self._wake_fully = True
        if self._waking is not None and not self._waking.done():
            self._wake_again = True
            return
        self._waking = asyncio.ensure_future(self._wake())

    async def _wake(self) -> None:
        self._wake_again = True
        while self._wake_again:
            self._wake_again = False
            fully, self._wake_fully = self._wake_fully, False
            membership = self.membership
            if not membership.lanes:
                return
            skip = self.schedule.known_due() if fully else self.schedule.queued()
            found = False
            try:
                if self._idle_polls and not await self.database.batched.holds_rows(self.statements):
                    # Idle, and still no row in any lane: asked together with the database's
                    # other idle stores, one column each, instead of a probe of its own.
                    parts = []
                else:
                    parts = probe_parts(self.store.lanes)
                for part in parts:
                    heads = await self.prober.heads(
                        membership.rank, len(membership.members), skip=skip, lanes=part
                    )
                    found = found or bool(heads)
                    self._woken(heads)  # the first part's scans start while the rest is probed
            except StoreError as exc:
                self.stats.last_error = str(exc)
                return  # the next poll tries again
            # A poll that found no lane to wake (every lane with rows has its scan waiting or
            # running, or there is none) makes the fallback poll wait longer (idle_poll_wait).
            self._idle_polls = 0 if found else self._idle_polls + 1

    def _woken(self, heads: list[LaneHead]) -> None:
        """Schedule the scans of the lanes a wake-up probe found."""
        schedule = self.schedule
        now = schedule.now()
        # Lanes found due while a wake_linger window is open join it: they go in the batch
        # of the lanes notified within it (a poll that fell inside the window would otherwise
        # start batches of its own a few milliseconds earlier).
        window = self.window
        joining = window.is_open(now)
        for head in heads:
            decided = after_probe(head, self.member, self.poll_interval)
            if decided is None:
                schedule.due_at(head.lane, window.join(head.lane) if joining else now)
            elif decided.scan in (Scan.FUTURE, Scan.BUSY):
                schedule.at(head.lane, now + decided.next_in)

    def idle_poll_wait(self) -> float:
        """How long the fallback poll waits now: poll_interval, doubled after each poll in a
        row that found no lane to wake (no row, or rows only in lanes whose scan is waiting or
        running already), up to IDLE_POLL_MAX (at most lease_duration / 3), while every
        committed row is sure to wake the store: writers notify in their transaction
        (``notify = "in_transaction"``) and a LISTEN connection hears them (a writer's
        notification, a lane change or a reconnect sets it back). A wake-up sent after the
        commit (``after_commit``) can be lost with the writer's process, and without LISTEN or
        notifications the poll is the only wake-up: then it waits poll_interval, never longer,
        so a lost wake-up delays a row by at most that."""
        poll = self.poll_interval
        if not self._reliable_wakeups or not self._idle_polls:
            return poll
        return min(poll * (1 << min(self._idle_polls, 16)), self.longest_poll)

    async def poll(self, stop: asyncio.Event, tick: Callable[[], None]) -> None:
        """The fallback for lost notifications: probe every owned lane each poll_interval (less
        often while the store is idle: idle_poll_wait), then ``tick()``. Each wait ends at the
        next multiple of its length, so that the polls of the database's idle stores come due
        together (their probes then go in one statement: relayer.store.housekeeping). A poll
        while every owned lane has a scan waiting or running probes nothing: each of them is
        scanned anyway (under a backlog the probe of a whole share cost more than a batch)."""
        while not stop.is_set():
            if self.idle and not self._reliable_wakeups:
                await self._poll_idle(stop)
            else:
                with contextlib.suppress(TimeoutError):
                    wait = next_tick(self.idle_poll_wait(), self.schedule.now())
                    await asyncio.wait_for(stop.wait(), wait)
                if stop.is_set():
                    break
                self.polls += 1
                if not self.schedule.every_lane_queued():
                    self.wake_all(fallback=True)
            tick()

    @property
    def idle(self) -> bool:
        """The last poll found no lane to wake."""
        return self._idle_polls > 0

    async def _poll_idle(self, stop: asyncio.Event) -> None:
        """An idle store whose wake-ups can be lost is still polled every poll_interval, by
        its database's idle watch (relayer.store.idle): with the other idle stores, one
        statement a round, and this store woken only when a round finds a row in its lanes
        (or after longest_poll, to tick)."""
        held = await self.database.idle.wait_for_rows(
            self.statements, self.poll_interval, self.longest_poll, stop
        )
        if held and not stop.is_set():
            self.polls += 1
            self._idle_polls = 0  # probe the share itself (idle stores ask holds_rows)
            if not self.schedule.every_lane_queued():
                self.wake_all(fallback=True)

    async def listen(self, stop: asyncio.Event) -> None:
        """Wake lanes on writers' notifications, through the LISTEN connection the stores of
        the database share, until ``stop`` (polls cover the gaps when it is lost)."""
        listener = self.database.listener
        if listener is None:
            logger.info(
                "store %s: no LISTEN behind a transaction pooler (pooler = 'transaction', no "
                "listen_dsn): probing every poll_interval (%g s); set listen_dsn to a direct "
                "connection or a session-mode pool to be woken at once",
                self.store.name,
                self.poll_interval,
                extra={"action": "listen_off", "store": self.store.name},
            )
            return
        listener.subscribe(self.store, self._notified, self.wake_all)
        try:
            await stop.wait()
        finally:
            await listener.unsubscribe(self.store)

    async def close(self) -> None:
        """Stop the probe of a wake-up still running, and the hot polls."""
        if self._hot is not None:
            self._hot.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._hot
        if self._waking is not None:
            self._waking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._waking


def probe_parts(lanes: int) -> list[range]:
    """The lane ranges a wake-up probe of a store with ``lanes`` lanes looks at, one query
    each, in order: every lane at once, or FIRST_PROBE_LANES first and then the rest."""
    if lanes <= 2 * FIRST_PROBE_LANES:
        return [range(lanes)]
    return [range(FIRST_PROBE_LANES), range(FIRST_PROBE_LANES, lanes)]


class WakeWindow:
    """The ``wake_linger`` window of one store: when each lane a writer's notification wakes is
    due, so that the lanes woken within one linger share a batch transaction (at a steady rate
    of single-row transactions, a batch per row would cost far more than the rows).

    The lane that opens a window (``wake``) is due at once when nothing else waits for it (no
    scan waiting or running, no outage hold: ``lead``): its dispatch pass and the gate's claim
    run while the window is open, and its scan waits for the window's end (``opened_by``,
    ``waited``), so the claim's round trip is not added to the latency. The lanes woken later
    in the window join it (``join``): due a linger after its end, they are gathered when it
    ends, and the opener's batch takes them from the store's queue (``take_gathered``), riding
    on the slot it was granted, as a widened batch's lanes do. If the opener is late or refused
    (a paused store, no free slot), they are scanned on their own when they come due. A window
    without such an opener is served at its end: every lane of it is due then.

    Times are the store's clock (seconds); a linger of 0 opens no window.
    """

    __slots__ = ("_gathered", "_joining", "_opener", "_openers", "ends", "linger")

    def __init__(self, linger: float) -> None:
        self.linger = linger
        self.ends = float("-inf")  # when the open window ends (-inf: none was opened yet)
        self._opener: int | None = None  # the open window's opener, if its scan went at once
        self._openers: dict[int, float] = {}  # lane -> the end of the window it opened
        self._joining: set[int] = set()  # woken within the open window, after its opener
        self._gathered: set[int] = set()  # joiners of a window that ended: the next batch's

    def is_open(self, now: float) -> bool:
        return now < self.ends

    def wake(self, lane: int, now: float, *, lead: Callable[[int], bool]) -> float:
        """When ``lane``, woken now by a notification, is due: it joins the open window, or
        opens one (and leads it if ``lead(lane)``: nothing else waits for the lane)."""
        if now < self.ends:
            return self.join(lane)
        self._gather()  # the window that ended: its joiners go in the next batch
        self.ends = now + self.linger
        if self.linger > 0 and lead(lane):
            self._opener = lane
            self._openers[lane] = self.ends
            return now
        self._opener = None
        return self.ends

    def join(self, lane: int) -> float:
        """When ``lane``, woken inside the open window (by a notification or a probe), is due."""
        if self._opener is None or lane == self._opener:
            return self.ends
        self._joining.add(lane)
        return self.ends + self.linger

    def opened_by(self, lane: int) -> float | None:
        """The end of the window ``lane`` opened, if its scan is the one starting now (asked
        once per opening: the scan then waits until that end and calls ``waited``)."""
        return self._openers.pop(lane, None)

    def waited(self, ends: float) -> None:
        """An opener waited until ``ends``: if its window is the open one, that window's joiners
        are gathered for the opener's batch."""
        if ends == self.ends:
            self._gather()

    def take_gathered(self, leaving_out: Iterable[int]) -> list[int]:
        """The gathered lanes, ascending, without ``leaving_out`` (the batch's own lanes);
        none are gathered afterwards."""
        if not self._gathered:
            return []
        gathered = sorted(self._gathered.difference(leaving_out))
        self._gathered = set()
        return gathered

    def keep(self, lanes: Collection[int]) -> None:
        """The member's share changed: openers outside ``lanes`` open nothing any more."""
        self._openers = {lane: ends for lane, ends in self._openers.items() if lane in lanes}

    def _gather(self) -> None:
        if self._joining:
            self._gathered |= self._joining
            self._joining = set()
