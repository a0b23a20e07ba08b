"""Model aliases: which deployment serves the ``model`` a client asked for.

Follows LiteLLM proxy's ``model_list`` semantics: an exact ``model_name`` wins; otherwise wildcard entries
(``"*"``, ``"openai/*"``, ``"claude-*"``) match, most specific pattern first, and a ``*`` in the
deployment's ``litellm_params.model`` is replaced by the part of the name the pattern's ``*`` matched.
Several deployments under one name are tried in configured order (the first is used; load balancing is
LiteLLM Router's job and out of scope here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.config import ModelDeployment
from proxy.errors import NotFoundError


@dataclass(frozen=True)
class ResolvedModel:
    alias: str  # the name the client used
    litellm_params: dict[str, Any]  # with ``model`` made concrete (wildcards substituted)
    max_input_tokens: int | None  # from model_info, if configured
    max_output_tokens: int | None
    supports_function_calling: bool | None = None

    @property
    def upstream_model(self) -> str:
        return str(self.litellm_params["model"])


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

    def resolve(self, name: str) -> ResolvedModel:
        deployment = self._exact.get(name)
        captured = ""
        if deployment is None:
            for candidate in self._wildcards:
                match = _wildcard_capture(candidate.model_name, name)
                if match is not None:
                    deployment, captured = candidate, match
                    break
        if deployment is None:
            raise NotFoundError(
                f"The model `{name}` does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
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
        )
