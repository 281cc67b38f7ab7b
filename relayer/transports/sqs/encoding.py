"""One outbox row as an entry of ``SendMessageBatch``: body, attributes, group and
deduplication ids, and its size. This module does not import the AWS client.

- ``MessageBody``: the body as text when it is UTF-8 that SQS can carry (not empty, only the
  characters SQS allows); otherwise its base64, with the attribute ``relayer-body-encoding`` =
  ``base64``; an empty body is sent as ``-`` with ``relayer-body-encoding`` = ``empty``.
- Message attributes (String): ``relayer-message-id`` (the outbox id), ``relayer-ordering-key``
  (rows with a key) and, for rows with headers, ``relayer-headers``: the headers as one JSON
  object (SQS allows 10 attributes a message, no empty values and few characters in names,
  which application headers need not respect).
- FIFO queues: ``MessageDeduplicationId`` = the outbox id (SQS drops a copy sent again within
  5 minutes); ``MessageGroupId`` = the ordering key when SQS accepts it as one (at most 128
  characters among letters, digits and punctuation), else ``relayer-`` and the SHA-256 of the
  key (the same key always gets the same group); a row without a key gets its own id as group
  (no order to keep).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from relayer.transports.base import MESSAGE_ID_HEADER, ORDERING_KEY_HEADER, SendError

BODY_ENCODING_ATTRIBUTE = "relayer-body-encoding"
HEADERS_ATTRIBUTE = "relayer-headers"
# XML 1.0 characters, what SQS allows in a body and in String attributes.
_NOT_ALLOWED = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_GROUP_ID = re.compile(r"[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}")

Entry = dict[str, Any]


def body_text(body: bytes) -> tuple[str, str | None]:
    """The ``MessageBody`` of ``body`` and its encoding attribute (None: the text itself)."""
    if not body:
        return "-", "empty"
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return base64.b64encode(body).decode(), "base64"
    if _NOT_ALLOWED.search(text):
        return base64.b64encode(body).decode(), "base64"
    return text, None


def group_id(key: str) -> str:
    """The ``MessageGroupId`` of ordering key ``key`` (see the module docstring)."""
    if _GROUP_ID.fullmatch(key):
        return key
    return "relayer-" + hashlib.sha256(key.encode()).hexdigest()


def entry(
    message_id: str,
    key: str | None,
    body: bytes,
    headers: Mapping[str, str] | None,
    *,
    fifo: bool,
    max_bytes: int,
) -> tuple[Entry, int]:
    """The batch entry of one row (its ``Id`` is set by the batch) and its size as SQS counts
    it; a non-retryable SendError if SQS cannot carry it."""
    text, encoding = body_text(body)
    attributes: dict[str, dict[str, str]] = {
        MESSAGE_ID_HEADER: {"DataType": "String", "StringValue": message_id}
    }
    if key is not None:
        if _NOT_ALLOWED.search(key):
            raise SendError(
                f"ordering key {key[:40]!r} has characters SQS cannot carry in a message "
                "attribute; write the row with a key of printable characters",
                retryable=False,
            )
        attributes[ORDERING_KEY_HEADER] = {"DataType": "String", "StringValue": key}
    if headers:
        shown = json.dumps(dict(headers), ensure_ascii=False, separators=(",", ":"))
        if _NOT_ALLOWED.search(shown):
            raise SendError(
                "a header has characters SQS cannot carry in a message attribute (control "
                "characters); write the row without them",
                retryable=False,
            )
        attributes[HEADERS_ATTRIBUTE] = {"DataType": "String", "StringValue": shown}
    if encoding is not None:
        attributes[BODY_ENCODING_ATTRIBUTE] = {"DataType": "String", "StringValue": encoding}
    size = len(text.encode()) + sum(
        len(name) + len(value["DataType"]) + len(value["StringValue"].encode())
        for name, value in attributes.items()
    )
    if size > max_bytes:
        encoded = " in base64" if encoding == "base64" else ""
        raise SendError(
            f"the message is {size:,} bytes as SQS counts it (body{encoded} "
            f"and attributes), over the queue's MaximumMessageSize of {max_bytes:,}; write a "
            "smaller body (or raise the queue's MaximumMessageSize), then redrive the key",
            retryable=False,
        )
    built: Entry = {"MessageBody": text, "MessageAttributes": attributes}
    if fifo:
        built["MessageDeduplicationId"] = message_id
        built["MessageGroupId"] = message_id if key is None else group_id(key)
    return built, size
