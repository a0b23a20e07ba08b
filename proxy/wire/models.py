"""``/v1/models`` and ``/healthz``: what any client may ask of the proxy itself, whatever door it uses."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy import __version__
from proxy.errors import NotFoundError
from proxy.wire.http import JSONResponse

if TYPE_CHECKING:
    from proxy.wire.state import AppState


async def list_models(request: Request) -> Response:
    """OpenAI's list; Anthropic's (``data[].id``, ``display_name``) to a client that sends ``anthropic-version``
    (Claude Code with ``CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY=1``)."""
    state: AppState = request.app.state.lcm
    state.auth.tenant_for(request)  # an AuthenticationError is answered by the application's handler
    names = state.router.public_names()
    if "anthropic-version" in request.headers:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.started_at))
        models = [{"type": "model", "id": n, "display_name": n, "created_at": created} for n in names]
        first, last = (names[0], names[-1]) if names else (None, None)
        return JSONResponse({"data": models, "has_more": False, "first_id": first, "last_id": last})
    data = [{"id": name, "object": "model", "created": state.started_at, "owned_by": "lcm-proxy"} for name in names]
    return JSONResponse({"object": "list", "data": data})


async def retrieve_model(request: Request) -> Response:
    """The model object for a name that ``model_list`` serves (exactly or through a wildcard): OpenAI's, or
    Anthropic's to a client that sends ``anthropic-version``."""
    state: AppState = request.app.state.lcm
    state.auth.tenant_for(request)
    name = request.path_params["model"]
    if state.router.deployment_for(name) is None:
        raise NotFoundError(
            f"The model `{name}` does not exist or you do not have access to it.", param="model", code="model_not_found"
        )
    if "anthropic-version" in request.headers:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.started_at))
        return JSONResponse({"type": "model", "id": name, "display_name": name, "created_at": created})
    return JSONResponse({"id": name, "object": "model", "created": state.started_at, "owned_by": "lcm-proxy"})


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok", "version": __version__})


MODEL_ROUTES = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/models", list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
    Route("/models/{model:path}", retrieve_model, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET"]),
]
