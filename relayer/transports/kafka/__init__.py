"""Kafka through confluent-kafka (librdkafka): an idempotent, gapless, pipelined producer.

Options are librdkafka settings, passed through unchanged (``bootstrap.servers``, SASL, SSL,
``linger.ms``...); underscores may stand for dots (``bootstrap_servers``) so that environment
variables can carry them. A few are fixed because per-key order depends on them:
``acks=all``, ``enable.idempotence=true``, ``enable.gapless.guarantee=true`` (a failed message
fails every later message of its partition), ``max.in.flight.requests.per.connection`` <= 5,
and ``message.timeout.ms`` above the relay's batch deadline (the gapless guarantee does not
cover that timeout). ``allow.auto.create.topics`` defaults to false: a missing topic is an
error that says so, not a topic silently created with the broker's defaults.
Relayer's own options: ``close_timeout`` and ``metadata_timeout`` (seconds).

librdkafka's errors and log lines are logged under the transport's path
(``stores.<store>.transports.<name>``), at most once per cause per interval
(relayer.observability.throttle);
the warning that ``enable.gapless.guarantee`` is experimental is dropped (relayer sets it on
purpose) and connection failures are logged once, from the error callback.

The ordering key becomes the Kafka key; the outbox id and the key are also sent as the headers
``relayer-message-id`` and ``relayer-ordering-key``, so consumers read them the same way from
every transport. One background thread polls the producer; delivery reports are collected per
poll and handed to the event loop in one ``call_soon_threadsafe`` per batch.
"""

from relayer.transports.kafka.transport import KafkaTransport

__all__ = ["KafkaTransport"]
