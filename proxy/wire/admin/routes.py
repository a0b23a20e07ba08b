"""The admin HTTP API under ``/lcm/``: the operator commands' views over HTTP, authenticated and scoped to
the caller's tenant (with keys configured, a key only ever sees its own tenant's conversations; an admin key
may name another with ``?tenant=``), or to an end user within it (``?user=``; see ``proxy.wire.auth``). Errors (an
unknown id, a bad pattern) are answered by the application's exception handlers (``proxy.wire.http``)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.engine.admin import MESSAGES_PAGE, MESSAGES_PAGE_MAX
from proxy.errors import InvalidRequestError, PermissionDeniedError
from proxy.scopes import user_scope
from proxy.wire.auth import request_user
from proxy.wire.http import JSONResponse, read_json_body

if TYPE_CHECKING:
    from proxy.wire.state import AppState

TENANT_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,128}")  # as ``ApiKey.tenant``
Handler = Callable[[Request, "AppState", str], Awaitable[dict[str, Any]]]
LEDGER_BODY_BYTES = 4096  # ``{"state": "pinned"}`` and then some


def _int_param(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise InvalidRequestError(
            f"'{name}' must be an integer between {low} and {high}", param=name, code="invalid_value"
        )
    return int(raw)


def admin_scope(request: Request, state: AppState) -> str:
    """The scope an admin request works in: the caller's tenant, or the one an admin key names with
    ``?tenant=``; narrowed to an end user by ``?user=`` (or the ``X-LCM-User`` header), as chat requests are.
    A key that is not an admin key naming another tenant is refused (403), never silently given its own."""
    caller = state.auth.caller(request)
    tenant = caller.tenant
    named = request.query_params.get("tenant")
    if named is not None and named != caller.tenant:
        if not caller.admin:
            raise PermissionDeniedError(
                "Only an admin key (general_settings.master_key) may name another tenant.", param="tenant"
            )
        if not TENANT_NAME.fullmatch(named):
            raise InvalidRequestError(
                "'tenant' must be a tenant's name (letters, digits, _ . @ -)", param="tenant", code="invalid_value"
            )
        tenant = named
    user = request_user(request, request.query_params.get("user"))
    return user_scope(tenant, user)


def endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        state: AppState = request.app.state.lcm
        return JSONResponse(await handler(request, state, admin_scope(request, state)))

    return run


async def conversations(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    return await state.admin.conversations(tenant, _int_param(request, "limit", 100, 1, 10000) or 100)


async def conversation(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    return await state.admin.conversation(tenant, request.path_params["id"])


async def messages(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    """A page of messages: ``?after=SEQ`` (those after it) and ``?limit=N``; the answer's ``next`` is the
    ``after`` of the next page."""
    after = _int_param(request, "after", None, 0, 2**62)
    limit = _int_param(request, "limit", MESSAGES_PAGE, 1, MESSAGES_PAGE_MAX) or MESSAGES_PAGE
    return await state.admin.messages(tenant, request.path_params["id"], after, limit)


async def context(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    return await state.admin.context(tenant, request.path_params["id"])


async def ledger(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    """The conversation's standing instructions; ``?all=true`` adds those a later statement superseded."""
    every = request.query_params.get("all", "false")
    if every not in ("true", "false"):
        raise InvalidRequestError("'all' must be true or false", param="all", code="invalid_value")
    return await state.admin.ledger(tenant, request.path_params["id"], every == "true")


async def ledger_item(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    """``{"state": "pinned" | "dropped" | "active"}``: the user pins, drops or restores one item (a state not
    among those is refused by the admin service, naming ``state``)."""
    settings = state.config.general_settings
    body = await read_json_body(request, LEDGER_BODY_BYTES, settings.body_read_timeout)
    wanted = body.get("state") if isinstance(body, dict) else None
    if wanted is None:
        raise InvalidRequestError(
            'Missing required parameter: \'state\' (a JSON object such as {"state": "pinned"}).',
            param="state",
            code="missing_required_parameter",
        )
    return await state.admin.set_ledger_state(tenant, request.path_params["id"], request.path_params["item"], wanted)


async def summary(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    return await state.admin.summary(tenant, request.path_params["id"])


async def file(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    start = _int_param(request, "start_line", None, 1, 10**9)
    end = _int_param(request, "end_line", None, 1, 10**9)
    if start is not None and end is not None and end < start:
        raise InvalidRequestError(
            f"'end_line' ({end}) must not be less than 'start_line' ({start})", param="end_line", code="invalid_value"
        )
    return await state.admin.file(tenant, request.path_params["id"], start, end)


async def grep(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    pattern = request.query_params.get("pattern")
    if not pattern:
        raise InvalidRequestError(
            "Missing required parameter: 'pattern'.", param="pattern", code="missing_required_parameter"
        )
    mode = request.query_params.get("mode", "regex")
    limit = _int_param(request, "limit", 20, 1, 50) or 20
    return await state.admin.grep(tenant, request.path_params["id"], pattern, mode, limit)


async def compact(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    record = await state.admin.find(tenant, request.path_params["id"])
    model = request.query_params.get("model") or state.config.lcm_settings.summary_model or record.last_model
    summarizer = state.policy.summarizer_for(state.router.resolve(model)) if model else None
    return await state.admin.compact(tenant, record.id, summarizer)


async def delete(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    """Delete a conversation of the caller's (``proxy.engine.deletion``); another's is an unknown id (404).
    Rate-limited per key (``lcm_settings.delete_rate_per_minute``, a 429 over it). The answer says
    ``"scrub": "pending"``: the store is scrubbed in the background (``GET /lcm/scrub`` says when it is done),
    while what was deleted is already unreachable."""
    state.delete_limits.take(state.auth.caller(request).tenant)
    return await state.admin.delete(tenant, request.path_params["id"])


async def scrub(request: Request, state: AppState, tenant: str) -> dict[str, Any]:
    """Whether what the caller's scope deleted is scrubbed from the store's files yet (deletions made through
    this process: with several workers or replicas, the one that answered the DELETE)."""
    return state.admin.scrub(tenant)


async def models(request: Request) -> Response:
    """``GET /lcm/models``: each model's window as requests are budgeted now, and per deployment the configured
    window and the one its server stated (``proxy.upstream.windows``). Configuration, not a tenant's data: any key."""
    state: AppState = request.app.state.lcm
    state.auth.caller(request)
    policy = state.policy
    data = []
    for name in state.router.public_names():
        target = state.router.resolve(name)
        window, source = policy.window_of(target)
        deployments = []
        for candidate in target.candidates():
            configured, configured_source = policy.configured_window(candidate)
            learned = policy.server_window(candidate)
            deployments.append(
                {
                    "deployment": candidate.deployment,
                    "model": candidate.upstream_model,
                    "configured_window": configured,
                    "configured_source": configured_source,
                    "server_window": learned.window if learned else None,
                    "learned_from": learned.how if learned else None,
                    "learned_at": learned.at if learned else None,
                }
            )
        data.append({"id": name, "window": window, "window_source": source, "deployments": deployments})
    return JSONResponse({"object": "list", "data": data})


ADMIN_ROUTES = [
    Route("/lcm/models", models, methods=["GET"]),
    Route("/lcm/conversations", endpoint(conversations), methods=["GET"]),
    Route("/lcm/conversations/{id}", endpoint(conversation), methods=["GET"]),
    Route("/lcm/conversations/{id}", endpoint(delete), methods=["DELETE"]),
    Route("/lcm/scrub", endpoint(scrub), methods=["GET"]),
    Route("/lcm/conversations/{id}/messages", endpoint(messages), methods=["GET"]),
    Route("/lcm/conversations/{id}/context", endpoint(context), methods=["GET"]),
    Route("/lcm/conversations/{id}/grep", endpoint(grep), methods=["GET"]),
    Route("/lcm/conversations/{id}/compact", endpoint(compact), methods=["POST"]),
    Route("/lcm/conversations/{id}/ledger", endpoint(ledger), methods=["GET"]),
    Route("/lcm/conversations/{id}/ledger/{item}", endpoint(ledger_item), methods=["POST"]),
    Route("/lcm/summaries/{id}", endpoint(summary), methods=["GET"]),
    Route("/lcm/files/{id}", endpoint(file), methods=["GET"]),
]
