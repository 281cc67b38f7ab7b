"""Standard Webhooks signatures (https://www.standardwebhooks.com): what the receiver checks.

Each request carries ``webhook-id`` (the outbox id: the same on every retry, so the receiver
can deduplicate), ``webhook-timestamp`` (seconds since the epoch, of this attempt) and
``webhook-signature``: ``v1,`` and the base64 HMAC-SHA256, keyed with the secret, of
``"{webhook-id}.{webhook-timestamp}.{body}"``. The secret is configured as ``whsec_`` and its
base64 text, the form the standard's libraries print and read. This module keeps the key to
itself: nothing it returns or shows contains it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

from relayer.transports.options import TransportOptionError

SECRET_PREFIX = "whsec_"
# The standard's bounds on the decoded key.
MIN_KEY_BYTES = 24
MAX_KEY_BYTES = 64


class Signer:
    """Signs request bodies with one endpoint's secret."""

    __slots__ = ("_key",)

    def __init__(self, secret: str) -> None:
        self._key = parse_secret(secret)

    def __repr__(self) -> str:
        return "Signer(secret=***)"

    def signature(self, message_id: str, timestamp: int, body: bytes) -> str:
        """The ``webhook-signature`` header's value for one attempt."""
        signed = b"%s.%d.%s" % (message_id.encode(), timestamp, body)
        digest = hmac.new(self._key, signed, hashlib.sha256).digest()
        return "v1," + base64.b64encode(digest).decode()


def parse_secret(secret: str) -> bytes:
    """The key of a ``whsec_...`` secret; TransportOptionError (with the value masked) if it
    is not one."""
    rule = (
        f"must be {SECRET_PREFIX} followed by the base64 of a {MIN_KEY_BYTES}-{MAX_KEY_BYTES} "
        "byte key (the form Standard Webhooks libraries generate); generate one with: python -c "
        "\"import base64, os; print('whsec_' + base64.b64encode(os.urandom(32)).decode())\""
    )
    if not secret.startswith(SECRET_PREFIX):
        raise TransportOptionError("secret", secret, rule)
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise TransportOptionError("secret", secret, rule) from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise TransportOptionError("secret", secret, rule)
    return key
