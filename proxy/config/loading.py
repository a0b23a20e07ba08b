"""Reading the YAML: ``os.environ/`` references resolved, LiteLLM's layout mapped, every problem said at once
with the key path (and the file's line) where the user wrote it."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from proxy.config.litellm_compat import (
    adapt_litellm_config,
    litellm_database_warnings,
    map_general_settings,
    model_list_warnings,
    short_key_warnings,
    unused_environment,
)
from proxy.config.models import unreachable_models
from proxy.config.settings import ENV_PREFIX, GeneralSettings, ProxyConfig
from proxy.errors import ConfigError

# Which ``os.environ/`` references a command needs, by key path (None: all of them, as serving does).
Needed = Callable[[str], bool]


class _Resolver:
    """Replaces every ``"os.environ/NAME"`` string, at any depth, by the variable's value: from the environment,
    else from the config's own ``environment_variables``. An unset variable leaves its reference in place and
    is recorded: in ``missing`` if the command needs that key, else in ``skipped`` (an operator reading the
    database has no use for the upstream's API key, and may not have it)."""

    def __init__(self, environment: Mapping[str, str], needed: Needed | None) -> None:
        self.environment = environment
        self.needed = needed
        self.missing: list[str] = []
        self.skipped: dict[str, str] = {}  # key path -> problem
        self.referenced: set[str] = set()

    def __call__(self, value: Any, path: str = "") -> Any:
        if isinstance(value, dict):
            return {k: self(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, str) and value.startswith(ENV_PREFIX):
            name = value[len(ENV_PREFIX) :]
            self.referenced.add(name)
            if name in os.environ:
                return os.environ[name]
            if name in self.environment:
                return self.environment[name]
            problem = f"{path}: environment variable {name} is not set"
            if self.needed is None or self.needed(path):
                self.missing.append(problem)
            else:
                self.skipped[path] = problem
        return value


def _format_location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or "[" in str(part):
            continue  # validator wrappers pydantic adds to the location; not part of the user's path
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _known_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The keys allowed where an unknown key was found, for a "did you mean"."""
    names = [
        str(part) for part in loc if isinstance(part, str) and "[" not in part and not part.startswith("function-")
    ]
    model: type[BaseModel] = ProxyConfig
    for name in names[:-1]:
        field = model.model_fields.get(name)
        annotation = field.annotation if field else None
        inner = getattr(annotation, "__args__", (annotation,))[0]  # list[ModelDeployment] -> ModelDeployment
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return []
        model = inner
    return list(model.model_fields)


def _describe(error: Any) -> str:
    loc = tuple(error["loc"])
    where = _format_location(loc)
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _known_keys(loc), n=1, cutoff=0.7)
        return f"{where}: unknown key" + (f"; did you mean {close[0]}?" if close else "")
    if error["type"] == "missing":
        return f"{where}: required key is missing"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}"


def parse_config(raw: Any, source: str = "<config>", needed: Needed | None = None) -> ProxyConfig:
    """Validate a loaded config. ``needed`` limits the ``os.environ/`` references that must resolve to the
    key paths it accepts (operator commands); a deployment with an unresolved one cannot be routed to."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(source, ["(top level): expected a mapping of sections"])
    adapted = adapt_litellm_config(raw, GeneralSettings.model_fields)
    resolver = _Resolver(adapted.environment, needed)
    resolved = resolver(adapted.raw)
    problems = resolver.missing + adapted.errors
    master = None
    if isinstance(resolved.get("general_settings"), dict):
        master = resolved["general_settings"].get("master_key")
        resolved["general_settings"] = map_general_settings(resolved["general_settings"], problems)
    try:
        config = ProxyConfig.model_validate(resolved)
    except ValidationError as exc:
        # Every problem at once, unset variables first; not a second complaint about a reference left in place.
        found = [_describe(e) for e in exc.errors()]
        unset = {p.split(": ", 1)[0] for p in resolver.missing}
        skipped = [resolver.skipped[p.split(": ", 1)[0]] for p in found if p.split(": ", 1)[0] in resolver.skipped]
        unset |= set(resolver.skipped)
        found = [p for p in found if p.split(": ", 1)[0] not in unset]
        raise ConfigError(source, [adapted.origin(p) for p in problems + skipped + found]) from None
    general = config.general_settings
    problems += unreachable_models(
        config.model_list, general.fallbacks, general.model_group_alias, config.lcm_settings.summary_model
    )
    if problems:
        raise ConfigError(source, [adapted.origin(p) for p in problems])
    for path, problem in resolver.skipped.items():
        if path.startswith("model_list["):
            config.model_list[int(path[len("model_list[") : path.index("]")])]._unresolved.append(problem)
    config._warnings = (
        adapted.warnings
        + unused_environment(adapted.environment, resolver.referenced)
        + model_list_warnings(config.model_list)
        + short_key_warnings([k.key for k in config.general_settings.api_keys], master)
        + litellm_database_warnings(config.general_settings.database_url)
    )
    return config


def load_config(path: str | Path, needed: Needed | None = None) -> ProxyConfig:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read file: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not UTF-8 text (byte {exc.start})"]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not valid YAML: {_yaml_problem(exc, path)}"]) from None
    return parse_config(raw, str(path), needed)


def _yaml_problem(exc: yaml.YAMLError, path: Path) -> str:
    """PyYAML's message, naming the file where it says ``"<unicode string>"``; marks count from 1."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return str(exc)
    mark = exc.problem_mark
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}"
    context = ""
    if exc.context and exc.context_mark is not None:
        context = f" ({exc.context} at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1})"
    return f"{where}: {exc.problem}{context}"
