"""Redis Streams through redis-py's asyncio client: each message appended with XADD.

Options: ``url`` (required, ``redis://user:password@host:6379/0``, ``rediss://...`` or
``unix://...``), ``maxlen`` (trim each stream to about that many entries, ``MAXLEN ~``; 0, the
default: no trimming), ``create_streams`` (true: an XADD creates a missing stream, as Redis
does; false: a missing stream parks the key), ``max_outstanding`` (unanswered XADDs before
``publish`` waits, default 5,000), ``connect_timeout``, ``socket_timeout`` (an answer not seen
by then drops the connection and fails its messages, not counted against the rows) and
``close_timeout``, in seconds.

A row's destination is the stream's key. Each entry has the fields ``body`` (the row's body),
``relayer-message-id`` (the outbox id: XADD has no deduplication in Redis 7, so consumers
drop an id they already handled), ``relayer-ordering-key`` (when the row has a key) and
``header:NAME`` for each of the application's headers. An XADD appends in order; relayer adds a
key's next row only once the server answered the previous one (``pipelines_within_key`` is
False), so a key's rows are in id order in their stream while many keys are in flight.

A key of another type (WRONGTYPE) is the row's fault; a server that is down, silent, out of
memory or read-only is not: the rows are sent again, no attempt counted.
"""

from relayer.transports.redis.transport import RedisTransport

__all__ = ["RedisTransport"]
