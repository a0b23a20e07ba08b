"""Model aliases: which deployment serves the ``model`` a client asked for.

Follows LiteLLM proxy's ``model_list`` semantics: an exact ``model_name`` wins; otherwise wildcard entries
(``"*"``, ``"openai/*"``, ``"claude-*"``) match, most specific pattern first, and a ``*`` in the
deployment's ``litellm_params.model`` is replaced by the part of the name the pattern's ``*`` matched.
Of several deployments under one name only the first is used (the config loader warns about the others).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from proxy.config import ModelDeployment
from proxy.errors import ConfigError, NotFoundError


@dataclass(frozen=True)
class ResolvedModel:
    alias: str  # the name the client used
    litellm_params: dict[str, Any]  # with ``model`` made concrete (wildcards substituted)
    max_input_tokens: int | None  # from model_info, if configured
    max_output_tokens: int | None
    supports_function_calling: bool | None = None
    token_margin: float | None = None  # from model_info; see ``proxy.engine.tokens.token_margin``

    @property
    def upstream_model(self) -> str:
        return str(self.litellm_params["model"])


def safe_url(url: str) -> str:
    """``api_base`` for a log line or a report: without user info, query or fragment (where keys hide)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "(unparsable api_base)"
    host = parts.hostname or ""
    host = (f"[{host}]" if ":" in host else host) + (f":{port}" if port is not None else "")
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def upstream_of(deployment: ModelDeployment) -> str:
    """``openai/local-model at http://127.0.0.1:8080/v1``: where a model alias goes, never with its key."""
    params = deployment.litellm_params
    return params.model + (f" at {safe_url(params.api_base)}" if params.api_base else "")


def effective_window(target: ResolvedModel, known: Callable[[str], int | None], default: int) -> tuple[int, str]:
    """The model's input window and where it came from: model_info, else ``known`` (LiteLLM's model map),
    else ``default`` (lcm_settings.default_context_window)."""
    if target.max_input_tokens:
        return target.max_input_tokens, "model_info.max_input_tokens"
    window = known(target.upstream_model)
    if window:
        return window, "LiteLLM's model map; set model_info.max_input_tokens"
    return default, "lcm_settings.default_context_window"


def _wildcard_capture(pattern: str, name: str) -> str | None:
    prefix, _, suffix = pattern.partition("*")
    if len(name) < len(prefix) + len(suffix) or not name.startswith(prefix) or not name.endswith(suffix):
        return None
    return name[len(prefix) : len(name) - len(suffix)]


class ModelRouter:
    def __init__(self, deployments: list[ModelDeployment]) -> None:
        self._exact: dict[str, ModelDeployment] = {}
        wildcards: list[ModelDeployment] = []
        for d in deployments:
            if "*" in d.model_name:
                wildcards.append(d)
            else:
                self._exact.setdefault(d.model_name, d)
        # Most specific first: the longest literal part of the pattern.
        self._wildcards = sorted(wildcards, key=lambda d: -len(d.model_name.replace("*", "")))

    def public_names(self) -> list[str]:
        return list(self._exact)

    def deployment_for(self, name: str) -> tuple[ModelDeployment, str] | None:
        """The deployment serving ``name`` and what its wildcard captured, or None."""
        deployment = self._exact.get(name)
        if deployment is not None:
            return deployment, ""
        for candidate in self._wildcards:
            match = _wildcard_capture(candidate.model_name, name)
            if match is not None:
                return candidate, match
        return None

    def resolve(self, name: str) -> ResolvedModel:
        found = self.deployment_for(name)
        if found is None:
            raise NotFoundError(
                f"The model `{name}` does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        deployment, captured = found
        if deployment._unresolved:  # loaded for a command that did not expect to call it (operator commands)
            raise ConfigError(f"the deployment of model {name!r}", list(deployment._unresolved))
        params = deployment.litellm_params.model_dump(exclude_none=True)
        if "*" in params["model"]:
            params["model"] = params["model"].replace("*", captured)
        info = deployment.model_info
        return ResolvedModel(
            alias=name,
            litellm_params=params,
            max_input_tokens=info.max_input_tokens,
            max_output_tokens=info.max_output_tokens or info.max_tokens,
            supports_function_calling=info.supports_function_calling,
            token_margin=info.token_margin,
        )
