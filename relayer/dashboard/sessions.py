"""Signing in and out of the dashboard: the login form, the token swapped for a signed session
cookie (a wrong token waits LOGIN_DELAY), and the sign-out that deletes it."""

from __future__ import annotations

import asyncio
import logging

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from relayer.dashboard.params import next_path, text
from relayer.dashboard.security import SESSION_COOKIE, SESSION_SECONDS
from relayer.dashboard.site import Dashboard

logger = logging.getLogger(__name__)

LOGIN_DELAY = 1.0  # seconds a wrong token waits (slows guessing)


async def login_form(d: Dashboard, request: Request) -> Response:
    return d.html("login.html", request, store=None, next=next_path(request.query_params))


async def login(d: Dashboard, request: Request) -> Response:
    access = d.access
    refusal = access.host_refusal(request) or access.origin_refusal(request)
    if refusal:
        return d.message(request, 403, refusal)
    form = await request.form()
    target = next_path(form)
    if access.read_only:
        return d.message(request, 403, "this dashboard is read-only: nothing to sign in to")
    token = access.match(text(form.get("token")) or "")
    if token is None:
        await asyncio.sleep(LOGIN_DELAY)
        logger.warning(
            "dashboard: a sign-in with a wrong token was refused; if it was not you, "
            "check who can reach the dashboard",
            extra={"action": "dashboard_login_refused"},
        )
        return d.html("login.html", request, 403, store=None, next=target, failed=True)
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


async def logout(d: Dashboard, request: Request) -> Response:
    refusal = d.access.host_refusal(request) or d.access.origin_refusal(request)
    if refusal:
        return d.message(request, 403, refusal)
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response
