"""Starting and closing transports that several stores of one worker may share.

A worker's stores can be given the same transport instance (the stores of one template share
theirs, and so may stores handed to ``Worker(transports=...)``). A transport starts when the
first store that uses it opens and closes when the last one closes, so a store that joins or
leaves a running worker never closes a transport other stores still send through.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from relayer.transports.base import ClosesWithin, Transport

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Use:
    users: int = 0
    started: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # its start or close, one at a time


class SharedTransports:
    """How many open stores use each transport (by identity); see the module docstring."""

    def __init__(self) -> None:
        self._uses: dict[int, _Use] = {}

    def users(self, transport: Transport) -> int:
        use = self._uses.get(id(transport))
        return use.users if use is not None else 0

    async def acquire(self, transports: Iterable[Transport], *, close_within: float) -> None:
        """Start each of ``transports`` that no store uses yet and count this store as a user.
        If one fails to start, the ones this call counted are released again (closed within
        ``close_within`` seconds when no other store uses them) and the error propagates."""
        counted: list[Transport] = []
        try:
            for transport in _distinct(transports):
                use = self._uses.setdefault(id(transport), _Use())
                async with use.lock:
                    if not use.started:
                        await transport.start()
                        use.started = True
                    use.users += 1
                counted.append(transport)
        except BaseException:
            for transport in _distinct(transports):
                unused = self._uses.get(id(transport))
                if unused is not None and not unused.started and not unused.users:
                    del self._uses[id(transport)]  # never started
            await self.release(counted, close_within=close_within)
            raise

    async def release(self, transports: Iterable[Transport], *, close_within: float) -> None:
        """This store no longer uses ``transports``: close, together, each one no other store
        uses, within ``close_within`` seconds (a stalled broker's transport must not use up
        the others' time)."""
        last: list[tuple[Transport, _Use]] = []
        for transport in _distinct(transports):
            use = self._uses.get(id(transport))
            if use is None or use.users == 0:
                continue
            use.users -= 1
            if use.users == 0:
                last.append((transport, use))
        await asyncio.gather(
            *(self._close(transport, use, close_within) for transport, use in last)
        )

    async def _close(self, transport: Transport, use: _Use, within: float) -> None:
        async with use.lock:
            if use.users or not use.started:  # taken again meanwhile: it stays open
                return
            try:
                await close_transport(transport, within)
            finally:
                use.started = False
                if not use.users and self._uses.get(id(transport)) is use:
                    del self._uses[id(transport)]


def _distinct(transports: Iterable[Transport]) -> list[Transport]:
    return list({id(transport): transport for transport in transports}.values())


async def close_transport(transport: Transport, seconds: float) -> None:
    """Close ``transport`` within ``seconds`` (what is left of the stop budget): through its
    ``close_within`` if it has one, else its ``close``, abandoned after that long."""
    try:
        if isinstance(transport, ClosesWithin):
            await transport.close_within(seconds)
        else:
            async with asyncio.timeout(seconds):
                await transport.close()
    except TimeoutError:
        logger.warning(
            "transport %s did not close within %.1f s (the rest of the stop budget); abandoned: "
            "its unacknowledged rows are sent again by the next owner",
            transport.name,
            seconds,
            extra={"action": "transport_close_failed"},
        )
    except Exception as exc:
        logger.warning(
            "closing transport %s failed: %s",
            transport.name,
            exc,
            extra={"action": "transport_close_failed"},
        )


async def wait_then_abandon(
    pending: Collection[asyncio.Future[Any]], deadline: float, late: Callable[[int], None]
) -> None:
    """Wait for ``pending`` (a closing transport's sends) until ``deadline`` (time.monotonic);
    those still unanswered then are told to ``late`` (their count, to log), cancelled and
    waited for: their rows fail as "will be sent again"."""
    if not pending:
        return
    _, unanswered = await asyncio.wait(pending, timeout=max(deadline - time.monotonic(), 0))
    if not unanswered:
        return
    late(len(unanswered))
    for task in unanswered:
        task.cancel()
    await asyncio.wait(unanswered)
