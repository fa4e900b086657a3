"""The Starlette application: routes from ``spec``, the ``security`` gate in front, errors as JSON."""

from __future__ import annotations

import contextlib
import logging
import typing as t

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from overstory.errors import OrchestratorError
from overstory.paths import ProjectPaths
from overstory.ui.serve import routes
from overstory.ui.serve.events import EventHub
from overstory.ui.serve.security import LOOPBACK_NAMES, Gate, Tickets
from overstory.ui.serve.spec import ENDPOINTS, STATIC_PREFIX

log = logging.getLogger("overstory.serve")
DEFAULT_HEARTBEAT = 15.0


async def _ov_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, OrchestratorError)
    return JSONResponse({"error": " ".join(str(exc).split())}, status_code=exc.http_status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: f"no such route: {request.method} {request.url.path} (see /api/docs)",
               405: f"{request.method} is not allowed on {request.url.path} (see /api/docs)"}.get(
        exc.status_code, str(exc.detail))
    return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)


async def _bug(request: Request, exc: Exception) -> Response:
    log.exception("ov serve: internal error on %s %s", request.method, request.url.path)
    return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)


def build_routes() -> list[BaseRoute]:
    table: list[BaseRoute] = [Route(e.path, routes.HANDLERS[e.op], methods=[e.method], name=e.op) for e in ENDPOINTS]
    table.append(Mount(STATIC_PREFIX, StaticFiles(directory=routes.STATIC_DIR), name="static"))
    return table


def create_app(project: ProjectPaths, *, token: str, cookie_name: str = "ov_serve",
               allowed_hosts: t.Collection[str] | None = LOOPBACK_NAMES, heartbeat: float = DEFAULT_HEARTBEAT,
               poll_interval: float = 0.2) -> Starlette:
    """The application for ``project``; ``allowed_hosts`` None when it listens beyond loopback.

    ``cookie_name``: the sign-in cookie older versions set (expired when a browser still sends it).
    """
    hub = EventHub(project.events_db, interval=poll_interval)
    tickets = Tickets()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> t.AsyncIterator[None]:
        await hub.start()
        try:
            yield
        finally:
            await hub.close()

    app = Starlette(
        routes=build_routes(),
        middleware=[Middleware(Gate, token=token, cookie_name=cookie_name, tickets=tickets,
                               allowed_hosts=allowed_hosts)],
        exception_handlers={OrchestratorError: _ov_error, HTTPException: _http_error, Exception: _bug},
        lifespan=lifespan,
    )
    app.state.project = project
    app.state.hub = hub
    app.state.tickets = tickets
    app.state.heartbeat = heartbeat
    return app
