"""The Starlette application: wiring of config, auth, router and upstream, plus error handlers."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.config.loading import load_config
from proxy.config.logs import configure_serving_logs
from proxy.config.settings import ProxyConfig
from proxy.engine.admin import AdminViews
from proxy.engine.deletion import Retention
from proxy.engine.doctor import collect_leftovers
from proxy.engine.engine import ContextEngine
from proxy.engine.errors import EngineError
from proxy.engine.neutralise import warm_up as neutralise_warm_up
from proxy.engine.recall import RecallTools
from proxy.engine.standing import languages
from proxy.errors import InternalError, InvalidRequestError, NotFoundError, ProxyError
from proxy.relay.policy import ModelPolicy, recall_tool_tokens, router_of
from proxy.relay.priority import Priority
from proxy.store.errors import StoreError
from proxy.store.files import PENDING_MAX_AGE, FileStore
from proxy.upstream import pool
from proxy.upstream.client import Upstream
from proxy.upstream.routing import upstream_of
from proxy.wire.admin.routes import ADMIN_ROUTES
from proxy.wire.auth import Authenticator
from proxy.wire.chat import routes
from proxy.wire.cors import cors_middleware
from proxy.wire.guard import CloseUnreadBodies, RequestGuard
from proxy.wire.http import error_response, reported_error
from proxy.wire.messages.routes import MESSAGES_ROUTES
from proxy.wire.models import MODEL_ROUTES
from proxy.wire.passthrough.routes import PASSTHROUGH_ROUTES
from proxy.wire.ratelimit import TokenBuckets
from proxy.wire.responses.routes import RESPONSES_ROUTES
from proxy.wire.shutdown import AnswerOnShutdown
from proxy.wire.state import AppState

log = logging.getLogger("lcm_proxy")

CONFIG_ENV = "LCM_PROXY_CONFIG"
BIND_HOST_ENV = "LCM_PROXY_BIND_HOST"  # the address ``lcm-proxy serve`` bound, for its worker processes


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) readable by the owner only; tighten it if it already exists."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        error: ProxyError = NotFoundError(f"Unknown path: {request.url.path}", code="unknown_url")
    else:
        error = InvalidRequestError(str(exc.detail), status=exc.status_code, code="method_not_allowed")
    return error_response(error)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(InternalError("Internal error in lcm-proxy. The request was not forwarded."))


async def _start(state: AppState, serving: bool) -> None:
    """Open what the app serves from: the store, the engine and its services, the upstream, the policy."""
    config = state.config
    location = config.general_settings.location()
    if location.kind == "sqlite":
        ensure_private_dir(location.data_dir)
    state.upstream = Upstream(config.general_settings)
    state.store, state.files = location.stores()
    await state.store.open()
    state.engine = ContextEngine(state.store, state.files, config.lcm_settings)
    state.recall = RecallTools(state.store, state.files)
    state.priority = Priority(config.lcm_settings.background_yields)
    state.policy = ModelPolicy(config, state.router, state.upstream, state.upstream, state.priority)
    state.admin = AdminViews(state.engine, state.recall)
    if isinstance(state.files, FileStore):
        # In the background (readiness does not wait for it): files no row names, left by processes killed
        # mid-request, older than any live worker's request can have been writing them.
        grace = max(PENDING_MAX_AGE, config.general_settings.request_timeout)
        state.collecting = asyncio.create_task(collect_leftovers(state.store, state.files, grace))
    state.delete_limits = TokenBuckets(
        config.lcm_settings.delete_rate_per_minute, config.lcm_settings.delete_burst, "deleting conversations"
    )
    if config.lcm_settings.retention_days is not None:
        state.retention = Retention(state.admin.deleter, config.lcm_settings.retention_days)
        state.retention.start()
    for deployment in config.model_list:
        log.info("model %s -> %s", deployment.model_name, upstream_of(deployment))
    state.upstream.windows.recheck_after = config.lcm_settings.context_window_recheck_seconds
    if config.lcm_settings.probe_context_window:
        state.upstream.probe_windows(state.router.deployments())
    log.info("conversations: %s (%s)", location.describe(), location.kind)
    log.info(
        "authentication: %s",
        f"{len(config.general_settings.api_keys)} key(s)" if state.auth.enabled else "off",
    )
    if serving:
        # LiteLLM leaves ~370,000 long-lived objects on the heap, and every full garbage collection walks
        # them all: 170-210 ms, a pause that lands in some request's latency every few hundred requests
        # (p99 at 8 clients was ~250 ms for a ~4 ms p50). Once LiteLLM's lazy imports are done, freezing
        # the heap moves those objects out of the collector's sight; a full collection then takes ~2 ms.
        await state.upstream.warm_up()
        recall_tool_tokens()  # loads the tokenizer now, not in the first request (a ~200 ms stall of the loop)
        await asyncio.to_thread(neutralise_warm_up)  # the fold's table (~0.2 s), not in the first request
        if config.lcm_settings.standing_instructions != "off":
            await asyncio.to_thread(languages.warm_up)  # the language models (~0.5 s, ~30 MB), likewise
        gc.collect()
        gc.freeze()


async def _stop(state: AppState) -> None:
    """Close it all, a scrub promised to a deletion and the work in flight finished first."""
    if state.collecting is not None:
        state.collecting.cancel()
        await asyncio.wait({state.collecting})
    await state.upstream.windows.close()
    await pool.close()  # the direct and native calls' connections
    if state.retention is not None:
        await state.retention.stop()
    await state.admin.scrubber.stop()  # a scrub promised to a deletion finishes first
    await state.engine.close()
    await state.store.close()


def create_app(config: ProxyConfig, *, serving: bool = False, bind_host: str | None = None) -> Starlette:
    """``serving``: this process exists to serve the app (``lcm-proxy serve``), so it may warm LiteLLM up and
    freeze its startup heap; tests that build many apps in one process leave it off. ``bind_host``: the address
    the server listens on, when the caller knows it (``proxy.wire.guard``: any Host is served on a non-loopback
    bind when ``allowed_hosts`` is unset)."""
    state = AppState(
        config=config,
        router=router_of(config),
        auth=Authenticator(config.general_settings.api_keys),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await _start(state, serving)
        try:
            yield
        finally:
            await _stop(state)

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/chat/completions", routes.chat_completions, methods=["POST"]),
            *MESSAGES_ROUTES,
            *RESPONSES_ROUTES,
            *MODEL_ROUTES,
            *ADMIN_ROUTES,
            *PASSTHROUGH_ROUTES,
        ],
        exception_handlers={
            HTTPException: _http_exception,
            ProxyError: reported_error,
            EngineError: reported_error,
            StoreError: reported_error,
            Exception: _internal_error,
        },
        middleware=[
            Middleware(CloseUnreadBodies),
            *cors_middleware(config.general_settings.cors_allow_origins),
            Middleware(
                RequestGuard,
                allowed_hosts=config.general_settings.allowed_hosts,
                cors_allow_origins=config.general_settings.cors_allow_origins,
                bind_host=bind_host or config.general_settings.host,
                keys=state.auth.enabled,
            ),
            Middleware(AnswerOnShutdown),
        ],
        lifespan=lifespan,
    )
    app.state.lcm = state
    return app


def app_from_environment() -> Starlette:
    """Factory for ``uvicorn --factory`` and multi-worker serving: the config path comes from the env."""
    config = load_config(os.environ[CONFIG_ENV])
    configure_serving_logs(config)  # a worker process: the logging ``lcm-proxy serve`` set up in its parent
    return create_app(config, serving=True, bind_host=os.environ.get(BIND_HOST_ENV))
