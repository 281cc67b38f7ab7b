"""RabbitMQ through aio-pika: publisher confirms, mandatory routing, pipelined on one channel.

Options: ``url`` (required, ``amqp://user:password@host:5672/vhost`` or ``amqps://...``),
``ordered_destinations`` (destinations or exchange names the operator declares per-key ordered,
see below), ``max_outstanding`` (unconfirmed publishes before ``publish`` waits, default
5,000), ``connect_timeout``, ``close_timeout`` and ``reconnect_interval`` (seconds).
Destinations are described in ``relayer.transports.rabbitmq.routes``.

Every message is persistent, published with ``mandatory=True`` (an unroutable message fails
with a non-retryable SendError instead of being dropped), carries the outbox id as AMQP
``message_id`` and in the ``relayer-message-id`` header, and the ordering key in the
``relayer-ordering-key`` header. Publishes are written on one channel in the order they are
queued (a publish to an exchange not yet checked waits for the check) and many confirms may be
outstanding. The publishes of one event-loop turn go out together (in writes of about 1 MiB),
and a publish waits while the last write is still in the socket buffer (backpressure).
RabbitMQ has no gapless guarantee, so ``pipelines_within_key`` is False: the relay waits for a
key's confirm before publishing its next row.

Per-key order is native for a single queue (``/queue``: checked with a passive declare). An
exchange keeps it only if every key reaches one queue, e.g. a consistent-hash exchange whose
queues have single-active-consumer; AMQP cannot show an exchange's type or bindings (only the
management API can), so such destinations are listed in ``ordered_destinations``.

Connections are plain, not robust: when one is lost, aiormq fails every outstanding confirm
(the relay keeps those rows and retries) and the next publish reconnects. A robust connection
would restore channels in the background but not replay publishes, and its half-restored
states are harder to reason about than "failed, retried, reconnected".
"""

from relayer.transports.rabbitmq.transport import RabbitMQTransport

__all__ = ["RabbitMQTransport"]
