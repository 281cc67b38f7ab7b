"""Who may change what, and the checks every response and every change passes.

- Without a token the dashboard is read-only: no buttons render and every POST gets 403.
- Tokens come from ``--token-file``, ``RELAYER_DASHBOARD_TOKEN`` or ``--token`` (``NAME:SECRET``
  names the audit trail's actor). A presented token is compared with every configured one in
  constant time. The login form swaps it for a signed, HttpOnly, SameSite=Strict cookie that
  also carries the session's CSRF token; scripts may send ``Authorization: Bearer TOKEN``.
- A change is a POST from the same origin: ``Sec-Fetch-Site`` (when the browser sends it) must
  be ``same-origin``, ``Origin`` (when sent) must be this dashboard, the ``Host`` must be one it
  serves (DNS rebinding), and a cookie session must echo its CSRF token in a header.
- Every response carries a CSP with ``script-src 'self'`` (no inline script anywhere).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relayer.errors import ConfigurationError

SESSION_COOKIE = "relayer_dashboard"
CSRF_HEADER = "x-relayer-csrf"
SESSION_SECONDS = 12 * 3600
MIN_TOKEN_LENGTH = 16
_NAMED = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.@-]{0,39}):(?P<secret>.+)")
TOKEN_RULE = (
    f"a token is at least {MIN_TOKEN_LENGTH} characters, optionally prefixed with a name "
    "('alice:SECRET') for the audit trail"
)

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make Origin "null"
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


@dataclass(frozen=True, slots=True)
class Token:
    name: str
    digest: bytes  # sha256 of the secret: equal lengths for the constant-time comparison

    def __repr__(self) -> str:
        return f"Token(name={self.name!r})"


def parse_token(field: str, text: str) -> Token:
    """``SECRET`` or ``NAME:SECRET`` (one line of a token file, the variable or --token)."""
    text = text.strip()
    match = _NAMED.fullmatch(text)
    name, secret = (match["name"], match["secret"]) if match else ("operator", text)
    if len(secret) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(field, "***", TOKEN_RULE)
    return Token(name, hashlib.sha256(secret.encode("utf-8")).digest())


class Access:
    """The dashboard's tokens, its mode and the hosts it answers to."""

    def __init__(
        self, tokens: Iterable[Token], *, read_only: bool, allowed_hosts: Iterable[str]
    ) -> None:
        self.tokens = tuple(tokens)
        self.read_only = read_only or not self.tokens
        self.allowed_hosts = frozenset(host.lower() for host in allowed_hosts)
        self._signer = URLSafeTimedSerializer(secrets.token_bytes(32), salt="relayer-dashboard")

    def match(self, presented: str) -> Token | None:
        """The token ``presented`` equals, compared with every token in constant time."""
        digest = hashlib.sha256(presented.encode("utf-8")).digest()
        found: Token | None = None
        for token in self.tokens:
            if hmac.compare_digest(digest, token.digest):
                found = token
        return found

    # -- sessions -------------------------------------------------------------------------

    def new_session(self, token: Token) -> str:
        return self._signer.dumps({"actor": token.name, "csrf": secrets.token_urlsafe(24)})

    def session(self, request: Request) -> Session | None:
        cookie = request.cookies.get(SESSION_COOKIE)
        if not cookie:
            return None
        try:
            data = self._signer.loads(cookie, max_age=SESSION_SECONDS)
        except BadSignature:
            return None
        if not isinstance(data, dict):
            return None
        return Session(str(data.get("actor")), str(data.get("csrf")))

    def viewer(self, request: Request) -> Viewer:
        """Who is looking: may they act, and which CSRF token must their changes carry."""
        if self.read_only:
            return Viewer(None, None)
        session = self.session(request)
        if session is not None:
            return Viewer(session.actor, session.csrf)
        return Viewer(None, None)

    # -- checks ---------------------------------------------------------------------------

    def host_refusal(self, request: Request) -> str | None:
        host = request.headers.get("host", "").lower()
        if host not in self.allowed_hosts:
            return (
                f"host {host!r} is not one this dashboard serves; open it by its address, or "
                "start it with --allow-host NAME"
            )
        return None

    def origin_refusal(self, request: Request) -> str | None:
        """Why a POST is not same-origin (None: it is)."""
        fetch_site = request.headers.get("sec-fetch-site")
        if fetch_site is not None and fetch_site != "same-origin":
            return f"cross-site request refused (Sec-Fetch-Site: {fetch_site})"
        origin = request.headers.get("origin")
        if origin is not None:
            host = request.headers.get("host", "").lower()
            if origin.lower() not in (f"http://{host}", f"https://{host}"):
                return "cross-origin request refused (Origin does not match this dashboard)"
        return None

    def actor_of_change(self, request: Request) -> tuple[str | None, str]:
        """(actor, "") for an allowed change, or (None, the reason it is refused)."""
        if self.read_only:
            return None, "this dashboard is read-only (started without a token, or --read-only)"
        refusal = self.host_refusal(request) or self.origin_refusal(request)
        if refusal:
            return None, refusal
        authorization = request.headers.get("authorization", "")
        if authorization.lower().startswith("bearer "):
            token = self.match(authorization[7:].strip())
            if token is None:
                return None, "the token is not valid"
            return token.name, ""
        session = self.session(request)
        if session is None:
            return None, "sign in with the dashboard's token first"
        sent = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(sent.encode(), session.csrf.encode()):
            return None, "the request lacks this session's CSRF token; reload the page"
        return session.actor, ""


@dataclass(frozen=True, slots=True)
class Session:
    actor: str
    csrf: str


@dataclass(frozen=True, slots=True)
class Viewer:
    actor: str | None  # None: read-only for this viewer
    csrf: str | None

    @property
    def can_act(self) -> bool:
        return self.actor is not None


class SecurityHeaders:
    """Adds the CSP and the other headers to every response (streams included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers.extend(pair for pair in SECURITY_HEADERS if pair[0] not in names)
                if b"cache-control" not in names:
                    static = str(scope.get("path", "")).startswith("/static/")
                    headers.append(
                        (b"cache-control", b"public, max-age=3600" if static else b"no-store")
                    )
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


def loopback_hosts(host: str, port: int) -> set[str]:
    """The Host headers a dashboard bound to ``host`` answers to by default."""
    names = {"127.0.0.1", "localhost", "[::1]"}
    if host not in ("0.0.0.0", "::", ""):
        names.add(f"[{host}]" if ":" in host else host)
    return {f"{name}:{port}" for name in names} | ({*names} if port == 80 else set())
