"""``/v1/models`` and ``/healthz``: what any client may ask of the proxy itself, whatever door it uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy import __version__
from proxy.wire.http import JSONResponse

if TYPE_CHECKING:
    from proxy.wire.state import AppState


async def list_models(request: Request) -> Response:
    state: AppState = request.app.state.lcm
    state.auth.tenant_for(request)  # an AuthenticationError is answered by the application's handler
    data = [
        {"id": name, "object": "model", "created": state.started_at, "owned_by": "lcm-proxy"}
        for name in state.router.public_names()
    ]
    return JSONResponse({"object": "list", "data": data})


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok", "version": __version__})


MODEL_ROUTES = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/models", list_models, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET"]),
]
