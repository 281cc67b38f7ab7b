"""SQS destinations: a queue's name (``orders.fifo``) or URL, looked up once: its URL, whether
it is FIFO and its largest message. This module does not import the AWS client; it calls the
one it is given."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from relayer.transports.base import DestinationError
from relayer.transports.sqs import outcomes

_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}(\.fifo)?")
# SQS's largest message before 2025, the default of queues that do not say.
DEFAULT_MAX_BYTES = 262_144
# Queues remembered; beyond that they are looked up each time.
_REMEMBERED = 10_000


@dataclass(frozen=True, slots=True)
class Queue:
    """One queue as the transport sends to it."""

    destination: str
    url: str
    fifo: bool
    max_bytes: int


class Queues:
    """The queues of one transport, by destination; one lookup at a time per destination."""

    def __init__(self) -> None:
        self._known: dict[str, Queue] = {}
        self._looking: dict[str, asyncio.Future[Queue]] = {}

    def known(self, destination: str) -> Queue | None:
        return self._known.get(destination)

    def forget(self, destination: str) -> None:
        """The queue is gone (or was never there): look it up again next time."""
        self._known.pop(destination, None)

    async def get(self, client: Any, destination: str) -> Queue:
        """The queue ``destination`` names: DestinationError if it does not exist or cannot be
        used, TransportUnavailableError if SQS cannot be reached to tell."""
        queue = self._known.get(destination)
        if queue is not None:
            return queue
        looking = self._looking.get(destination)
        if looking is not None:
            return await asyncio.shield(looking)
        future: asyncio.Future[Queue] = asyncio.get_running_loop().create_future()
        self._looking[destination] = future
        try:
            queue = await self._look_up(client, destination)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: the others waiting get it, nobody else
            raise
        finally:
            del self._looking[destination]
        future.set_result(queue)
        if len(self._known) < _REMEMBERED:
            self._known[destination] = queue
        return queue

    async def _look_up(self, client: Any, destination: str) -> Queue:
        if "://" in destination:
            url = destination
        elif _NAME.fullmatch(destination):
            try:
                url = (await client.get_queue_url(QueueName=destination))["QueueUrl"]
            except Exception as exc:  # every failure is said in the relay's words
                raise outcomes.lookup_failed(destination, exc) from exc
        else:
            raise DestinationError(
                f"SQS destination {destination!r} is neither a queue name (up to 80 letters, "
                "digits, '-' and '_', ending in .fifo for a FIFO queue) nor a queue URL; fix the "
                "destination"
            )
        try:
            answer = await client.get_queue_attributes(
                QueueUrl=url, AttributeNames=["FifoQueue", "MaximumMessageSize"]
            )
        except Exception as exc:  # every failure is said in the relay's words
            raise outcomes.lookup_failed(destination, exc) from exc
        attributes = answer.get("Attributes") or {}
        fifo = str(attributes.get("FifoQueue", "false")).lower() == "true"
        max_bytes = int(attributes.get("MaximumMessageSize") or DEFAULT_MAX_BYTES)
        return Queue(destination, url, fifo, max_bytes)
