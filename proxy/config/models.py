"""Model names: which ``model_list`` group a name a client may send belongs to (LiteLLM's rules: an alias is
resolved once, then an exact ``model_name`` wins, else the most specific wildcard), and the names the config
itself uses that no request could reach. Which deployment answers, and after which fallbacks, is the
upstream's business (``proxy.upstream.routing``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Generic, Protocol, TypeVar


class ModelDeployment(Protocol):
    """What the names need of a ``model_list`` entry (``proxy.config.settings.ModelDeployment``)."""

    @property
    def model_name(self) -> str: ...


class ModelGroupAlias(Protocol):
    """The long form of a ``model_group_alias`` entry (``proxy.config.settings.ModelGroupAlias``)."""

    @property
    def model(self) -> str: ...

    @property
    def hidden(self) -> bool: ...


def _wildcard_capture(pattern: str, name: str) -> str | None:
    prefix, _, suffix = pattern.partition("*")
    if len(name) < len(prefix) + len(suffix) or not name.startswith(prefix) or not name.endswith(suffix):
        return None
    return name[len(prefix) : len(name) - len(suffix)]


D = TypeVar("D", bound=ModelDeployment)


class ModelNames(Generic[D]):
    def __init__(self, deployments: Sequence[D], aliases: Mapping[str, str | ModelGroupAlias] | None = None) -> None:
        self._aliases = {a: t if isinstance(t, str) else t.model for a, t in (aliases or {}).items()}
        self._shown = [a for a, t in (aliases or {}).items() if isinstance(t, str) or not t.hidden]
        self._groups: dict[str, list[tuple[int, D]]] = {}
        for index, deployment in enumerate(deployments):
            self._groups.setdefault(deployment.model_name, []).append((index, deployment))
        # Most specific first: the longest literal part of the pattern.
        self._wildcards = sorted((n for n in self._groups if "*" in n), key=lambda n: -len(n.replace("*", "")))

    def public_names(self) -> list[str]:
        names = [name for name in self._groups if "*" not in name]
        return names + [a for a in self._shown if a not in names]

    def group_for(self, name: str) -> tuple[str, list[tuple[int, D]], str] | None:
        """The model_name serving ``name`` (an alias's target's), its deployments (with their model_list index)
        and what its wildcard captured, or None."""
        return self._group(self._aliases.get(name, name))

    def _group(self, name: str) -> tuple[str, list[tuple[int, D]], str] | None:
        if name in self._groups and "*" not in name:
            return name, self._groups[name], ""
        for pattern in self._wildcards:
            match = _wildcard_capture(pattern, name)
            if match is not None:
                return pattern, self._groups[pattern], match
        return None

    def deployment_for(self, name: str) -> tuple[D, str] | None:
        """The first deployment serving ``name`` and what its wildcard captured, or None."""
        found = self.group_for(name)
        return None if found is None else (found[1][0][1], found[2])


def unreachable_models(
    model_list: Sequence[ModelDeployment],
    fallbacks: Sequence[Mapping[str, Sequence[str]]],
    aliases: Mapping[str, str | ModelGroupAlias],
    summary_model: str | None,
) -> list[str]:
    """The summary model, every name in ``fallbacks`` and every alias's target must be models some request
    could reach: they pass validation otherwise, and then every compaction (every fallback, every request for
    the alias) fails at run time. They are named by ``general_settings.fallbacks`` and
    ``general_settings.model_group_alias``; the config loader renames those to where the user wrote them."""
    router: ModelNames[ModelDeployment] = ModelNames(model_list, aliases=aliases)
    named: list[tuple[str, str]] = []
    if summary_model is not None:
        named.append(("lcm_settings.summary_model", summary_model))
    for index, entry in enumerate(fallbacks):
        where = f"general_settings.fallbacks[{index}]"
        for name, chain in entry.items():
            named += [(where, name)] + [(f"{where}.{name}[{i}]", other) for i, other in enumerate(chain)]
    # An alias's target is not resolved as an alias again.
    unaliased: ModelNames[ModelDeployment] = ModelNames(model_list)
    targets = [(alias, t if isinstance(t, str) else t.model) for alias, t in aliases.items()]
    return [
        f"{path}: {name!r} is not a model_name in model_list (nor matched by a wildcard model_name)"
        for path, name in named
        if router.deployment_for(name) is None
    ] + [
        f"general_settings.model_group_alias.{alias}: {target!r} is not a model_name in model_list (nor matched by"
        " a wildcard model_name)"
        for alias, target in targets
        if unaliased.deployment_for(target) is None
    ]
