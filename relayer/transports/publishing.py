"""What the transports that queue one message at a time share (NATS, Redis, webhooks, SQS).

Such a transport implements ``_enqueue``: hand one message to the client and arrange for
``settle`` to be called once with its outcome; return the error at once if the message cannot
be sent as it is (then ``settle`` is not called), raise when the transport cannot be used now.
``_must_wait`` says whether the next message would wait for room. The two ways the relay
publishes, ``publish`` and ``publish_batch``, are then the same for every such transport, and
so are its name, its stop-and-wait within a key and ``close``.
"""

from __future__ import annotations

import abc
import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence

from relayer.transports.base import OutboundBatch, OutgoingMessage, Settle, fail_quietly

Outcome = Callable[[BaseException | None], None]


class QueuingTransport(abc.ABC):
    """A transport over ``_enqueue`` (see the module docstring)."""

    def __init__(self, name: str, close_timeout: float) -> None:
        self._name = name
        self._close_timeout = close_timeout

    @property
    def name(self) -> str:
        return self._name

    @property
    def pipelines_within_key(self) -> bool:
        """False: a key's next row waits for the previous one's answer (stop-and-wait)."""
        return False

    @abc.abstractmethod
    async def _enqueue(
        self,
        destination: str,
        *,
        key: str | None,
        message_id: str,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        settle: Outcome,
    ) -> Exception | None: ...

    @abc.abstractmethod
    def _must_wait(self) -> bool: ...

    @abc.abstractmethod
    async def close_within(self, seconds: float) -> None: ...

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        settle = functools.partial(_settle_future, future)
        try:
            error = await self._enqueue(
                message.destination,
                key=message.key,
                message_id=message.id_text,
                body=message.body,
                extra_headers=message.headers,
                settle=settle,
            )
        except BaseException:  # nothing was sent (cancelled while waiting, or unusable)
            future.cancel()
            raise
        if error is not None:
            settle(error)
        return future

    async def publish_batch(
        self,
        batch: OutboundBatch,
        indexes: Sequence[int],
        settle: Settle,
        admitting: Callable[[], bool],
    ) -> int:
        """``publish`` for many rows (the relay's way): no awaitable per message; stops
        before a message that would wait once the relay admits no more."""
        destinations, keys, ids = batch.destinations, batch.keys, batch.ids
        bodies, headers = batch.bodies, batch.headers
        for handed, index in enumerate(indexes):
            if handed and self._must_wait() and not admitting():
                return handed
            error = await self._enqueue(
                destinations[index],
                key=keys[index],
                message_id=ids[index],
                body=bodies[index],
                extra_headers=headers[index],
                settle=functools.partial(settle, index),
            )
            if error is not None:
                settle(index, error)
                return handed
        return len(indexes)

    async def close(self) -> None:
        """Wait for outstanding answers (up to ``close_timeout``), then disconnect."""
        await self.close_within(self._close_timeout)


def _settle_future(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        fail_quietly(future, error)
