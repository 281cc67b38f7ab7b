"""Webhook destinations: which URL a row's destination names.

The transport's ``url`` is the base; a destination is a path below it (``""``: the base
itself; ``orders/paid`` or ``/orders/paid``: ``{url}/orders/paid``), with an optional
``?query``. A destination cannot leave the base: whole URLs, ``.`` and ``..`` segments and
characters a URL cannot carry unescaped are refused, so whoever writes outbox rows cannot send
them (signed) to another server. So every destination of a transport is on one server (its
endpoint), and one gate (relayer.transports.gate) bounds the requests under way to it
(``max_concurrency``). This module does not import the HTTP client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from relayer.redact import redact

# RFC 3986: a path's characters (pchar and '/'), a query's ('?' too); '%' must start an escape.
_PATH = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2}")
_QUERY = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2}")
MAX_DESTINATION_CHARS = 2_048
# Destinations remembered (resolved or refused); beyond that they are resolved each time.
_REMEMBERED = 10_000


class DestinationProblem(ValueError):
    """A destination that names no URL under the transport's ``url``."""


@dataclass(frozen=True, slots=True)
class Target:
    """The URL a destination names, and how errors show it (a password in it masked)."""

    url: str
    shown: str


class Endpoints:
    """The URLs of one transport's destinations, resolved once (a little)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._by_destination: dict[str, Target | DestinationProblem] = {}

    def target(self, destination: str) -> Target:
        """The URL ``destination`` names; DestinationProblem says what is wrong."""
        found = self._by_destination.get(destination)
        if found is None:
            try:
                url = self.resolve(destination)
            except DestinationProblem as exc:
                found = exc
            else:
                found = Target(url, redact(url))
            if len(self._by_destination) < _REMEMBERED:
                self._by_destination[destination] = found
        if isinstance(found, DestinationProblem):
            raise found
        return found

    def resolve(self, destination: str) -> str:
        """The URL of ``destination`` under the base URL (see the module docstring)."""
        path, question, query = destination.partition("?")
        if "://" in destination:
            raise DestinationProblem(
                _explain(destination, "is a whole URL; a destination is a path under the url")
            )
        if len(destination) > MAX_DESTINATION_CHARS:
            raise DestinationProblem(
                _explain(destination[:40] + "...", f"is over {MAX_DESTINATION_CHARS:,} characters")
            )
        segments = path.strip("/").split("/")
        if any(segment in (".", "..") for segment in segments):
            raise DestinationProblem(
                _explain(destination, "has a '.' or '..' segment, which could leave the url")
            )
        if _PATH.sub("", path) or _QUERY.sub("", query):
            raise DestinationProblem(
                _explain(destination, "has characters a URL cannot carry unescaped (escape them "
                         "as %XX)")
            )  # fmt: skip
        relative = path.strip("/")
        url = f"{self.base_url}/{relative}" if relative else self.base_url
        return url + question + query


def _explain(destination: str, problem: str) -> str:
    return (
        f"webhook destination {destination!r} {problem}; write a path under the transport's "
        "url ('' for the url itself, 'orders/paid', optionally with '?query'), then fix the "
        "destination of the rows"
    )
