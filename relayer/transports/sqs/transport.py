"""SQSTransport: its options, start, the two ways to publish (both through ``_enqueue``), the
batches (one ``SendMessageBatch`` of up to 10 entries per queue and event-loop turn) and close.
The package's docstring says what the transport guarantees."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

from relayer.errors import TransportError
from relayer.redact import redact
from relayer.transports.base import (
    DestinationError,
    SendError,
)
from relayer.transports.gate import Gate
from relayer.transports.lifecycle import wait_then_abandon
from relayer.transports.options import Options, TransportOptionError
from relayer.transports.publishing import Outcome, QueuingTransport
from relayer.transports.sqs import encoding, outcomes
from relayer.transports.sqs.queues import Queue, Queues
from relayer.transports.stalls import StallNotice

# The package's name: every part of the transport logs as one (users filter on it).
logger = logging.getLogger("relayer.transports.sqs")

_KNOWN_OPTIONS = (
    "region, endpoint_url, access_key_id, secret_access_key, session_token, queues, "
    "max_outstanding, timeout, connect_timeout, close_timeout"
)
BATCH_ENTRIES = 10  # SendMessageBatch's limit
# A request that got no answer within the timeouts.
_NO_ANSWER = (ReadTimeoutError, ConnectTimeoutError, TimeoutError)


@dataclass(slots=True)
class _Waiting:
    """A message handed over, waiting for its batch's answer."""

    entry: encoding.Entry
    size: int
    message_id: str
    settle: Outcome


class SQSTransport(QueuingTransport):
    """Sends to SQS queues in batches; the destination is a queue name or URL."""

    # OpenTelemetry's messaging.system for the relay's send spans (relayer.relay.trace).
    messaging_system = "aws_sqs"

    def __init__(
        self,
        name: str,
        region: str,
        *,
        endpoint_url: str | None = None,
        credentials: Mapping[str, str] | None = None,
        queues: Sequence[str] = (),
        max_outstanding: int = 1_000,
        timeout: float = 10.0,
        connect_timeout: float = 5.0,
        close_timeout: float = 30.0,
    ) -> None:
        """``credentials``: access_key_id, secret_access_key and session_token (None: the
        environment's, as any AWS client finds them)."""
        super().__init__(name, close_timeout)
        self._region = region
        self._endpoint_url = endpoint_url
        self._credentials = dict(credentials or {})
        self._check_at_start = tuple(queues)
        self._config = AioConfig(
            connect_timeout=connect_timeout,
            read_timeout=timeout,
            retries={"total_max_attempts": 1},  # the relay retries, without counting SQS's faults
            max_pool_connections=max(max_outstanding // BATCH_ENTRIES, 1),
        )
        self._queues = Queues()
        self._gate = Gate(max_outstanding)
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._closed = False
        self._pending: dict[Queue, list[_Waiting]] = {}
        self._flush_scheduled = False
        self._sending: set[asyncio.Task[None]] = set()
        self._outstanding: set[str] = set()  # message ids handed over, not answered
        self._answered_at = time.monotonic()
        self._notice = StallNotice(
            logger, name, "SQS", "check the endpoint, the network and AWS's service health"
        )

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> SQSTransport:
        """The ``sqs`` factory: options as in ``[stores.X.transports.Y]``."""
        reader = Options(options)
        region = reader.text("region")
        if not region:
            raise TransportOptionError(
                "region", region, "is required: the AWS region, e.g. eu-west-1"
            )
        endpoint_url = reader.text("endpoint_url")
        if endpoint_url is not None and not endpoint_url.startswith(("http://", "https://")):
            raise TransportOptionError(
                "endpoint_url", endpoint_url, "must be an http:// or https:// URL"
            )
        credentials = {
            name: value
            for name in ("access_key_id", "secret_access_key", "session_token")
            if (value := reader.text(name))
        }
        if ("access_key_id" in credentials) != ("secret_access_key" in credentials):
            given = "access_key_id" if "access_key_id" in credentials else "secret_access_key"
            raise TransportOptionError(
                given, "***" if given != "access_key_id" else credentials[given],
                "needs both access_key_id and secret_access_key (or neither: the environment's "
                "AWS credentials)",
            )  # fmt: skip
        transport = cls(
            name,
            region,
            endpoint_url=endpoint_url,
            credentials=credentials,
            queues=sorted(reader.names("queues")),
            max_outstanding=reader.integer("max_outstanding", 1_000, low=1, high=100_000),
            timeout=reader.seconds("timeout", 10.0),
            connect_timeout=reader.seconds("connect_timeout", 5.0),
            close_timeout=reader.seconds("close_timeout", 30.0),
        )
        reader.reject_unread("sqs", _KNOWN_OPTIONS)
        return transport

    def __repr__(self) -> str:
        where = redact(self._endpoint_url) if self._endpoint_url else self._region
        return f"SQSTransport(name={self._name!r}, endpoint={where!r})"

    async def start(self) -> None:
        """Make the client; look up the ``queues`` option's queues (each must exist)."""
        self._closed = False
        if self._client is None:
            stack = contextlib.AsyncExitStack()
            self._client = await stack.enter_async_context(
                get_session().create_client(
                    "sqs",
                    region_name=self._region,
                    endpoint_url=self._endpoint_url,
                    aws_access_key_id=self._credentials.get("access_key_id"),
                    aws_secret_access_key=self._credentials.get("secret_access_key"),
                    aws_session_token=self._credentials.get("session_token"),
                    config=self._config,
                )
            )
            self._stack = stack
        for destination in self._check_at_start:
            await self._queues.get(self._client, destination)
        logger.info(
            "SQS transport %s sends to %s",
            self._name,
            redact(self._endpoint_url) if self._endpoint_url else f"region {self._region}",
            extra={"action": "transport_start"},
        )

    async def ordered_by_key(self, destination: str) -> bool:
        """True for a FIFO queue that exists, False for a standard one."""
        return (await self._queues.get(self._require_client(), destination)).fifo

    def _must_wait(self) -> bool:
        return self._gate.full()

    def _require_client(self) -> Any:
        if self._client is None or self._closed:
            raise TransportError(
                f"SQS transport {self._name!r} is "
                f"{'closed' if self._closed else 'not started'}; call start() before publish()"
            )
        return self._client

    async def _enqueue(
        self,
        destination: str,
        *,
        key: str | None,
        message_id: str,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        settle: Outcome,
    ) -> Exception | None:
        """Queue one message for this turn's batch to its queue; the error if it fails at
        once. Raises TransportError when the transport or SQS cannot be used now."""
        client = self._require_client()
        key = key or None
        if message_id in self._outstanding:
            # The relay gave up waiting for the first copy (a batch deadline): SQS is slow or
            # stalled, not the row at fault.
            self._notice.refused(len(self._outstanding), self._answered_at)
            return outcomes.still_waiting(message_id, destination)
        try:
            queue = await self._queues.get(client, destination)
        except DestinationError as exc:
            return SendError(str(exc), retryable=False)
        if key is not None and not queue.fifo:
            return outcomes.standard_queue(destination)
        try:
            entry, size = encoding.entry(
                message_id, key, body, extra_headers, fifo=queue.fifo, max_bytes=queue.max_bytes
            )
        except SendError as exc:
            return exc
        await self._gate.enter()
        if not self._outstanding:  # nothing waited for an answer: nothing is overdue
            self._answered_at = time.monotonic()
        self._outstanding.add(message_id)
        waiting = self._pending.setdefault(queue, [])
        waiting.append(_Waiting(entry, size, message_id, settle))
        if len(waiting) >= BATCH_ENTRIES:
            self._send_now(queue)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return None

    def _flush(self) -> None:
        """Send what this event-loop turn queued, per queue."""
        self._flush_scheduled = False
        for queue in list(self._pending):
            self._send_now(queue)

    def _send_now(self, queue: Queue) -> None:
        waiting = self._pending.pop(queue, [])
        batch: list[_Waiting] = []
        size = 0
        for item in waiting:
            # A batch's total is bounded like one message (SQS's batch limit).
            if batch and (len(batch) == BATCH_ENTRIES or size + item.size > queue.max_bytes):
                self._start(queue, batch)
                batch, size = [], 0
            batch.append(item)
            size += item.size
        if batch:
            self._start(queue, batch)

    def _start(self, queue: Queue, batch: list[_Waiting]) -> None:
        task = asyncio.get_running_loop().create_task(self._send(queue, batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, queue: Queue, batch: list[_Waiting]) -> None:
        """One SendMessageBatch; each entry settled by its own outcome."""
        entries = [dict(item.entry, Id=str(number)) for number, item in enumerate(batch)]
        try:
            answer = await self._client.send_message_batch(QueueUrl=queue.url, Entries=entries)
        except asyncio.CancelledError:  # closed before SQS answered
            for item in batch:
                self._settle(item, outcomes.closed(self._name))
            raise
        except Exception as exc:  # every failure is said in the relay's words
            if isinstance(exc, _NO_ANSWER):
                # Silence for ``timeout``: SQS (or the way to it) stalled; said once.
                self._notice.refused(len(self._outstanding), self._answered_at)
            error = outcomes.request_failed(queue.destination, exc)
            if error is None and len(batch) > 1:  # about some entry: find which, alone
                await asyncio.gather(*(self._send(queue, [item]) for item in batch))
                return
            if error is None:
                error = outcomes.refused_alone(queue.destination, exc)
            elif isinstance(error, SendError):
                self._queues.forget(queue.destination)  # gone or denied: look again next time
            for item in batch:
                self._settle(item, error)
            if outcomes.code_of(exc) is not None:
                self._answered()
            return
        self._answered()
        failed = {str(failure.get("Id")): failure for failure in answer.get("Failed") or ()}
        for number, item in enumerate(batch):
            failure = failed.get(str(number))
            outcome = None if failure is None else outcomes.entry_failed(queue.destination, failure)
            self._settle(item, outcome)

    def _answered(self) -> None:
        self._answered_at = time.monotonic()
        if self._notice.since is not None:
            self._notice.acknowledged()

    def _settle(self, item: _Waiting, error: BaseException | None) -> None:
        self._outstanding.discard(item.message_id)
        self._gate.leave()
        item.settle(error)

    def _closes_unanswered(self, count: int) -> None:
        logger.warning(
            "SQS transport %s closes with %s batches unanswered; their rows are sent again by "
            "the next owner",
            self._name,
            count,
            extra={"action": "transport_close", "rows": count},
        )

    async def close_within(self, seconds: float) -> None:
        """``close``, returning within ``seconds`` (and ``close_timeout``) whatever SQS does:
        a stopping worker passes what is left of its stop budget. Batches still unanswered
        then are abandoned and fail as "will be sent again"."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + max(min(seconds, self._close_timeout), 0.0)
        self._flush()
        await wait_then_abandon(list(self._sending), deadline, self._closes_unanswered)
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            closing = asyncio.ensure_future(stack.aclose())
            done, _ = await asyncio.wait({closing}, timeout=max(deadline - time.monotonic(), 0.1))
            if not done:
                closing.cancel()
