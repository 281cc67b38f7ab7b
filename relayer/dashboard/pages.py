"""The dashboard's store pages and the Fleet page (GET), the queue change (POST) and each
page's event stream. Every handler takes the shared :class:`Dashboard` and the request; the
parked keys' pages are in parked_pages.py."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from relayer.dashboard import actions
from relayer.dashboard.params import BadRequest, choice, integer, text
from relayer.dashboard.site import VIEWS, Dashboard
from relayer.dashboard.views import lane_detail
from relayer.operations.queues import QUEUE_ACTIONS, parse_limit
from relayer.store.inspection import audit_entries


async def home(d: Dashboard, request: Request) -> Response:
    if d.has_fleet:
        return RedirectResponse("/fleet", status_code=303)
    return RedirectResponse(f"/s/{d.stores.configured[0]}/overview", status_code=303)


async def fleet(d: Dashboard, request: Request) -> Response:
    view = await d.fleet()
    return d.html(
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


async def overview(d: Dashboard, request: Request) -> Response:
    return await d.page(request, "overview", "overview.html")


async def lanes(d: Dashboard, request: Request) -> Response:
    return await d.page(request, "lanes", "lanes.html")


async def lane(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    number = integer("lane", request.path_params["lane"], 0, context.store.lanes - 1)
    async with context.pool.connection() as conn:
        detail = await lane_detail(conn, context.store, number, context.sampler.snapshot)
    if request.headers.get("hx-request"):
        return d.html("_lane_detail.html", request, store=context.store, detail=detail)
    return await d.page(request, "lanes", "lanes.html", detail=detail)


async def queues(d: Dashboard, request: Request) -> Response:
    return await d.page(request, "queues", "queues.html")


async def change_queue(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    actor = d.actor_of_change(request)
    form = await request.form()
    action = choice("action", form.get("action"), QUEUE_ACTIONS)
    which = text(form.get("queue")) or context.store.name
    queue = None if which == "*" else which
    limit = parse_limit(text(form.get("limit")) or "") if action == "limit" else None
    if action == "limit" and queue is None:
        raise BadRequest("queue", "*", "has no limit; name one queue")
    reason = actions.clean_reason(text(form.get("reason")))
    await actions.change_queue(
        context.pool, context.store, action, queue=queue, actor=actor, reason=reason, limit=limit
    )
    context.sampler.refresh_soon()
    response = d.html(
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


async def health(d: Dashboard, request: Request) -> Response:
    return await d.page(request, "health", "health.html")


async def audit(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    wanted = text(request.query_params.get("text"))
    action = text(request.query_params.get("action"))
    async with context.pool.connection() as conn:
        entries = await audit_entries(conn, context.store, text=wanted, action=action)
    return await d.page(
        request, "audit", "audit.html", entries=entries, text=wanted or "", action=action or ""
    )


async def events(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    view = choice("view", request.query_params.get("view"), VIEWS)
    return d.stream(request, context, view)
