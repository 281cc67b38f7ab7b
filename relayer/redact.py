"""Keep secrets out of log lines, error messages and reprs.

Every string that may carry a DSN, a broker URL or a transport setting passes through
:func:`redact` before it is shown to anyone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MASK = "***"

# user:password@ in any URL (postgresql://, amqp://, amqps://, sasl urls ...). The password
# may hold spaces (libpq refuses them, but the text being shown may be that refusal).
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)(?P<secret>[^@/]*)(?=@)")
# password=... in a libpq conninfo string or in a URL query (?password=...&). A value is quoted
# ('two words', with \' for a quote; an unterminated quote runs to the end), double-quoted
# (not libpq's quoting, but a user's attempt at it), or unquoted with backslash escapes
# (two\ words): each form is masked whole, so no word of a password with spaces shows.
_KEYWORD_SECRET = re.compile(
    r"(?P<head>\b(?:password|passwd|pass|sslpassword|secret|token|api[_-]?key)\s*=\s*)"
    r"(?P<secret>'(?:[^'\\]|\\.)*(?:'|\\?$)"
    r"|\"(?:[^\"\\]|\\.)*(?:\"|\\?$)"
    r"|(?:[^\s&;\\]|\\.|\\$)*)",
    re.IGNORECASE,
)

# Generous on purpose: a misspelled name (sasl.passowrd, client.secert) is masked as well, since
# the error that reports the misspelling shows the settings.
_SECRET_NAME = re.compile(
    r"(pass|pasw|secr|secer|token|credential|private[._-]?key|api[._-]?key|"
    r"sasl\.oauthbearer\.config|ssl\.key\.pem|ssl\.keystore)",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """Return ``text`` with every password-like part replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    return _KEYWORD_SECRET.sub(lambda m: m.group("head") + MASK, text)


def is_secret_name(name: str) -> bool:
    """True for setting names whose values are secrets (``sasl.password``, ``api_key``...)."""
    return bool(_SECRET_NAME.search(name))


def redact_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``values`` fit for display: secret-named values masked, strings redacted."""
    shown: dict[str, Any] = {}
    for name, value in values.items():
        if is_secret_name(name):
            shown[name] = MASK
        elif isinstance(value, str):
            shown[name] = redact(value)
        elif isinstance(value, Mapping):
            shown[name] = redact_mapping(value)
        else:
            shown[name] = value
    return shown
