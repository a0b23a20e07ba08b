"""Model aliases: which deployments may serve the ``model`` a client asked for.

Follows LiteLLM proxy's ``model_list`` semantics: an exact ``model_name`` wins; otherwise wildcard entries
(``"*"``, ``"openai/*"``, ``"claude-*"``) match, most specific pattern first, and a ``*`` in the
deployment's ``litellm_params.model`` is replaced by the part of the name the pattern's ``*`` matched.
Entries sharing a ``model_name`` are deployments of one model (a *model group*); ``general_settings.fallbacks``
(LiteLLM's ``router_settings.fallbacks``) names the models whose deployments are tried after them. Which
deployment of a group goes first is decided per call (``proxy.upstream.balancer``), not here.

``general_settings.model_group_alias`` (LiteLLM's ``router_settings.model_group_alias``) gives a group other
names. As in LiteLLM's router, an alias is resolved once, before the name is looked up (so it wins over a
model_name it shadows, and its target is not resolved as an alias again); the target is then found like any
name (exact, else wildcard). ``/v1/models`` lists the aliases not marked ``hidden``. The resolved model keeps
the name the client asked for (errors and logs say "model 'gpt-4'"), and its fallbacks are the alias's own,
else its target's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from proxy.config.models import ModelNames
from proxy.config.settings import ModelDeployment, ModelGroupAlias
from proxy.errors import ConfigError, NotFoundError

Tier = tuple["ResolvedModel", ...]  # the deployments of one model group, in model_list order


@dataclass(frozen=True)
class ResolvedModel:
    """One deployment of the model a client asked for; ``tiers`` holds every deployment that may answer."""

    alias: str  # the name the client used (for a fallback deployment: the fallback model's name)
    litellm_params: dict[str, Any]  # with ``model`` made concrete (wildcards substituted)
    max_input_tokens: int | None  # from model_info, if configured
    max_output_tokens: int | None
    supports_function_calling: bool | None = None
    token_margin: float | None = None  # from model_info; see ``proxy.tokens.token_margin``
    deployment: str = ""  # "model_list[3]": the entry it came from (its in-flight count and cooldown)
    mode: str | None = None  # model_info.mode (LiteLLM's key): "responses" calls it with the Responses API
    direct: bool = True  # model_info.lcm_direct: false sends its chat calls through LiteLLM (proxy.upstream.direct)
    # This model's deployments (this one first), then each fallback model's; empty: this deployment alone.
    tiers: tuple[Tier, ...] = ()

    @property
    def upstream_model(self) -> str:
        return str(self.litellm_params["model"])

    def chain(self) -> tuple[Tier, ...]:
        return self.tiers or ((self,),)

    def candidates(self) -> list[ResolvedModel]:
        """Every deployment that may answer a call to this model, in model_list order."""
        return [candidate for tier in self.chain() for candidate in tier]


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


def _where(model: str, api_base: Any) -> str:
    return model + (f" at {safe_url(api_base)}" if isinstance(api_base, str) and api_base else "")


def upstream_of(deployment: ModelDeployment) -> str:
    """``openai/local-model at http://127.0.0.1:8080/v1``: where a model alias goes, never with its key."""
    return _where(deployment.litellm_params.model, deployment.litellm_params.api_base)


def deployment_of(target: ResolvedModel) -> str:
    """The same for a resolved deployment (its wildcard substituted): for log lines, never with a key."""
    return _where(target.upstream_model, target.litellm_params.get("api_base"))


class ModelRouter(ModelNames[ModelDeployment]):
    """The names of ``ModelNames`` with fallbacks: every deployment that may answer a request for a name."""

    def __init__(
        self,
        deployments: Sequence[ModelDeployment],
        fallbacks: Iterable[Mapping[str, Sequence[str]]] = (),
        aliases: Mapping[str, str | ModelGroupAlias] | None = None,
    ) -> None:
        super().__init__(deployments, aliases)
        self._fallbacks: dict[str, list[str]] = {}
        for entry in fallbacks:
            for name, chain in entry.items():
                self._fallbacks.setdefault(name, []).extend(chain)

    def deployments(self) -> list[ResolvedModel]:
        """Every deployment of every model that is not a wildcard, in model_list order."""
        return sorted((d for name in self.public_names() for d in self._tier(name, required=False)), key=_index)

    def fallbacks_of(self, name: str) -> list[str]:
        """The models tried after ``name``'s deployments: by the name asked for, else (for an alias) by its
        target, else by its model_name."""
        for key in (name, self._aliases.get(name)):
            if key is not None and key in self._fallbacks:
                return self._fallbacks[key]
        found = self.group_for(name)
        return [] if found is None else self._fallbacks.get(found[0], [])

    def resolve(self, name: str) -> ResolvedModel:
        tier = self._tier(name, required=True)
        tiers = [tier]
        seen = {name}
        for other in self.fallbacks_of(name):
            if other not in seen:
                seen.add(other)
                tiers.append(self._tier(other, required=False))
        tiers = [t for t in tiers if t]
        if len(tiers) == 1 and len(tier) == 1:
            return tier[0]
        return dataclasses.replace(tier[0], tiers=tuple(tiers))

    def _tier(self, name: str, required: bool) -> Tier:
        found = self.group_for(name)
        if found is None:
            if not required:
                return ()
            raise NotFoundError(
                f"The model `{name}` does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        _, deployments, captured = found
        # Deployments left unresolved for a command that did not expect to call them (operator commands).
        usable = [(i, d) for i, d in deployments if not d._unresolved]
        if required and not usable:
            raise ConfigError(f"the deployment of model {name!r}", list(deployments[0][1]._unresolved))
        return tuple(_resolved(name, index, deployment, captured) for index, deployment in usable)


def _index(target: ResolvedModel) -> int:
    return int(target.deployment.removeprefix("model_list[").removesuffix("]") or 0)


def _resolved(name: str, index: int, deployment: ModelDeployment, captured: str) -> ResolvedModel:
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
        deployment=f"model_list[{index}]",
        mode=_mode(info.model_extra),
        direct=info.lcm_direct,
    )


def _mode(extra: dict[str, Any] | None) -> str | None:
    mode = (extra or {}).get("mode")
    return mode if isinstance(mode, str) else None
