"""What an SQS answer (or none) means to the relay. This module does not touch the client.

- The whole request failed: a queue that does not exist or that the credentials may not send
  to is the row's fault (its key parks with what to fix); throttling, 5xx, refused
  credentials, timeouts and connection errors are SQS's (no attempt is counted). Any other
  refusal of a batch is about its content: the caller sends its entries one by one, so that a
  bad one is the only one refused.
- One entry of a batch failed (``Failed``): the row's fault when SQS says the sender is at
  fault, SQS's otherwise.
"""

from __future__ import annotations

from typing import Any

from relayer.redact import redact
from relayer.transports.base import DestinationError, SendError, TransportUnavailableError

MISSING_QUEUE = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
DENIED = frozenset({"AccessDenied", "AccessDeniedException", "KMS.AccessDeniedException"})
CREDENTIALS = frozenset(
    {
        "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch",
        "ExpiredToken", "ExpiredTokenException", "IncompleteSignature", "InvalidSecurity",
        "MissingAuthenticationToken", "AuthFailure", "InvalidAccessKeyId",
    }
)  # fmt: skip
LATER = frozenset(
    {
        "Throttling", "ThrottlingException", "RequestThrottled", "ServiceUnavailable",
        "InternalError", "InternalFailure", "KmsThrottled", "KMS.ThrottlingException",
        "RequestTimeout", "AWS.SimpleQueueService.ServiceUnavailable",
    }
)  # fmt: skip


def code_of(error: BaseException) -> tuple[str, str, int] | None:
    """(code, message, HTTP status) of an AWS error answer; None if ``error`` is not one."""
    response: Any = getattr(error, "response", None)
    if not isinstance(response, dict) or "Error" not in response:
        return None
    details = response.get("Error") or {}
    code = str(details.get("Code") or details.get("QueryErrorCode") or "")
    status = int((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
    return code, redact(str(details.get("Message") or "")), status


def missing(destination: str) -> str:
    return (
        f"SQS queue {destination!r} does not exist; create it (a FIFO queue, its name ending "
        "in .fifo, for rows with an ordering key) or fix the destination"
    )


def denied(destination: str, said: str) -> str:
    return (
        f"not allowed to use SQS queue {destination!r} ({said}); grant the relay's "
        "credentials sqs:GetQueueUrl, sqs:GetQueueAttributes and sqs:SendMessage on it (and "
        "kms:GenerateDataKey for an encrypted queue), or fix the destination"
    )


def unavailable(destination: str, error: BaseException) -> TransportUnavailableError | None:
    """The error if SQS (or the way to it) is at fault, not the request; else None."""
    answer = code_of(error)
    if answer is None:  # no answer: refused, reset, timed out
        return TransportUnavailableError(
            f"SQS did not answer a request for queue {destination!r} ({type(error).__name__}: "
            f"{redact(str(error))}); the messages will be sent again (no attempt is counted)"
        )
    code, said, status = answer
    if code in CREDENTIALS:
        return TransportUnavailableError(
            f"SQS refused the transport's credentials ({code}: {said}); check access_key_id, "
            "secret_access_key, session_token or the environment's AWS credentials; the "
            "messages wait (no attempt is counted)"
        )
    if code in LATER or status >= 500:
        return TransportUnavailableError(
            f"SQS cannot take messages for queue {destination!r} now ({code or status}: "
            f"{said}); they will be sent again (no attempt is counted)"
        )
    return None


def lookup_failed(destination: str, error: BaseException) -> Exception:
    """The relay's error for a queue lookup (GetQueueUrl, GetQueueAttributes) that failed."""
    found = unavailable(destination, error)
    if found is not None:
        return found
    answer = code_of(error)
    assert answer is not None
    code, said, _ = answer
    if code in MISSING_QUEUE:
        return DestinationError(missing(destination))
    if code in DENIED:
        return DestinationError(denied(destination, f"{code}: {said}"))
    return DestinationError(
        f"SQS refused to describe queue {destination!r} ({code}: {said}); fix the destination"
    )


def request_failed(destination: str, error: BaseException) -> Exception | None:
    """The relay's error for every entry of a batch SQS refused as a whole, or None when the
    refusal is about the batch's content (send the entries one by one)."""
    found = unavailable(destination, error)
    if found is not None:
        return found
    answer = code_of(error)
    assert answer is not None
    code, said, _ = answer
    if code in MISSING_QUEUE:
        return SendError(missing(destination), retryable=False)
    if code in DENIED:
        return SendError(denied(destination, f"{code}: {said}"), retryable=False)
    return None


def refused_alone(destination: str, error: BaseException) -> SendError:
    """One message sent alone and refused for its content."""
    answer = code_of(error)
    code, said = (answer[0], answer[1]) if answer is not None else (type(error).__name__, "")
    return SendError(
        f"SQS refused the message for queue {destination!r} ({code}: {said}); fix the row, "
        "then redrive the key",
        retryable=False,
    )


def entry_failed(destination: str, failure: dict[str, Any]) -> Exception:
    """One ``Failed`` entry of a SendMessageBatch answer."""
    code = str(failure.get("Code") or "")
    said = redact(str(failure.get("Message") or ""))
    if failure.get("SenderFault"):
        return SendError(
            f"SQS refused the message for queue {destination!r} ({code}: {said}); fix the "
            "row, then redrive the key",
            retryable=False,
        )
    return TransportUnavailableError(
        f"SQS failed to store a message for queue {destination!r} ({code}: {said}); it will "
        "be sent again (no attempt is counted)"
    )


def standard_queue(destination: str) -> SendError:
    return SendError(
        f"SQS queue {destination!r} is a standard queue, which does not keep per-key order; "
        "send rows with an ordering key to a FIFO queue (name ending in .fifo), then redrive "
        "the key",
        retryable=False,
    )


def still_waiting(message_id: str, destination: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"an earlier copy of message {message_id} for SQS queue {destination!r} still waits "
        "for SQS's answer (it is slow or stalled); this copy will be sent again after it"
    )


def closed(name: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"SQS transport {name!r} closed before SQS answered; the message will be sent again"
    )
