"""The Kafka transport's producers, and what it does when one reports nothing.

A librdkafka producer is used as a whole :class:`Generation` and replaced after a fatal error.
When messages wait and no delivery report comes for ``stall_timeout``, there are two cases:

- the cluster is silent (a network or broker stall, connections open): the producer keeps
  its messages and librdkafka delivers them once the cluster answers; rebuilding would only
  purge them and queue copies behind a cluster that still does not answer;
- the cluster answers but this producer is stuck (seen after a broker lost its producer ids:
  librdkafka bumps the epoch forever): it is rebuilt.

A metadata request (:class:`Probe`) tells them apart. It runs in a daemon thread of its own,
as every librdkafka call that may block for its whole timeout does here (:func:`in_thread`):
the poll thread keeps polling meanwhile, and a stopping process does not wait for such a
thread, as it would for the event loop's default executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from relayer.transports.kafka.placement import Placements

logger = logging.getLogger("relayer.transports.kafka")

_T = TypeVar("_T")

# How long a probe waits for the cluster (it answers in milliseconds when it answers at all).
PROBE_SECONDS = 5.0
# A stalled producer whose cluster answered a probe is stuck if it still reports nothing this
# long after the answer (reports that came with the answer are polled first).
STUCK_GRACE_SECONDS = 1.0


class Generation:
    """One librdkafka producer; replaced as a whole after a fatal error."""

    __slots__ = ("fatal", "last_report", "number", "placements", "probe", "producer", "waiting")

    def __init__(self, number: int, producer: Any) -> None:
        self.number = number
        self.producer = producer
        self.fatal: str | None = None
        # Its answers of success without a place (relayer.transports.kafka.placement; read and
        # written by the poll thread).
        self.placements = Placements()
        # Ids of messages handed to this producer and not reported yet (read and written on
        # the event loop's thread only): a second copy is refused while one waits.
        self.waiting: set[str] = set()
        # Written by the poll thread: when this producer last reported a delivery (or was
        # created, or had nothing waiting), and the probe of the current stall.
        self.last_report = time.monotonic()
        self.probe: Probe | None = None


class Probe:
    """One metadata request in a daemon thread: does the cluster answer at all?"""

    __slots__ = ("answered", "done", "finished")

    def __init__(self, producer: Any, topic: str | None, timeout: float) -> None:
        self.answered = False
        self.done = threading.Event()
        self.finished = 0.0
        thread = threading.Thread(
            target=self._run, args=(producer, topic, timeout), name="relayer-kafka-probe"
        )
        thread.daemon = True
        thread.start()

    def _run(self, producer: Any, topic: str | None, timeout: float) -> None:
        try:
            producer.list_topics(topic, timeout)
            self.answered = True
        except Exception:  # no answer in time (or the producer is gone): the cluster is silent
            self.answered = False
        self.finished = time.monotonic()
        self.done.set()


def stuck(
    generation: Generation, *, stall_timeout: float, probe_timeout: float, topic: str | None
) -> str | None:
    """Called by the poll thread after each poll: why ``generation`` is stuck and must be
    rebuilt, or None (it reports, nothing waits, a probe is under way, or the cluster is
    silent: then the messages wait for it)."""
    now = time.monotonic()
    if len(generation.producer) == 0:
        generation.last_report = now  # nothing waits, so nothing is overdue
        return None
    quiet = now - generation.last_report
    if quiet <= stall_timeout:
        return None
    probe = generation.probe
    if probe is None or (
        probe.done.is_set() and not probe.answered and now - probe.finished >= stall_timeout
    ):
        generation.probe = Probe(generation.producer, topic, min(probe_timeout, PROBE_SECONDS))
        return None
    if not probe.done.is_set() or not probe.answered:
        return None
    if now - probe.finished < STUCK_GRACE_SECONDS:
        return None
    return (
        f"no delivery report for {quiet:.0f} s while {len(generation.producer)} message(s) "
        "waited, though the cluster answers"
    )


def drop_everything(producer: Any, *, in_flight: bool = True) -> None:
    """Purge what a producer holds and serve the purged messages' reports (they fail as
    "will be sent again"). With the gapless guarantee, purging messages in flight is itself
    a fatal error that poll() may raise: expected here, so not an uncaught thread exception."""
    purge = functools.partial(producer.purge, in_queue=True, in_flight=in_flight)
    for step in (purge, functools.partial(producer.poll, 0)):
        try:
            step()
        except Exception as exc:
            logger.debug("purging a Kafka producer: %s", exc)


async def in_thread(function: Callable[..., _T], *args: Any) -> _T:
    """``function(*args)`` in a daemon thread of its own (see the module docstring)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()

    def run() -> None:
        try:
            result = function(*args)
        except BaseException as exc:
            outcome: Callable[[], None] = functools.partial(_fail, future, exc)
        else:
            outcome = functools.partial(_succeed, future, result)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(outcome)

    thread = threading.Thread(target=run, name="relayer-kafka-metadata")
    thread.daemon = True
    thread.start()
    return await future


def _succeed(future: asyncio.Future[_T], result: _T) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
