"""The rules for one model, in one place: its input window and token margin (with what its servers taught),
whether it makes structured tool calls and so gets the recall tools, the budget of a request to it, and the
model that summarises for it.

The server (``proxy.wire.state.AppState`` holds one), ``check-config``, ``GET /lcm/models`` and the
operator's ``compact`` all ask this policy, so a window is the same number wherever it is shown or used.
What is known of a model beyond its config entry (LiteLLM's model map, what its server said) comes from
``ModelFacts``: the upstream while serving, LiteLLM's map alone in ``check-config``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from proxy.config.settings import ProxyConfig
from proxy.engine.budget import Budget
from proxy.engine.recall import RECALL_TOOLS
from proxy.relay.calls import Completion
from proxy.relay.priority import Priority
from proxy.relay.summarizer import UpstreamSummarizer
from proxy.tokens import count_text, token_margin
from proxy.upstream.routing import ModelRouter, ResolvedModel, deployment_of
from proxy.upstream.windows import Learned, ServerWindows, key_of

log = logging.getLogger("lcm_proxy")

WindowLookup = Callable[[str], "int | None"]  # LiteLLM's model map: a model's window, if it knows one


@functools.cache
def recall_tool_tokens() -> int:
    return count_text(orjson.dumps(RECALL_TOOLS).decode())  # lazily: importing the app must not load tiktoken


class ModelFacts(Protocol):
    """What is known of a model beyond its config entry (``proxy.upstream.client.Upstream`` is one)."""

    @property
    def windows(self) -> ServerWindows:
        """What each deployment's server said its context is (``proxy.upstream.windows``)."""
        ...

    def context_window(self, model: str) -> int | None:
        """The input window LiteLLM's model map knows for ``model``, if any."""
        ...

    def supports_function_calling(self, model: str) -> bool | None:
        """Whether LiteLLM's model map says ``model`` makes structured tool calls (None: it does not know)."""
        ...


def effective_window(target: ResolvedModel, known: WindowLookup, default: int) -> tuple[int, str]:
    """The model's input window and where it came from: model_info, else ``known`` (LiteLLM's model map),
    else ``default`` (lcm_settings.default_context_window)."""
    if target.max_input_tokens:
        return target.max_input_tokens, "model_info.max_input_tokens"
    window = known(target.upstream_model)
    if window:
        return window, "LiteLLM's model map; set model_info.max_input_tokens"
    return default, "lcm_settings.default_context_window"


def configured_margin(target: ResolvedModel) -> tuple[float, str]:
    return token_margin(target.upstream_model, target.litellm_params.get("api_base"), target.token_margin)


def _among(chosen: ResolvedModel, count: int, what: str) -> str:
    if count == 1:
        return ""
    return f" of {chosen.deployment or chosen.alias}, the {what} among the {count} deployments that may answer"


class ModelPolicy:
    """The per-model rules. ``calls``: the upstream summaries are sent to (None where nothing is summarised,
    as in ``check-config``); ``priority``: background summaries give way to chat requests (the server's)."""

    def __init__(
        self,
        config: ProxyConfig,
        router: ModelRouter,
        facts: ModelFacts,
        calls: Completion | None = None,
        priority: Priority | None = None,
    ) -> None:
        self.config = config
        self.router = router
        self.facts = facts
        self.calls = calls
        self.priority = priority
        self.tool_callers: set[str] = set()  # model aliases seen making structured tool calls
        self.windows_said: set[tuple[str, int]] = set()  # learned windows already logged

    # The window and the margin

    def window_of(self, target: ResolvedModel) -> tuple[int, str]:
        """The model's input window and where it came from: model_info, else LiteLLM's map, else the default,
        unless the deployment's server said its context is smaller (``proxy.upstream.windows``). Of several
        deployments (and fallbacks) the smallest: the budget must hold for whichever answers."""
        found = [(self.learned_window(c) or self.configured_window(c), c) for c in target.candidates()]
        (window, source), smallest = min(found, key=lambda f: f[0][0])
        return window, source + _among(smallest, len(found), "smallest window")

    def configured_window(self, deployment: ResolvedModel) -> tuple[int, str]:
        """The deployment's window as the config (and LiteLLM's map) give it, whatever its server said."""
        default = self.config.lcm_settings.default_context_window
        return effective_window(deployment, self.facts.context_window, default)

    def server_window(self, deployment: ResolvedModel) -> Learned | None:
        """The context size the deployment's server stated, if it did (``proxy.upstream.windows``)."""
        return self.facts.windows.get(deployment)

    def learned_window(self, deployment: ResolvedModel) -> tuple[int, str] | None:
        """The context size the deployment's server stated, when smaller than the configured window (said once
        at WARNING per deployment and size)."""
        learned = self.server_window(deployment)
        if learned is None:
            return None
        configured, source = self.configured_window(deployment)
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
        found = [(self.learned_margin(c) or configured_margin(c), c) for c in target.candidates()]
        (margin, source), largest = max(found, key=lambda f: f[0][0])
        return margin, source + _among(largest, len(found), "largest margin")

    def learned_margin(self, deployment: ResolvedModel) -> tuple[float, str] | None:
        measured = self.facts.windows.margin(deployment)
        if measured is None:
            return None
        configured, source = configured_margin(deployment)
        if measured <= configured:
            return None
        return measured, f"measured on the server's refusal; {source} says {configured:g}"

    # Tool calling

    def calls_tools(self, target: ResolvedModel) -> bool:
        """Whether the model makes structured tool calls: model_info, else learned from its answers, else
        LiteLLM's model map. Small local models mostly write tool calls as text: they get auto-recall instead."""
        if target.supports_function_calling is not None:
            return target.supports_function_calling
        if target.alias in self.tool_callers:
            return True
        return bool(self.facts.supports_function_calling(target.upstream_model))

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

    # The budget

    def budget_for(self, target: ResolvedModel, body: dict[str, Any], recall_tools: bool | None = None) -> Budget:
        """Window, output reserve and tool schemas, each with the setting it came from. ``recall_tools``: whether
        the door may offer the recall tools (the model's policy when None)."""
        # Legacy ``functions`` reach the model just as ``tools`` do.
        tools = sum(count_text(orjson.dumps(body[k]).decode()) for k in ("tools", "functions") if body.get(k))
        if self.offers_recall_tools(target) if recall_tools is None else recall_tools:
            # Reserved even on requests that do not offer them yet: they appear on the first request with a
            # summary or a stub, and a budget that shrank at that moment could tip it over the window.
            tools += recall_tool_tokens()
        return self._budget(target, body, tools)

    def plain_budget(self, target: ResolvedModel) -> Budget:
        """The budget of a request with no tools and no ``max_tokens`` (``check-config`` shows it)."""
        return self._budget(target, {}, 0)

    def _budget(self, target: ResolvedModel, body: dict[str, Any], tools: int) -> Budget:
        lcm = self.config.lcm_settings
        window, window_source = self.window_of(target)
        # The default reserve never takes more than a quarter of the window: 4096 tokens on a 2k-4k local
        # model would leave nothing (or less than nothing) for the messages. A client's own max_tokens counts
        # in full: that is what the upstream will reserve.
        # max_output_tokens: the Responses API's name for it.
        asked = next((k for k in ("max_completion_tokens", "max_output_tokens") if body.get(k)), "max_tokens")
        reserve = body.get(asked) or min(lcm.default_output_reserve, window // 4)
        reserve_source = asked if body.get(asked) else "lcm_settings.default_output_reserve"
        return Budget(window, int(reserve), tools, window_source, reserve_source, *self.margin_of(target))

    # Summaries

    def summary_target(self, request_target: ResolvedModel) -> ResolvedModel:
        """The model that summarises for a request to ``request_target``: lcm_settings.summary_model, else the
        request's own model."""
        name = self.config.lcm_settings.summary_model
        return self.router.resolve(name) if name else request_target

    def summary_window(self, target: ResolvedModel) -> int:
        """What one call to the summary model ``target`` may carry, in o200k tokens as the proxy counts."""
        return int(self.window_of(target)[0] / self.margin_of(target)[0])

    def summarizer_for(self, request_target: ResolvedModel) -> UpstreamSummarizer:
        """The summariser of a request to ``request_target`` (``summary_target``)."""
        return self.summarizer(self.summary_target(request_target))

    def summarizer(self, target: ResolvedModel) -> UpstreamSummarizer:
        """A summariser calling ``target`` itself, its input capped to that model's window."""
        if self.calls is None:
            raise RuntimeError("this policy has no upstream to summarise with")
        timeout = self.config.lcm_settings.summary_timeout
        return UpstreamSummarizer(self.calls, target, timeout, self.summary_window(target), self.priority)


def router_of(config: ProxyConfig) -> ModelRouter:
    """The models of ``config`` as the server resolves them: aliases and fallbacks included."""
    general = config.general_settings
    return ModelRouter(config.model_list, general.fallbacks, general.model_group_alias)
