"""A LiteLLM proxy config, read as one: what maps onto lcm-proxy's settings, what is ignored, what looks misspelt.

A LiteLLM user's first step is to point lcm-proxy at the config they have. Refusing it key by key
(``master_key``, ``litellm_settings``...) teaches them nothing; accepting it silently hides that their
callbacks or budgets do nothing here. So: what has a meaning here is used (``general_settings.master_key``
becomes an API key, ``database_url: sqlite:///DIR`` the data directory, ``environment_variables`` answers
``os.environ/NAME`` references, ``litellm_settings.request_timeout`` the upstream timeout), every other
LiteLLM key is dropped with one warning naming it, and a key that is neither ours nor LiteLLM's is still an
error (that is a typo). Inside ``model_info`` and ``litellm_params`` unknown keys are LiteLLM's to interpret,
so a near miss of a key that matters (``api_bse``, ``max_input_token``) is a warning, not an error.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.litellm_keys import (
    LITELLM_GENERAL_SETTINGS,
    LITELLM_PARAMS_KEYS,
    LITELLM_SECTIONS,
    MODEL_INFO_KEYS,
    NOT_A_TYPO,
)
from proxy.store import is_postgres_url

IGNORED = "a LiteLLM proxy setting that lcm-proxy does not use"
MASTER_TENANT = "master"
DB_FILE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
# Mapped after ``os.environ/`` references are resolved, so these may be references too.
MAPPED_GENERAL = ("master_key", "database_url")


@dataclass
class Adapted:
    """The config with LiteLLM-only keys removed, plus what they told us."""

    raw: dict[str, Any]
    environment: dict[str, str] = field(default_factory=dict)  # the config's environment_variables
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _keys(value: Any) -> str:
    return f": {', '.join(str(k) for k in value)}" if isinstance(value, dict) and value else ""


def adapt_litellm_config(raw: dict[str, Any], our_general: Iterable[str]) -> Adapted:
    """Drop the sections and ``general_settings`` keys only LiteLLM's proxy uses (one warning each), before
    ``os.environ/`` references are resolved: a reference inside an ignored key never needs its variable."""
    out = Adapted(dict(raw))
    environment = out.raw.pop("environment_variables", None)
    if isinstance(environment, dict) and all(isinstance(v, str | int | float) for v in environment.values()):
        out.environment = {str(k): str(v) for k, v in environment.items() if not isinstance(v, bool)}
    elif environment is not None:
        out.errors.append("environment_variables: expected a mapping of variable names to values")

    litellm_settings = out.raw.pop("litellm_settings", None)
    if isinstance(litellm_settings, dict):
        litellm_settings = dict(litellm_settings)
        timeout = litellm_settings.pop("request_timeout", None)
        general = out.raw.get("general_settings")
        if timeout is not None and (general is None or isinstance(general, dict)):
            general = dict(general or {})
            if "request_timeout" not in general:
                general["request_timeout"] = timeout  # the same meaning: seconds for one upstream call
                out.raw["general_settings"] = general
    if litellm_settings:
        out.warnings.append(f"litellm_settings: ignored ({IGNORED}){_keys(litellm_settings)}")
    for section in sorted(LITELLM_SECTIONS & set(out.raw)):
        out.warnings.append(f"{section}: ignored ({IGNORED}){_keys(out.raw.pop(section))}")

    general = out.raw.get("general_settings")
    if isinstance(general, dict):
        ours = set(our_general) | set(MAPPED_GENERAL)
        ignored = sorted(str(k) for k in general if k in LITELLM_GENERAL_SETTINGS and k not in ours)
        out.raw["general_settings"] = {k: v for k, v in general.items() if k not in ignored}
        out.warnings += [f"general_settings.{key}: ignored ({IGNORED})" for key in ignored]
    return out


def map_general_settings(general: dict[str, Any], errors: list[str]) -> dict[str, Any]:
    """``master_key`` and ``database_url`` (already resolved) as lcm-proxy settings."""
    general = dict(general)
    master = general.pop("master_key", None)
    if master is not None:
        if not isinstance(master, str):
            errors.append("general_settings.master_key: expected a string")
        else:
            keys = general.get("api_keys") or []
            if isinstance(keys, list):
                # The master key is an admin key (see ``ApiKey.admin``); listed among api_keys too, that entry
                # becomes one, keeping its tenant.
                general["api_keys"] = [_as_admin(k, master) for k in keys]
                listed = {k if isinstance(k, str) else k.get("key") for k in keys if isinstance(k, str | dict)}
                if master not in listed:
                    general["api_keys"].append({"key": master, "tenant": MASTER_TENANT, "admin": True})
    url = general.pop("database_url", None)
    if isinstance(url, str) and is_postgres_url(url):
        general["database_url"] = _postgres_url(url, errors)
    elif url is not None:
        data_dir = _data_dir_from_url(url, errors)
        if data_dir is not None:
            if general.get("data_dir") is not None and Path(str(general["data_dir"])) != data_dir:
                errors.append("general_settings.database_url: names another place than general_settings.data_dir")
            general["data_dir"] = str(data_dir)
    return general


def _as_admin(entry: Any, master: str) -> Any:
    from proxy.config import tenant_for_bare_key  # proxy.config imports this module

    if entry == master:
        return {"key": master, "tenant": tenant_for_bare_key(master), "admin": True}
    if isinstance(entry, dict) and entry.get("key") == master:
        return {**entry, "admin": True}
    return entry


def _postgres_url(url: str, errors: list[str]) -> str | None:
    """``postgresql://...`` as libpq takes it: SQLAlchemy's ``postgresql+driver://`` loses its driver."""
    scheme, _, rest = url.partition("://")
    if not rest:
        errors.append("general_settings.database_url: expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
        return None
    return f"postgresql://{rest}" if "+" in scheme else url


def _data_dir_from_url(url: Any, errors: list[str]) -> Path | None:
    """``sqlite:///DIR`` (or the directory of ``sqlite:///DIR/NAME.db``)."""
    where = "general_settings.database_url"
    if not isinstance(url, str):
        errors.append(f"{where}: expected a string")
        return None
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme != "sqlite" or not rest.startswith("/") or rest == "/":
        errors.append(
            f"{where}: expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or sqlite:///DIRECTORY"
            " (lcm-proxy keeps a SQLite database there)"
        )
        return None
    path = Path(rest[1:]).expanduser()  # sqlite:///relative, sqlite:////absolute (SQLAlchemy's form)
    return path.parent if path.suffix in DB_FILE_SUFFIXES else path


def unused_environment(environment: Mapping[str, str], referenced: set[str]) -> list[str]:
    return [
        f"environment_variables.{name}: not referenced by any os.environ/{name} in this file; lcm-proxy does"
        " not export it to the process (set it in the environment instead)"
        for name in environment
        if name not in referenced
    ]


def near_misses(keys: Iterable[str], known: frozenset[str], where: str) -> list[str]:
    """A warning for each key that is not ``known`` but nearly is: probably a typo LiteLLM would ignore."""
    found = []
    for key in keys:
        if key in known or key in NOT_A_TYPO:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
        if close:
            found.append(f"{where}.{key}: unknown key; did you mean {close[0]}?")
    return found


def model_key_warnings(index: int, params_extra: Iterable[str], info_extra: Iterable[str]) -> list[str]:
    where = f"model_list[{index}]"
    return near_misses(params_extra, LITELLM_PARAMS_KEYS, f"{where}.litellm_params") + near_misses(
        info_extra, MODEL_INFO_KEYS, f"{where}.model_info"
    )
