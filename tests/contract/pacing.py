"""Publishing a batch the way the relay does (protocol rule 5, "Send, pipelined"), for tests.

A transport-level stand-in for the relay's ``BatchSender``, without the store: the contract
tests and ``bench/transport_bare.py`` drive transports with it.

``publish_in_order`` hands a batch (in id order) to a transport and returns one outcome per
message. How much it keeps in flight depends on the transport:

- ``pipelines_within_key`` (gapless, e.g. Kafka): everything back to back. A failure fails every
  later message of its key that is already in flight; a key whose failure is already reported
  gets no further publishes from this batch.
- otherwise (e.g. RabbitMQ): keys are pipelined, but a key's next message is published only
  after its previous one was acknowledged (stop-and-wait within a key, whatever the
  destinations).

Either way a failure in the middle of a batch never lets a key's later message reach the broker
ahead of an earlier one. Messages that were never handed to the transport because an earlier
message of their key failed get a :class:`NotSentError`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Sequence

from relayer.errors import TransportError
from relayer.transports.base import OutgoingMessage, SendError, Transport


class NotSentError(SendError):
    """The message was not handed to the transport: an earlier message of its key failed."""


async def publish_in_order(
    transport: Transport, messages: Sequence[OutgoingMessage]
) -> list[TransportError | None]:
    """Publish ``messages`` (in id order); the outcome of each, None meaning acknowledged."""
    if transport.pipelines_within_key:
        return await _back_to_back(transport, messages)
    return await _stop_and_wait(transport, messages)


async def _back_to_back(
    transport: Transport, messages: Sequence[OutgoingMessage]
) -> list[TransportError | None]:
    outcomes: list[TransportError | None] = [None] * len(messages)
    awaitables: list[tuple[int, asyncio.Future[None]]] = []
    last: dict[tuple[str, str], asyncio.Future[None]] = {}
    for index, message in enumerate(messages):
        key = message.key
        if key is not None:
            previous = last.get((message.destination, key))
            # A reported failure stops the key: later rows must not be published after it.
            if previous is not None and previous.done() and previous.exception() is not None:
                outcomes[index] = _not_sent(message)
                continue
        try:
            future = _as_future(await transport.publish(message))
        except SendError as error:
            outcomes[index] = error
            continue
        except TransportError as error:  # unreachable: stop the batch, keep the rest unsent
            for rest in range(index, len(messages)):
                outcomes[rest] = error
            break
        if key is not None:
            last[(message.destination, key)] = future
        awaitables.append((index, future))
    for index, future in awaitables:
        outcomes[index] = await _outcome(future)
    return outcomes


async def _stop_and_wait(
    transport: Transport, messages: Sequence[OutgoingMessage]
) -> list[TransportError | None]:
    outcomes: list[TransportError | None] = [None] * len(messages)
    waiting: dict[str, deque[int]] = {}  # key -> its rows waiting for an acknowledgement
    acknowledged: deque[tuple[int, asyncio.Future[None]]] = deque()
    wake = asyncio.Event()
    outstanding = 0

    def done(index: int, future: asyncio.Future[None]) -> None:
        acknowledged.append((index, future))
        wake.set()

    async def send(index: int) -> None:
        nonlocal outstanding
        try:
            future = _as_future(await transport.publish(messages[index]))
        except TransportError as error:
            future = asyncio.get_running_loop().create_future()
            future.set_exception(error)
        outstanding += 1
        future.add_done_callback(lambda settled: done(index, settled))

    for index, message in enumerate(messages):
        if message.key is None:
            await send(index)
            continue
        queue = waiting.get(message.key)
        if queue is not None:
            queue.append(index)
        else:
            waiting[message.key] = deque()
            await send(index)
    while outstanding:
        await wake.wait()
        wake.clear()
        while acknowledged:
            index, future = acknowledged.popleft()
            outstanding -= 1
            outcome = await _outcome(future)
            outcomes[index] = outcome
            message = messages[index]
            if message.key is None:
                continue
            queue = waiting[message.key]
            if outcome is not None:
                for skipped in queue:
                    outcomes[skipped] = _not_sent(messages[skipped])
                queue.clear()
            if queue:
                await send(queue.popleft())
            else:
                del waiting[message.key]
    return outcomes


async def _outcome(awaitable: Awaitable[None]) -> TransportError | None:
    # SendError: this message failed; another TransportError: the broker is unreachable.
    try:
        await awaitable
    except TransportError as error:
        return error
    return None


def _as_future(awaitable: Awaitable[None]) -> asyncio.Future[None]:
    # Transports usually return futures already; wrapping them again would cost a task each.
    if isinstance(awaitable, asyncio.Future):
        return awaitable
    return asyncio.ensure_future(awaitable)


def _not_sent(message: OutgoingMessage) -> NotSentError:
    return NotSentError(
        f"not sent: an earlier message of key {message.key!r} to {message.destination!r} "
        "failed in this batch; it follows that message when the key is retried"
    )
