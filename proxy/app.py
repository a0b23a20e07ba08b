"""The Starlette application: wiring of config, auth, router and upstream, plus error handlers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.config import ProxyConfig, load_config
from proxy.doctor import collect_leftovers
from proxy.engine.admin import AdminViews
from proxy.engine.deletion import Retention
from proxy.engine.engine import Budget, ContextEngine
from proxy.engine.errors import EngineError
from proxy.engine.neutralise import warm_up as neutralise_warm_up
from proxy.engine.recall import RECALL_TOOLS, RecallTools
from proxy.engine.tokens import count_text, token_margin
from proxy.errors import InternalError, InvalidRequestError, NotFoundError, ProxyError
from proxy.logs import configure_serving_logs
from proxy.priority import Priority
from proxy.routing import (
    ModelRouter,
    ResolvedModel,
    deployment_of,
    effective_window,
    largest_margin,
    smallest_window,
    upstream_of,
)
from proxy.store.base import Blobs, Store
from proxy.store.files import PENDING_MAX_AGE, FileStore
from proxy.summarizer import UpstreamSummarizer
from proxy.upstream import Upstream
from proxy.windows import key_of
from proxy.wire import routes
from proxy.wire.admin import ADMIN_ROUTES
from proxy.wire.auth import Authenticator
from proxy.wire.cors import cors_middleware
from proxy.wire.guard import CloseUnreadBodies, RequestGuard
from proxy.wire.http import error_response, reported_error
from proxy.wire.passthrough import PASSTHROUGH_ROUTES
from proxy.wire.ratelimit import TokenBuckets
from proxy.wire.shutdown import AnswerOnShutdown

log = logging.getLogger("lcm_proxy")

CONFIG_ENV = "LCM_PROXY_CONFIG"
BIND_HOST_ENV = "LCM_PROXY_BIND_HOST"  # the address ``lcm-proxy serve`` bound, for its worker processes


@functools.cache
def recall_tool_tokens() -> int:
    return count_text(orjson.dumps(RECALL_TOOLS).decode())  # lazily: importing the app must not load tiktoken


@dataclass
class AppState:
    config: ProxyConfig
    router: ModelRouter
    auth: Authenticator
    started_at: int = field(default_factory=lambda: int(time.time()))
    upstream: Upstream = field(init=False)
    store: Store = field(init=False)
    files: Blobs = field(init=False)
    engine: ContextEngine = field(init=False)
    recall: RecallTools = field(init=False)
    admin: AdminViews = field(init=False)
    tool_callers: set[str] = field(default_factory=set)  # model aliases seen making structured tool calls
    priority: Priority = field(init=False)  # chat requests before background summaries on local servers
    retention: Retention | None = None  # lcm_settings.retention_days: the background purge of idle conversations
    collecting: asyncio.Task[list[str]] | None = None  # startup: leftover payload files of killed processes
    delete_limits: TokenBuckets = field(init=False)  # DELETE /lcm/conversations/{id}, per key
    windows_said: set[tuple[str, int]] = field(default_factory=set)  # learned windows already logged

    def window_of(self, target: ResolvedModel) -> tuple[int, str]:
        """The model's input window and where it came from: model_info, else LiteLLM's map, else the default,
        unless the deployment's server said its context is smaller (``proxy.windows``). Of several deployments
        (and fallbacks) the smallest: the budget must hold for whichever answers."""
        default = self.config.lcm_settings.default_context_window
        return smallest_window(target, self.upstream.context_window, default, self.learned_window)

    def learned_window(self, deployment: ResolvedModel) -> tuple[int, str] | None:
        """The context size the deployment's server stated, when smaller than the configured window (said once
        at WARNING per deployment and size)."""
        learned = self.upstream.windows.get(deployment)
        if learned is None:
            return None
        default = self.config.lcm_settings.default_context_window
        configured, source = effective_window(deployment, self.upstream.context_window, default)
        if learned.window >= configured:
            return None
        said = (key_of(deployment), learned.window)
        if said not in self.windows_said:
            self.windows_said.add(said)
            log.warning(
                "model %s deployment %s (%s): the server's context is %d tokens, not the configured %d (%s); using "
                "%d (learned from %s; set model_info.max_input_tokens: %d)",
                deployment.alias, deployment.deployment, deployment_of(deployment), learned.window, configured,
                source, learned.window, learned.how, learned.window,
            )  # fmt: skip
        return learned.window, f"the server's own context size, from {learned.how}; {source} says {configured}"

    def margin_of(self, target: ResolvedModel) -> tuple[float, str]:
        """How much more than the proxy's o200k count the model's own tokenizer may count, and why (of several
        deployments, the largest margin). A margin measured on a deployment's refusal wins when it is larger."""
        return largest_margin(target, self.learned_margin)

    def learned_margin(self, deployment: ResolvedModel) -> tuple[float, str] | None:
        measured = self.upstream.windows.margin(deployment)
        if measured is None:
            return None
        api_base = deployment.litellm_params.get("api_base")
        configured, source = token_margin(deployment.upstream_model, api_base, deployment.token_margin)
        if measured <= configured:
            return None
        return measured, f"measured on the server's refusal; {source} says {configured:g}"

    def calls_tools(self, target: ResolvedModel) -> bool:
        """Whether the model makes structured tool calls: model_info, else learned from its answers, else
        LiteLLM's model map. Small local models mostly write tool calls as text: they get auto-recall instead."""
        if target.supports_function_calling is not None:
            return target.supports_function_calling
        if target.alias in self.tool_callers:
            return True
        return bool(self.upstream.supports_function_calling(target.upstream_model))

    def offers_recall_tools(self, target: ResolvedModel) -> bool:
        """Whether this model may be offered the recall tools: with ``retrieval_tools: auto``, only when it makes
        structured tool calls and their schemas take at most a tenth of its window (on a 2k local model they
        would cost a third of it; auto-recall serves such models instead)."""
        mode = self.config.lcm_settings.retrieval_tools
        if mode != "auto":
            return mode == "always"
        return self.calls_tools(target) and recall_tool_tokens() <= self.window_of(target)[0] // 10

    def learn_tool_calls(self, target: ResolvedModel, message: Any) -> None:
        """Remember a model that answered with a structured tool call (its map entry may not say so)."""
        if isinstance(message, dict) and message.get("tool_calls"):
            self.tool_callers.add(target.alias)

    def budget_for(self, target: ResolvedModel, body: dict[str, Any]) -> Budget:
        """Window, output reserve and tool schemas, each with the setting it came from."""
        lcm = self.config.lcm_settings
        window, window_source = self.window_of(target)
        # The default reserve never takes more than a quarter of the window: 4096 tokens on a 2k-4k local
        # model would leave nothing (or less than nothing) for the messages. A client's own max_tokens counts
        # in full: that is what the upstream will reserve.
        asked = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
        reserve = body.get(asked) or min(lcm.default_output_reserve, window // 4)
        reserve_source = asked if body.get(asked) else "lcm_settings.default_output_reserve"
        # Legacy ``functions`` reach the model just as ``tools`` do.
        tools = sum(count_text(orjson.dumps(body[k]).decode()) for k in ("tools", "functions") if body.get(k))
        if self.offers_recall_tools(target):
            # Reserved even on requests that do not offer them yet: they appear on the first request with a
            # summary or a stub, and a budget that shrank at that moment could tip it over the window.
            tools += recall_tool_tokens()
        return Budget(window, int(reserve), tools, window_source, reserve_source, *self.margin_of(target))

    def summarizer_for(self, request_target: ResolvedModel) -> UpstreamSummarizer:
        settings = self.config.lcm_settings
        target = self.router.resolve(settings.summary_model) if settings.summary_model else request_target
        window = int(self.window_of(target)[0] / self.margin_of(target)[0])  # in o200k tokens, as counted
        return UpstreamSummarizer(self.upstream, target, settings.summary_timeout, window, self.priority)


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


def create_app(config: ProxyConfig, *, serving: bool = False, bind_host: str | None = None) -> Starlette:
    """``serving``: this process exists to serve the app (``lcm-proxy serve``), so it may warm LiteLLM up and
    freeze its startup heap; tests that build many apps in one process leave it off. ``bind_host``: the address
    the server listens on, when the caller knows it (``proxy.wire.guard``: any Host is served on a non-loopback
    bind when ``allowed_hosts`` is unset)."""
    state = AppState(
        config=config,
        router=ModelRouter(
            config.model_list, config.general_settings.fallbacks, config.general_settings.model_group_alias
        ),
        auth=Authenticator(config.general_settings.api_keys),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        location = config.general_settings.location()
        if location.kind == "sqlite":
            ensure_private_dir(location.data_dir)
        state.upstream = Upstream(config.general_settings)
        state.store, state.files = location.stores()
        await state.store.open()
        state.engine = ContextEngine(state.store, state.files, config.lcm_settings)
        state.recall = RecallTools(state.store, state.files)
        state.priority = Priority(config.lcm_settings.background_yields)
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
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            if state.collecting is not None:
                state.collecting.cancel()
                await asyncio.wait({state.collecting})
            await state.upstream.windows.close()
            if state.retention is not None:
                await state.retention.stop()
            await state.admin.scrubber.stop()  # a scrub promised to a deletion finishes first
            await state.engine.close()
            await state.store.close()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/v1/models", routes.list_models, methods=["GET"]),
            Route("/models", routes.list_models, methods=["GET"]),
            Route("/healthz", routes.healthz, methods=["GET"]),
            *ADMIN_ROUTES,
            *PASSTHROUGH_ROUTES,
        ],
        exception_handlers={
            HTTPException: _http_exception,
            ProxyError: reported_error,
            EngineError: reported_error,
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
