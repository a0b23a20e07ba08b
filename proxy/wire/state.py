"""What every door shares while the app runs: the config, the router, the store, the engine, the upstream, and
the per-model rules."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.config.settings import ProxyConfig
from proxy.engine.admin import AdminViews
from proxy.engine.deletion import Retention
from proxy.engine.engine import Budget, ContextEngine
from proxy.engine.recall import RECALL_TOOLS, RecallTools
from proxy.relay.priority import Priority
from proxy.relay.summarizer import UpstreamSummarizer
from proxy.store.base import Blobs, Store
from proxy.tokens import count_text, token_margin
from proxy.upstream.client import Upstream
from proxy.upstream.routing import (
    ModelRouter,
    ResolvedModel,
    deployment_of,
    effective_window,
    largest_margin,
    smallest_window,
)
from proxy.upstream.windows import key_of
from proxy.wire.auth import Authenticator
from proxy.wire.ratelimit import TokenBuckets

log = logging.getLogger("lcm_proxy")


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
        unless the deployment's server said its context is smaller (``proxy.upstream.windows``). Of several deployments
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
