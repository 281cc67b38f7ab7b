"""NATS JetStream through nats-py: each message published to its subject and acknowledged.

Options: ``url`` (required, ``nats://user:password@host:4222``, ``tls://...``, several separated
by commas), ``max_outstanding`` (unacknowledged publishes before ``publish`` waits, default
5,000), ``connect_timeout``, ``close_timeout``, ``reconnect_interval``, ``ack_timeout`` (an
acknowledgement not seen by then fails, not counted against the row, default 30) and
``ping_interval`` (how often the client checks a quiet connection, default 20), in seconds.

A row's destination is the subject it is published to; a JetStream stream must capture it
(checked before the first send to it: a subject no stream captures parks the key with a message
saying so). Each message carries the outbox id as ``Nats-Msg-Id`` (JetStream drops a second
copy within the stream's duplicate window, 2 minutes by default) and in the
``relayer-message-id`` header, the ordering key in ``relayer-ordering-key``, and the
application's headers as NATS headers. A stream stores what it receives in order; relayer
publishes a key's next row only once JetStream acknowledged the previous one
(``pipelines_within_key`` is False), so a key's rows are stored in id order while many keys are
in flight at once.

A connection lost, a server that does not acknowledge within ``ack_timeout``, or JetStream
unavailable is not the rows' fault: they are sent again, no attempt counted. nats-py reconnects
by itself; while it is disconnected, publishes are refused at once rather than buffered.
"""

from relayer.transports.nats.transport import NatsTransport

__all__ = ["NatsTransport"]
