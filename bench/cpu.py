"""CPU seconds of processes, threads and PostgreSQL backends, read from /proc (Linux only).

A thread's CPU is the first field of ``/proc/PID/task/TID/schedstat`` (nanoseconds on the CPU,
user + system); where the kernel has no schedstat, ``utime + stime`` of its ``stat`` in clock
ticks. A :class:`Meter` samples every thread of the processes it follows, and the backends a
query names, at the start of a window, every ``interval`` seconds during it and at its end: a
thread or backend that exits mid-window keeps the CPU it had at its last sample (at most one
interval is lost, and :attr:`Window.vanished` counts them); one that appears mid-window counts
from zero, since all its CPU was spent inside the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def thread_seconds(pid: int, tid: int) -> float | None:
    """CPU seconds of one thread, or None if it is gone."""
    task = PROC / str(pid) / "task" / str(tid)
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    with contextlib.suppress(OSError, ValueError, IndexError):
        # Fields after the parenthesised command name; utime and stime are fields 14 and 15.
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return None


def thread_name(pid: int, tid: int) -> str:
    with contextlib.suppress(OSError):
        return (PROC / str(pid) / "task" / str(tid) / "comm").read_text().strip()
    return "?"


def threads(pid: int) -> dict[int, tuple[str, float]]:
    """Every live thread of ``pid``: tid -> (name, CPU seconds). Empty if the process is gone."""
    try:
        tids = [int(entry.name) for entry in (PROC / str(pid) / "task").iterdir()]
    except OSError:
        return {}
    found: dict[int, tuple[str, float]] = {}
    for tid in tids:
        seconds = thread_seconds(pid, tid)
        if seconds is not None:
            found[tid] = (thread_name(pid, tid), seconds)
    return found


def _fixed_work() -> int:
    """The same few tens of microseconds of interpreter work each time (dict and str)."""
    table = {number: str(number) for number in range(200)}
    return sum(len(text) for text in table.values())


def cold_work(gaps: Iterable[float], *, repeats: int = 400) -> dict[float, float]:
    """This thread's CPU µs for one piece of fixed work (the median of ``repeats``), run after
    sleeping each of ``gaps`` seconds (0: back to back). On a virtual machine whose cores idle
    between bursts, the same work costs several times more after a sleep of a few
    milliseconds (caches, frequency, the vCPU's wake-up): a relay at a steady rate waits between
    every step, a drain does not."""
    result: dict[float, float] = {}
    warm_until = time.thread_time() + 0.3  # warm up: a core that was idle starts slow
    while time.thread_time() < warm_until:
        _fixed_work()
    for gap in gaps:
        costs = []
        for _ in range(repeats):
            if gap:
                time.sleep(gap)
            before = time.thread_time()
            _fixed_work()
            costs.append(time.thread_time() - before)
        costs.sort()
        result[gap] = costs[len(costs) // 2] * 1e6
    return result


def process_seconds(pid: int) -> float:
    """CPU seconds of a whole process (``utime + stime``, exited threads included), in ticks."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def family_seconds(parent: int) -> float:
    """CPU seconds of a process and its children: its own ``utime + stime``, those of its
    children that exited and that it waited for (``cutime + cstime``: a PostgreSQL server's
    autovacuum workers and ended sessions), and its live children's. 0 if it is gone."""
    try:
        fields = (PROC / str(parent) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = sum(int(value) for value in fields[11:15])
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            child = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(child[1]) == parent:  # field 4, the parent's pid
                ticks += int(child[11]) + int(child[12])
    return ticks / CLOCK_TICKS


def is_local_postgres(pid: int) -> bool:
    """Whether ``pid`` is a PostgreSQL backend on this machine (its CPU is then readable)."""
    with contextlib.suppress(OSError):
        return (PROC / str(pid) / "comm").read_text().strip().startswith("postgres")
    return False


def find_processes(*needles: str) -> list[int]:
    """Pids whose command line contains every one of ``needles`` (like ``pgrep -f``)."""
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if command and all(needle in command for needle in needles):
                found.append(int(entry.name))
    return sorted(found)


Key = tuple[str, int, int]  # (group, pid, tid)


@dataclass
class Window:
    """CPU spent in one measured window, per group ("main", "other", "backends", ...)."""

    seconds: float
    spent: dict[Key, float]
    names: dict[Key, str]
    vanished: dict[str, int] = field(default_factory=dict)

    def group(self, name: str) -> float:
        return sum(value for key, value in self.spent.items() if key[0] == name)

    def has(self, name: str) -> bool:
        return any(key[0] == name for key in self.spent)

    def by_name(self, group: str) -> dict[str, float]:
        """A group's CPU summed by thread name (digits dropped, so that pools read as one)."""
        totals: dict[str, float] = {}
        for key, value in self.spent.items():
            if key[0] == group:
                name = self.names[key].rstrip("0123456789_-/") or self.names[key]
                totals[name] = totals.get(name, 0.0) + value
        return dict(sorted(totals.items(), key=lambda item: -item[1]))


class Meter:
    """Follows processes (split into their main thread and the others) and backend pids.

    ``processes`` maps a group name to a pid: the process's main thread is counted in
    ``GROUP`` and its other threads in ``GROUP other`` when ``split`` names the group, the whole
    process in ``GROUP`` otherwise. ``backends`` maps a group name to an async function that
    returns the backend pids to count now (called at every sample).
    """

    def __init__(
        self,
        processes: Mapping[str, int | Iterable[int]],
        backends: Mapping[str, Callable[[], Awaitable[Iterable[int]]]] | None = None,
        *,
        split: Iterable[str] = (),
        interval: float = 0.25,
    ) -> None:
        self.processes = {
            group: [pids] if isinstance(pids, int) else list(pids)
            for group, pids in processes.items()
        }
        self.backends = dict(backends or {})
        self.split = set(split)
        self.interval = interval
        self._first: dict[Key, float] = {}
        self._last: dict[Key, float] = {}
        self._names: dict[Key, str] = {}
        self._started = 0.0
        self._task: asyncio.Task[None] | None = None

    async def read(self) -> dict[Key, float]:
        readings: dict[Key, float] = {}
        for group, pids in self.processes.items():
            for pid in pids:
                for tid, (name, seconds) in threads(pid).items():
                    where = group if tid == pid or group not in self.split else f"{group} other"
                    key = (where, pid, tid)
                    readings[key] = seconds
                    self._names[key] = name
        for group, pids_now in self.backends.items():
            for pid in await pids_now():
                # A server elsewhere (or in a container) has pids this machine cannot read.
                seconds = thread_seconds(pid, pid) if is_local_postgres(pid) else None
                if seconds is not None:
                    key = (group, pid, pid)
                    readings[key] = seconds
                    self._names[key] = "postgres"
        return readings

    async def sample(self) -> None:
        self._last.update(await self.read())

    async def start(self) -> None:
        self._first = await self.read()
        self._last = dict(self._first)
        self._started = time.perf_counter()
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.sample()

    async def stop(self) -> Window:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # the caller is being cancelled (Ctrl-C), not just the sampler
            self._task = None
        final = await self.read()
        seconds = time.perf_counter() - self._started
        self._last.update(final)
        vanished: dict[str, int] = {}
        for key in self._last:
            if key not in final:
                vanished[key[0]] = vanished.get(key[0], 0) + 1
        spent = {key: value - self._first.get(key, 0.0) for key, value in self._last.items()}
        return Window(seconds, spent, dict(self._names), vanished)
