"""The dashboard's routes: each path with its handler (pages.py, parked_pages.py,
sessions.py). Reads are GET; every change is a POST that passes ``Access.actor_of_change``
(token, same origin, CSRF) and writes an audit row.

Every handler is guarded alike: a foreign Host or a change the request may not make is refused
(403), a parameter a user got wrong (a NUL byte in any of them too) answered 400 and a store
that cannot be read 503, each with one line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relayer.dashboard import pages, parked_pages, sessions
from relayer.dashboard.params import BadRequest, Refused, without_nul
from relayer.dashboard.site import Dashboard
from relayer.errors import ConfigurationError, RelayerError
from relayer.redact import redact

Handler = Callable[[Dashboard, Request], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]
POST = ("POST",)

PATHS: tuple[tuple[str, Handler, tuple[str, ...]], ...] = (
    ("/", pages.home, ()),
    ("/login", sessions.login_form, ()),
    ("/login", sessions.login, POST),
    ("/logout", sessions.logout, POST),
    ("/fleet", pages.fleet, ()),
    ("/s/{store}/overview", pages.overview, ()),
    ("/s/{store}/lanes", pages.lanes, ()),
    ("/s/{store}/lanes/{lane}", pages.lane, ()),
    ("/s/{store}/parked", parked_pages.parked_list, ()),
    ("/s/{store}/parked/key", parked_pages.parked_key, ()),
    ("/s/{store}/parked/body", parked_pages.body, ()),
    ("/s/{store}/parked/confirm", parked_pages.confirm_key, ()),
    ("/s/{store}/parked/change", parked_pages.change_key, POST),
    ("/s/{store}/parked/bulk/confirm", parked_pages.confirm_bulk, ()),
    ("/s/{store}/parked/bulk", parked_pages.start_bulk, POST),
    ("/s/{store}/parked/bulk/{run}", parked_pages.bulk_progress, ()),
    ("/s/{store}/parked/bulk/{run}/cancel", parked_pages.cancel_bulk, POST),
    ("/s/{store}/queues", pages.queues, ()),
    ("/s/{store}/queues/change", pages.change_queue, POST),
    ("/s/{store}/health", pages.health, ()),
    ("/s/{store}/audit", pages.audit, ()),
    ("/s/{store}/events", pages.events, ()),
)


def routes(dashboard: Dashboard) -> list[Route]:
    """Every path of the dashboard, its handler guarded and given ``dashboard``."""
    return [
        Route(path, guarded(dashboard, handler), methods=list(methods or ("GET",)))
        for path, handler, methods in PATHS
    ]


def guarded(d: Dashboard, handler: Handler) -> Endpoint:
    """``handler`` for ``d``, refusing a foreign Host and answering a user's mistake (400) or
    an unreachable store (503) with one line."""

    async def endpoint(request: Request) -> Response:
        refusal = d.access.host_refusal(request)  # DNS rebinding: only our own names
        if refusal:
            return d.message(request, 403, refusal)
        try:
            without_nul(request.query_params)
            if request.method == "POST":
                without_nul(await request.form())  # read once: the handler gets the same form
            return await handler(d, request)
        except Refused as exc:
            return d.message(request, 403, str(exc))
        except (BadRequest, ConfigurationError) as exc:
            return d.message(request, 400, str(exc))
        except RelayerError as exc:
            text = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))
            return d.message(request, 503, f"cannot read the store: {text}")

    return endpoint
