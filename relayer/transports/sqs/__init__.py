"""Amazon SQS through aiobotocore: FIFO queues keep per-key order, messages go in batches of 10.

Options: ``region`` (required), ``endpoint_url`` (another SQS endpoint: a VPC endpoint,
LocalStack, moto), ``access_key_id``, ``secret_access_key`` and ``session_token`` (default:
the environment's credentials, as any AWS client finds them), ``queues`` (queues looked up at
start: each must exist), ``max_outstanding`` (messages handed over and not yet answered before
``publish`` waits, default 1,000), ``timeout``, ``connect_timeout`` and ``close_timeout``
(seconds). A destination is a queue name (``orders.fifo``) or a queue URL
(relayer.transports.sqs.queues).

Messages handed over in one event-loop turn go to SQS as ``SendMessageBatch`` requests of up to
10 entries per queue (relayer.transports.sqs.encoding says what an entry carries:
``MessageGroupId`` = the ordering key, ``MessageDeduplicationId`` = the outbox id, the id, key
and headers as message attributes). SQS stores or refuses each entry of a batch on its own, so
``pipelines_within_key`` is False: the relay hands a key's next row over only once SQS stored
the previous one, and a refused entry stops only its own key; the keys of a batch are all
different. A FIFO queue delivers each message group in the order SQS stored it, so per-key
order is native for FIFO queues; a standard queue keeps none, and the relay refuses to send
rows with an ordering key to one (``ordered_by_key`` is False), when it first sees it.

What an answer means is relayer.transports.sqs.outcomes': a missing queue or one the
credentials may not use parks the key; throttling, 5xx, refused credentials, timeouts and
connection errors count no attempt. The client does not retry (the relay does, with the same
deduplication id). A batch still unanswered when the relay gave up on it is not sent twice:
the copy waits and the stall is said once (relayer.transports.stalls). Credentials never
appear in a log line, an error or a repr.
"""

from relayer.transports.sqs.transport import SQSTransport

__all__ = ["SQSTransport"]
