"""HTTP webhooks through httpx: one signed POST per message, per-key order, an endpoint's
outage never counted against a row.

Options: ``url`` (required: the endpoint's base URL, ``https://host/path``), ``secret``
(required: ``whsec_`` and the base64 of a 24-64 byte key, as Standard Webhooks libraries make
them), ``max_concurrency`` (requests under way to the endpoint, and connections to it,
before ``publish`` waits; default 50), ``timeout`` (seconds for an answer, default 15),
``connect_timeout`` (default 5), ``close_timeout`` (default 30) and ``content_type`` (for rows
without a ``content-type`` header, default ``application/json``). Destinations are paths under
``url`` (relayer.transports.webhooks.endpoints).

Each message is POSTed with its body unchanged, the row's headers (values sent as UTF-8),
``relayer-message-id`` and ``relayer-ordering-key``, ``Idempotency-Key`` = the outbox id and a
Standard Webhooks signature (``webhook-id`` = the outbox id, ``webhook-timestamp``,
``webhook-signature``: relayer.transports.webhooks.signing). Redirects are not followed.

An endpoint keeps no order of its own, so ``pipelines_within_key`` is False: the relay posts a
key's next row only after the previous one got a 2xx, while other keys' requests go on
concurrently. What each answer means (relayer.transports.webhooks.outcomes): a 2xx delivers;
408, 425, 429, 5xx, timeouts and connection errors are the endpoint's fault (the rows wait, no
attempt is counted); any other 4xx parks the key with the status and the start of the answer.
A request still unanswered when the relay gave up on it (a batch deadline) is not sent twice:
the second copy waits, and the stall is said once (relayer.transports.stalls).

The secret never appears in a log line, an error or a repr.
"""

from relayer.transports.webhooks.transport import WebhookTransport

__all__ = ["WebhookTransport"]
