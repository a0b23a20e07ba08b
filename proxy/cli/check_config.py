"""What ``check-config`` says about each model: its deployments and fallbacks, the window the proxy manages
against and where that number came from, the output reserve, and the thresholds compaction and interception
work to.

A window that silently fell back to the default (a misspelt ``max_input_tokens``, a model LiteLLM's map does
not know) decides when compaction starts and what is refused; it should be visible before the first request,
not inferred from a 400. LiteLLM is imported only when a model's window is not in the config itself.
"""

from __future__ import annotations

from proxy.config.settings import ModelDeployment, ProxyConfig
from proxy.engine.budget import sizes
from proxy.relay.policy import ModelPolicy, WindowLookup, router_of
from proxy.upstream.balancer import WEIGHTS
from proxy.upstream.routing import ResolvedModel, upstream_of
from proxy.upstream.windows import ServerWindows


class _ModelMap:
    """What ``check-config`` knows of a model beyond its config: LiteLLM's model map, imported on first use
    only, and nothing from its servers (none is asked)."""

    def __init__(self, config: ProxyConfig, windows: WindowLookup | None) -> None:
        self._config = config
        self._lookup = windows
        self.windows = ServerWindows()

    def context_window(self, model: str) -> int | None:
        if self._lookup is None:
            from proxy.upstream.client import Upstream

            self._lookup = Upstream(self._config.general_settings).context_window
        return self._lookup(model)

    def supports_function_calling(self, model: str) -> bool | None:
        return None  # the report budgets a request without tools: whether the model calls them does not count


def _n(tokens: int) -> str:
    return f"{tokens:,}"


def model_report(config: ProxyConfig, windows: WindowLookup | None = None) -> list[str]:
    """Lines for ``check-config``: per model, its deployments and fallbacks, then the window, reserve and
    thresholds of the smallest of them (for a request with no tools and no instructions; those come off the
    message limit)."""
    lcm = config.lcm_settings
    general = config.general_settings
    router = router_of(config)
    policy = ModelPolicy(config, router, _ModelMap(config, windows))
    lines: list[str] = []
    groups: dict[str, list[ModelDeployment]] = {}
    for deployment in config.model_list:
        groups.setdefault(deployment.model_name, []).append(deployment)
    for name, deployments in groups.items():
        lines += _deployment_lines(name, deployments, config.general_settings.routing_strategy)
        aliases = [
            alias + ("" if isinstance(t, str) or not t.hidden else " (hidden from /v1/models)")
            for alias, t in general.model_group_alias.items()
            if (t if isinstance(t, str) else t.model) == name
        ]
        if aliases:
            lines.append(f"    aliases:     {', '.join(aliases)} (router_settings.model_group_alias)")
        fallbacks = router.fallbacks_of(name)
        if fallbacks:
            lines.append(f"    fallbacks:   {', '.join(fallbacks)} (tried in this order once all of {name} failed)")
        if "*" in name:
            lines.append("    window:      depends on the model name asked for (LiteLLM's model map, else the default)")
            continue
        target = router.resolve(name)
        budget = policy.plain_budget(target)
        window, source, reserve = budget.window, budget.window_source, budget.output_reserve
        margin, margin_source = budget.margin, budget.margin_source
        summary_target = policy.summary_target(target)
        s = sizes(lcm, budget.for_messages(0), policy.summary_window(summary_target))
        lines += [
            f"    window:      {_n(window)} tokens ({source})",
            *_server_window_line(config, target),
            f"    reserve:     {_n(reserve)} tokens for the answer without max_tokens"
            " (lcm_settings.default_output_reserve, at most 1/4 of the window)",
            f"    margin:      {margin:g} ({margin_source})",
            f"    messages:    {_n(s.limit)} tokens less the request's instructions and tools"
            + (f" ({_n(s.recall)} for auto-recall)" if s.recall else ""),
            f"    compaction:  above {_n(s.soft)} tokens (soft threshold), down to {_n(s.target)} (target),"
            f" summaries by {summary_target.alias}",
            f"    large files: over {_n(s.large_file)} tokens (lcm_settings.large_file_token_threshold)",
            f"    tool results: over {_n(s.tool_result)} tokens (lcm_settings.tool_result_token_threshold)",
        ]
    return lines


def _server_window_line(config: ProxyConfig, target: ResolvedModel) -> list[str]:
    """Where else the window may come from: the server itself (``proxy.upstream.windows``), when it is local."""
    if not any(c.litellm_params.get("api_base") for c in target.candidates()):
        return []
    if config.lcm_settings.probe_context_window:
        how = "asked at startup (GET /props, /v1/models) or learned from a refusal"
    else:
        how = "learned from a refusal (lcm_settings.probe_context_window: false)"
    return [f"    server:      its own context size when smaller, {how}"]


def _deployment_lines(name: str, deployments: list[ModelDeployment], strategy: str) -> list[str]:
    """``model NAME -> where`` for one deployment; for several, how they share the requests and each one."""
    if len(deployments) == 1:
        return [f"  model {name} -> {upstream_of(deployments[0])}"]
    lines = [f"  model {name} -> {len(deployments)} deployments ({strategy}; the next one on a failure)"]
    for deployment in deployments:
        params = deployment.litellm_params.model_extra or {}
        weight = next((f" ({key} {params[key]})" for key in WEIGHTS if params.get(key)), "")
        lines.append(f"    deployment:  {upstream_of(deployment)}{weight}")
    return lines
