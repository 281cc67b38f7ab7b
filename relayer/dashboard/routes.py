"""The dashboard's pages and changes. Reads are GET; every change is a POST that passes
``Access.actor_of_change`` (token, same origin, CSRF) and writes an audit row."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from markupsafe import Markup
from starlette.datastructures import FormData, QueryParams
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from relayer.cli.queue_command import parse_limit
from relayer.dashboard import actions, reads
from relayer.dashboard.app import VIEWS, Dashboard, StoreContext
from relayer.dashboard.security import SESSION_COOKIE, SESSION_SECONDS
from relayer.errors import ConfigurationError, RelayerError
from relayer.operations import parked
from relayer.redact import redact

logger = logging.getLogger(__name__)

LOGIN_DELAY = 1.0  # seconds a wrong token waits (slows guessing)
DROP_SCOPES = {"key": parked.DROP, "head": parked.DROP_HEAD}


class BadRequest(Exception):
    """A parameter a user can get wrong: answered 400 with one line naming it."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        super().__init__(f"{field}: {value!r} {rule}")


def routes(dashboard: Dashboard) -> list[Route]:
    d = dashboard
    access = d.access

    async def context_of(request: Request) -> StoreContext:
        name = request.path_params["store"]
        context = await d.stores.get(name)
        if context is None:
            template = d.stores.template_of(name)
            raise BadRequest(
                "store",
                name,
                "is not served by this dashboard"
                + (f": the source of template {template} does not list it" if template else ""),
            )
        return context

    def html(template: str, request: Request, status: int = 200, **values: Any) -> HTMLResponse:
        viewer = access.viewer(request)
        body = d.render(
            template,
            request=request,
            viewer=viewer,
            access=access,
            stores=d.stores.nav,
            fleet_link=d.has_fleet,
            interval=d.interval,
            **values,
        )
        return HTMLResponse(body, status_code=status)

    async def page(request: Request, view: str, template: str, **values: Any) -> Response:
        context = await context_of(request)
        viewer = access.viewer(request)
        version, fragments = await d.live_fragments(context, view, viewer)
        return html(
            template,
            request,
            view=view,
            store=context.store,
            sampler=context.sampler,
            snapshot=context.sampler.snapshot,
            live_version=version,
            fragments={name: Markup(text) for name, text in fragments.items()},
            **values,
        )

    def guarded(handler: Any) -> Any:
        """Refuses a foreign Host; answers a user's mistake (400) or an unreachable store (503)
        with one line."""

        async def wrapper(request: Request) -> Response:
            refusal = access.host_refusal(request)  # DNS rebinding: only our own names
            if refusal:
                return _message(d, request, 403, refusal)
            try:
                response: Response = await handler(request)
                return response
            except BadRequest as exc:
                return _message(d, request, 400, str(exc))
            except ConfigurationError as exc:
                return _message(d, request, 400, str(exc))
            except (psycopg.Error, OSError, RelayerError) as exc:
                text = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))
                return _message(d, request, 503, f"cannot read the store: {text}")

        return wrapper

    async def home(request: Request) -> Response:
        if d.has_fleet:
            return RedirectResponse("/fleet", status_code=303)
        return RedirectResponse(f"/s/{d.stores.configured[0]}/overview", status_code=303)

    async def fleet(request: Request) -> Response:
        view = await d.fleet()
        return html(
            "fleet.html",
            request,
            fleet=True,
            summaries=view.summaries,
            served=view.served,
            read_at=view.read_at,
            fleet_templates=list(d.stores.templates),
            open_on_demand=d.stores.on_demand,
            open_stores=d.stores.open_stores,
        )

    async def overview(request: Request) -> Response:
        return await page(request, "overview", "overview.html")

    async def lanes(request: Request) -> Response:
        return await page(request, "lanes", "lanes.html")

    async def lane(request: Request) -> Response:
        context = await context_of(request)
        number = _int("lane", request.path_params["lane"], 0, context.store.lanes - 1)
        async with context.pool.connection() as conn:
            detail = await reads.lane_detail(conn, context.store, number, context.sampler.snapshot)
        if request.headers.get("hx-request"):
            return html("_lane_detail.html", request, store=context.store, detail=detail)
        return await page(request, "lanes", "lanes.html", detail=detail)

    async def parked_list(request: Request) -> Response:
        context = await context_of(request)
        where = _parked_filter(request.query_params, context)
        as_of = _time("as_of", request.query_params.get("as_of"))
        after_at = _time("after_at", request.query_params.get("after_at"))
        after = (after_at, request.query_params.get("after_key", "")) if after_at else None
        async with context.pool.connection() as conn:
            listing = await reads.parked_page(conn, context.store, where, as_of=as_of, after=after)
        return await page(request, "parked", "parked.html", where=where, listing=listing)

    async def parked_key(request: Request) -> Response:
        context = await context_of(request)
        key = _required(request.query_params, "key")
        async with context.pool.connection() as conn:
            detail = await reads.key_detail(conn, context.store, key)
        return await page(request, "parked", "key.html", key=key, detail=detail)

    async def row_body(request: Request) -> Response:
        context = await context_of(request)
        number = _int("lane", request.query_params.get("lane"), -1, context.store.lanes - 1)
        row_id = _uuid("id", request.query_params.get("id"))
        async with context.pool.connection() as conn:
            body = await reads.row_body(conn, context.store, number, row_id)
        return html("_body.html", request, body=body, cap=reads.BODY_CAP)

    async def confirm_key(request: Request) -> Response:
        context = await context_of(request)
        key = _required(request.query_params, "key")
        action = _choice("action", request.query_params.get("action"), ("redrive", "drop"))
        async with context.pool.connection() as conn:
            detail = await reads.key_detail(conn, context.store, key)
        return html(
            "_confirm_key.html", request, store=context.store, key=key, action=action, detail=detail
        )

    async def change_key(request: Request) -> Response:
        context = await context_of(request)
        actor, refusal = access.actor_of_change(request)
        if actor is None:
            return _message(d, request, 403, refusal)
        form = await request.form()
        key = _required(form, "key")
        action = _choice("action", form.get("action"), ("redrive", "drop"))
        if action == "drop":
            scope = _choice("scope", form.get("scope") or "key", tuple(DROP_SCOPES))
            action = DROP_SCOPES[scope]
        guard = parked.Guard(
            _uuid("head_id", form.get("head_id")),
            _int("attempts", form.get("attempts"), 0, 2**31 - 1),
        )
        reason = actions.clean_reason(_text(form.get("reason")))
        outcome = await actions.change_key(
            context.pool, context.store, key, action, guard=guard, actor=actor, reason=reason
        )
        context.sampler.refresh_soon()
        status = 200 if outcome.applied else 409
        response = html(
            "_key_result.html", request, status, store=context.store, outcome=outcome, guard=guard
        )
        if outcome.applied:
            response.headers["HX-Trigger"] = "relayer-changed"
        return response

    async def confirm_bulk(request: Request) -> Response:
        context = await context_of(request)
        where = _parked_filter(request.query_params, context)
        action = _choice("action", request.query_params.get("action"), ("redrive", "drop"))
        async with context.pool.connection() as conn:
            listing = await reads.parked_page(conn, context.store, where, limit=5)
        return html(
            "_confirm_bulk.html",
            request,
            store=context.store,
            where=where,
            action=action,
            listing=listing,
            confirm_at=actions.BULK_CONFIRM,
        )

    async def start_bulk(request: Request) -> Response:
        context = await context_of(request)
        actor, refusal = access.actor_of_change(request)
        if actor is None:
            return _message(d, request, 403, refusal)
        form = await request.form()
        where = _parked_filter(form, context)
        action = _choice("action", form.get("action"), ("redrive", "drop"))
        expected = _int("expected", form.get("expected"), 0, 2**31 - 1)
        if expected >= actions.BULK_CONFIRM:
            typed = _text(form.get("typed")) or ""
            if typed.replace(",", "").strip() != str(expected):
                raise BadRequest(
                    "typed", typed, f"must be the number of keys, {expected}, to confirm"
                )
        run = d.bulk.start(
            context.pool,
            context.store,
            action,
            where,
            actor=actor,
            reason=actions.clean_reason(_text(form.get("reason"))),
            expected=expected,
        )
        return html("_bulk.html", request, store=context.store, run=run)

    async def bulk_progress(request: Request) -> Response:
        context = await context_of(request)
        run = d.bulk.runs.get(_int("run", request.path_params["run"], 1, 2**31 - 1))
        if run is None or run.store != context.store.name:
            raise BadRequest("run", request.path_params["run"], "is not a bulk run of this store")
        if run.finished:
            context.sampler.refresh_soon()
        return html("_bulk.html", request, store=context.store, run=run)

    async def cancel_bulk(request: Request) -> Response:
        context = await context_of(request)
        actor, refusal = access.actor_of_change(request)
        if actor is None:
            return _message(d, request, 403, refusal)
        run = d.bulk.cancel(_int("run", request.path_params["run"], 1, 2**31 - 1))
        if run is None or run.store != context.store.name:
            raise BadRequest("run", request.path_params["run"], "is not a bulk run of this store")
        return html("_bulk.html", request, store=context.store, run=run)

    async def queues(request: Request) -> Response:
        return await page(request, "queues", "queues.html")

    async def change_queue(request: Request) -> Response:
        context = await context_of(request)
        actor, refusal = access.actor_of_change(request)
        if actor is None:
            return _message(d, request, 403, refusal)
        form = await request.form()
        action = _choice("action", form.get("action"), ("pause", "resume", "limit"))
        which = _text(form.get("queue")) or context.store.name
        queue = None if which == "*" else which
        limit = parse_limit(_text(form.get("limit")) or "") if action == "limit" else None
        if action == "limit" and queue is None:
            raise BadRequest("queue", "*", "has no limit; name one queue")
        reason = actions.clean_reason(_text(form.get("reason")))
        await actions.change_queue(
            context.pool,
            context.store,
            action,
            queue=queue,
            actor=actor,
            reason=reason,
            limit=limit,
        )
        context.sampler.refresh_soon()
        response = html(
            "_queue_result.html",
            request,
            action=action,
            queue=queue,
            limit=limit,
            actor=actions.queue_actor(actor),
            reason=reason,
        )
        response.headers["HX-Trigger"] = "relayer-changed"
        return response

    async def health(request: Request) -> Response:
        return await page(request, "health", "health.html")

    async def audit(request: Request) -> Response:
        context = await context_of(request)
        text = _text(request.query_params.get("text"))
        action = _text(request.query_params.get("action"))
        async with context.pool.connection() as conn:
            entries = await reads.audit_entries(conn, context.store, text=text, action=action)
        return await page(
            request, "audit", "audit.html", entries=entries, text=text or "", action=action or ""
        )

    async def events(request: Request) -> Response:
        context = await context_of(request)
        view = _choice("view", request.query_params.get("view"), VIEWS)
        return d.stream(request, context, view)

    async def login_form(request: Request) -> Response:
        return html("login.html", request, store=None, next=_next(request.query_params))

    async def login(request: Request) -> Response:
        refusal = access.host_refusal(request) or access.origin_refusal(request)
        if refusal:
            return _message(d, request, 403, refusal)
        form = await request.form()
        target = _next(form)
        if access.read_only:
            return _message(d, request, 403, "this dashboard is read-only: nothing to sign in to")
        token = access.match(_text(form.get("token")) or "")
        if token is None:
            await asyncio.sleep(LOGIN_DELAY)
            logger.warning(
                "dashboard: a sign-in with a wrong token was refused; if it was not you, "
                "check who can reach the dashboard",
                extra={"action": "dashboard_login_refused"},
            )
            return html("login.html", request, 403, store=None, next=target, failed=True)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            access.new_session(token),
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    async def logout(request: Request) -> Response:
        refusal = access.host_refusal(request) or access.origin_refusal(request)
        if refusal:
            return _message(d, request, 403, refusal)
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    def route(path: str, handler: Any, methods: tuple[str, ...] = ("GET",)) -> Route:
        return Route(path, guarded(handler), methods=list(methods))

    post = ("POST",)
    return [
        route("/", home),
        route("/login", login_form),
        route("/login", login, post),
        route("/logout", logout, post),
        route("/fleet", fleet),
        route("/s/{store}/overview", overview),
        route("/s/{store}/lanes", lanes),
        route("/s/{store}/lanes/{lane}", lane),
        route("/s/{store}/parked", parked_list),
        route("/s/{store}/parked/key", parked_key),
        route("/s/{store}/parked/body", row_body),
        route("/s/{store}/parked/confirm", confirm_key),
        route("/s/{store}/parked/change", change_key, post),
        route("/s/{store}/parked/bulk/confirm", confirm_bulk),
        route("/s/{store}/parked/bulk", start_bulk, post),
        route("/s/{store}/parked/bulk/{run}", bulk_progress),
        route("/s/{store}/parked/bulk/{run}/cancel", cancel_bulk, post),
        route("/s/{store}/queues", queues),
        route("/s/{store}/queues/change", change_queue, post),
        route("/s/{store}/health", health),
        route("/s/{store}/audit", audit),
        route("/s/{store}/events", events),
    ]


def _message(d: Dashboard, request: Request, status: int, text: str) -> HTMLResponse:
    template = "_message.html" if request.headers.get("hx-request") else "message.html"
    body = d.render(
        template,
        request=request,
        status=status,
        text=text,
        viewer=d.access.viewer(request),
        access=d.access,
        stores=d.stores.nav,
        fleet_link=d.has_fleet,
        interval=d.interval,
        store=None,
        view=None,
    )
    return HTMLResponse(body, status_code=status)


def _parked_filter(params: QueryParams | FormData, context: StoreContext) -> reads.ParkedFilter:
    lane = params.get("lane")
    state = _text(params.get("state"))
    if state is not None and state not in reads.PARKED_STATES:
        raise BadRequest("state", state, f"must be one of {', '.join(reads.PARKED_STATES)}")
    return reads.ParkedFilter(
        error=_text(params.get("error")),
        lane=_int("lane", lane, 0, context.store.lanes - 1) if _text(lane) else None,
        destination=_text(params.get("destination")),
        transport=_text(params.get("transport")),
        state=state,
    )


def _text(value: Any) -> str | None:
    if value is None or not isinstance(value, str):
        return None
    return value.strip() or None


def _required(params: QueryParams | FormData, name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or value == "":
        raise BadRequest(name, value, "is required")
    return value


def _int(name: str, value: Any, low: int, high: int) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise BadRequest(name, value, f"must be an integer from {low} to {high}") from None
    if not low <= number <= high:
        raise BadRequest(name, value, f"must be an integer from {low} to {high}")
    return number


def _uuid(name: str, value: Any) -> UUID:
    try:
        return UUID(str(value))
    except ValueError:
        raise BadRequest(name, value, "must be a row id (a UUID)") from None


def _time(name: str, value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(name, value, "must be an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise BadRequest(name, value, "must carry its UTC offset")
    return moment


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise BadRequest(name, value, f"must be one of {', '.join(choices)}")
    return str(value)


def _next(params: QueryParams | FormData) -> str:
    """Where to go after signing in: a path of this dashboard, never another site."""
    target = params.get("next")
    if isinstance(target, str) and target.startswith("/") and not target.startswith("//"):
        return target
    return "/"
