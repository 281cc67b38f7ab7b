"""The dashboard's ASGI application: the shared :class:`~relayer.dashboard.site.Dashboard`,
its routes (routes.py) and static files, behind the security headers, with the stores'
samplers started and stopped by the application's lifespan."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from relayer.dashboard.routes import Handler, routes
from relayer.dashboard.security import Access, SecurityHeaders
from relayer.dashboard.site import Dashboard, FleetView
from relayer.dashboard.stores import OPEN_STORES, StoreContext
from relayer.settings import StoreSettings, TemplateSettings


def create_app(
    stores: Sequence[StoreSettings],
    access: Access,
    *,
    templates: Sequence[TemplateSettings] = (),
    interval: float = 2.0,
    refine_interval: float = 30.0,
    open_stores: int = OPEN_STORES,
) -> Starlette:
    """The dashboard for ``stores`` and the stores ``templates``' sources list: the samplers
    of ``stores`` start with the application's lifespan, a template store's when it is first
    viewed (at most ``open_stores`` of those at once)."""
    dashboard = Dashboard(
        stores,
        access,
        templates=templates,
        interval=interval,
        refine_interval=refine_interval,
        open_stores=open_stores,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await dashboard.start()
        try:
            yield
        finally:
            await dashboard.stop()

    app = Starlette(
        routes=[
            *routes(dashboard),
            Mount(
                "/static",
                StaticFiles(packages=[("relayer.dashboard", "static")]),
                name="static",
            ),
        ],
        lifespan=lifespan,
    )
    app.state.dashboard = dashboard
    app.add_middleware(SecurityHeaders)
    return app


__all__ = ["Dashboard", "FleetView", "Handler", "Route", "StoreContext", "create_app"]
