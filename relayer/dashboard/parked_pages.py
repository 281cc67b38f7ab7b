"""The dashboard's parked keys: the filtered list, a key with its rows, a row's body (GET);
the redrive or drop of one key and the bulk runs over a filter (POST, with their dialogs).

A single change carries the head id and attempts the operator saw and answers 409 when they
changed meanwhile; a bulk run of BULK_CONFIRM keys or more needs the count typed."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from relayer.dashboard import actions
from relayer.dashboard.params import (
    BadRequest,
    choice,
    integer,
    moment,
    parked_filter,
    required,
    row_id,
    text,
)
from relayer.dashboard.site import Dashboard
from relayer.operations import parked
from relayer.store.inspection import BODY_CAP, key_detail, parked_page, row_body

CHANGES = ("redrive", "drop")
DROP_SCOPES = {"key": parked.DROP, "head": parked.DROP_HEAD}
MAX_INT4 = 2**31 - 1  # the largest attempt count and run number a request may name


async def parked_list(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    params = request.query_params
    where = parked_filter(params, context.store.lanes)
    as_of = moment("as_of", params.get("as_of"))
    after_at = moment("after_at", params.get("after_at"))
    after = (after_at, params.get("after_key", "")) if after_at else None
    async with context.pool.connection() as conn:
        listing = await parked_page(conn, context.store, where, as_of=as_of, after=after)
    return await d.page(request, "parked", "parked.html", where=where, listing=listing)


async def parked_key(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    key = required(request.query_params, "key")
    async with context.pool.connection() as conn:
        detail = await key_detail(conn, context.store, key)
    return await d.page(request, "parked", "key.html", key=key, detail=detail)


async def body(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    lane = integer("lane", request.query_params.get("lane"), -1, context.store.lanes - 1)
    wanted = row_id("id", request.query_params.get("id"))
    async with context.pool.connection() as conn:
        found = await row_body(conn, context.store, lane, wanted)
    return d.html("_body.html", request, body=found, cap=BODY_CAP)


async def confirm_key(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    key = required(request.query_params, "key")
    action = choice("action", request.query_params.get("action"), CHANGES)
    async with context.pool.connection() as conn:
        detail = await key_detail(conn, context.store, key)
    return d.html(
        "_confirm_key.html", request, store=context.store, key=key, action=action, detail=detail
    )


async def change_key(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    actor = d.actor_of_change(request)
    form = await request.form()
    key = required(form, "key")
    action = choice("action", form.get("action"), CHANGES)
    if action == "drop":
        scope = choice("scope", form.get("scope") or "key", tuple(DROP_SCOPES))
        action = DROP_SCOPES[scope]
    guard = parked.Guard(
        row_id("head_id", form.get("head_id")),
        integer("attempts", form.get("attempts"), 0, MAX_INT4),
    )
    reason = actions.clean_reason(text(form.get("reason")))
    outcome = await actions.change_key(
        context.pool, context.store, key, action, guard=guard, actor=actor, reason=reason
    )
    context.sampler.refresh_soon()
    status = 200 if outcome.applied else 409
    response = d.html(
        "_key_result.html", request, status, store=context.store, outcome=outcome, guard=guard
    )
    if outcome.applied:
        response.headers["HX-Trigger"] = "relayer-changed"
    return response


async def confirm_bulk(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    where = parked_filter(request.query_params, context.store.lanes)
    action = choice("action", request.query_params.get("action"), CHANGES)
    async with context.pool.connection() as conn:
        listing = await parked_page(conn, context.store, where, limit=5)
    return d.html(
        "_confirm_bulk.html",
        request,
        store=context.store,
        where=where,
        action=action,
        listing=listing,
        confirm_at=actions.BULK_CONFIRM,
    )


async def start_bulk(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    actor = d.actor_of_change(request)
    form = await request.form()
    where = parked_filter(form, context.store.lanes)
    action = choice("action", form.get("action"), CHANGES)
    expected = integer("expected", form.get("expected"), 0, MAX_INT4)
    if expected >= actions.BULK_CONFIRM:
        typed = text(form.get("typed")) or ""
        if typed.replace(",", "").strip() != str(expected):
            raise BadRequest("typed", typed, f"must be the number of keys, {expected}, to confirm")
    run = d.bulk.start(
        context.pool,
        context.store,
        action,
        where,
        actor=actor,
        reason=actions.clean_reason(text(form.get("reason"))),
        expected=expected,
    )
    return d.html("_bulk.html", request, store=context.store, run=run)


async def bulk_progress(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    run = d.bulk.runs.get(integer("run", request.path_params["run"], 1, MAX_INT4))
    if run is None or run.store != context.store.name:
        raise BadRequest("run", request.path_params["run"], "is not a bulk run of this store")
    if run.finished:
        context.sampler.refresh_soon()
    return d.html("_bulk.html", request, store=context.store, run=run)


async def cancel_bulk(d: Dashboard, request: Request) -> Response:
    context = await d.store_of(request)
    d.actor_of_change(request)  # Refused unless this request may change the store
    run = d.bulk.cancel(integer("run", request.path_params["run"], 1, MAX_INT4))
    if run is None or run.store != context.store.name:
        raise BadRequest("run", request.path_params["run"], "is not a bulk run of this store")
    return d.html("_bulk.html", request, store=context.store, run=run)
