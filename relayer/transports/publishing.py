"""``publish`` and ``publish_batch`` for a transport that queues one message at a time.

A broker transport that settles each message from the broker's answer implements one
coroutine, ``enqueue``: hand one message to the client and arrange for ``settle`` to be called
once with its outcome; return the error at once if the message cannot be sent as it is (then
``settle`` is not called), raise when the transport cannot be used now. The two ways the relay
publishes are then the same for every such transport (the NATS and Redis ones).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from relayer.transports.base import OutboundBatch, OutgoingMessage, Settle, fail_quietly

Outcome = Callable[[BaseException | None], None]


class Enqueue(Protocol):
    async def __call__(
        self,
        destination: str,
        /,
        *,
        key: str | None,
        message_id: str,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        settle: Outcome,
    ) -> Exception | None: ...


async def publish_one(enqueue: Enqueue, message: OutgoingMessage) -> Awaitable[None]:
    """``Transport.publish`` through ``enqueue``: an awaitable for the message's outcome."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    settle = functools.partial(settle_future, future)
    try:
        error = await enqueue(
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


async def publish_many(
    enqueue: Enqueue,
    must_wait: Callable[[], bool],
    /,
    batch: OutboundBatch,
    *,
    indexes: Sequence[int],
    settle: Settle,
    admitting: Callable[[], bool],
) -> int:
    """``BatchPublisher.publish_batch`` through ``enqueue``: no awaitable per message; stops
    before a message that would wait (``must_wait``) once the relay admits no more."""
    destinations, keys, ids = batch.destinations, batch.keys, batch.ids
    bodies, headers = batch.bodies, batch.headers
    for handed, index in enumerate(indexes):
        if handed and must_wait() and not admitting():
            return handed
        error = await enqueue(
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


def settle_future(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        fail_quietly(future, error)
