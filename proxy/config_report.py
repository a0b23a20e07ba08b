"""What ``check-config`` says about each model: the window the proxy manages against and where that number
came from, the output reserve, and the thresholds compaction and interception work to.

A window that silently fell back to the default (a misspelt ``max_input_tokens``, a model LiteLLM's map does
not know) decides when compaction starts and what is refused; it should be visible before the first request,
not inferred from a 400. LiteLLM is imported only when a model's window is not in the config itself.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.config import ProxyConfig
from proxy.engine.budget import Budget, sizes
from proxy.engine.tokens import token_margin
from proxy.routing import ModelRouter, ResolvedModel, effective_window, upstream_of

WindowLookup = Callable[[str], "int | None"]


class _LiteLLMWindows:
    """LiteLLM's model map, imported on first use only."""

    def __init__(self, config: ProxyConfig) -> None:
        self._config = config
        self._lookup: WindowLookup | None = None

    def __call__(self, model: str) -> int | None:
        if self._lookup is None:
            from proxy.upstream import Upstream

            self._lookup = Upstream(self._config.general_settings).context_window
        return self._lookup(model)


def _n(tokens: int) -> str:
    return f"{tokens:,}"


def model_report(config: ProxyConfig, windows: WindowLookup | None = None) -> list[str]:
    """Lines for ``check-config``: per model, its window, reserve and thresholds (for a request with no tools
    and no instructions; those come off the message limit)."""
    lookup = windows or _LiteLLMWindows(config)
    lcm = config.lcm_settings
    router = ModelRouter(config.model_list)
    default = lcm.default_context_window
    lines: list[str] = []
    for deployment in config.model_list:
        lines.append(f"  model {deployment.model_name} -> {upstream_of(deployment)}")
        if "*" in deployment.model_name:
            lines.append("    window:      depends on the model name asked for (LiteLLM's model map, else the default)")
            continue
        target = router.resolve(deployment.model_name)
        window, source = effective_window(target, lookup, default)
        margin, margin_source = token_margin(
            target.upstream_model, target.litellm_params.get("api_base"), target.token_margin
        )
        reserve = min(lcm.default_output_reserve, window // 4)
        budget = Budget(
            window=window, output_reserve=reserve, tools=0, window_source=source,
            reserve_source="lcm_settings.default_output_reserve", margin=margin, margin_source=margin_source,
        )  # fmt: skip
        summary_target = _summary_target(config, router, target)
        summary_window = effective_window(summary_target, lookup, default)[0]
        summary_margin = token_margin(
            summary_target.upstream_model, summary_target.litellm_params.get("api_base"), summary_target.token_margin
        )[0]
        s = sizes(lcm, budget.for_messages(0), int(summary_window / summary_margin))
        lines += [
            f"    window:      {_n(window)} tokens ({source})",
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


def _summary_target(config: ProxyConfig, router: ModelRouter, target: ResolvedModel) -> ResolvedModel:
    name = config.lcm_settings.summary_model
    return router.resolve(name) if name else target
