"""A LiteLLM proxy config, read as one: what maps onto lcm-proxy's settings, what is ignored, what looks misspelt.

A LiteLLM user's first step is to point lcm-proxy at the config they have. Refusing it key by key
(``master_key``, ``litellm_settings``...) teaches them nothing; accepting it silently hides that their
callbacks or budgets do nothing here. So: what has a meaning here is used (``general_settings.master_key``
becomes an API key, ``database_url: sqlite:///DIR`` the data directory, ``environment_variables`` answers
``os.environ/NAME`` references, the router's and the module's timeouts, retries, routing strategy, fallbacks,
cooldown and ``drop_params`` become ``general_settings``: see ``MAPPED_SETTINGS``), every other LiteLLM key
is dropped with one warning naming it, and a key that is neither ours nor LiteLLM's is still an error (that is
a typo). A problem with a mapped value names the key where the user wrote it (``Adapted.origin``). Inside
``model_info`` and ``litellm_params`` unknown keys are LiteLLM's to interpret, so a near miss of a key that
matters (``api_bse``, ``max_input_token``) is a warning, not an error.
"""

from __future__ import annotations

import difflib
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.config.litellm_keys import (
    LITELLM_GENERAL_SETTINGS,
    LITELLM_PARAMS_KEYS,
    LITELLM_ROUTING_STRATEGIES,
    LITELLM_SECTIONS,
    MAPPED_SETTINGS,
    MODEL_INFO_KEYS,
    NOT_A_TYPO,
    ROUTING_STRATEGIES,
)
from proxy.scopes import tenant_for_bare_key
from proxy.store.location import is_postgres_url

IGNORED = "a LiteLLM proxy setting that lcm-proxy does not use"
MASTER_TENANT = "master"
DB_FILE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
# Mapped after ``os.environ/`` references are resolved, so these may be references too.
MAPPED_GENERAL = ("master_key", "database_url")
MAX_UPSTREAM_RETRIES = 10  # general_settings.upstream_retries' range is 0..this
SHORT_KEY = 8  # a proxy key shorter than this is accepted (LiteLLM's docs use sk-1234) with a warning
# The database LiteLLM proxy's docs and docker-compose name for its own tables (DATABASE_URL .../litellm).
LITELLM_DATABASE_NAME = "litellm"
OWN_DATABASE = (
    "lcm-proxy keeps its conversations in this database too (its own tables, in schema lcm, beside LiteLLM's,"
    " which it never touches); a database of its own (e.g. CREATE DATABASE lcm_proxy) keeps their backups,"
    " access and load apart"
)


@dataclass
class Adapted:
    """The config with LiteLLM-only keys removed, plus what they told us."""

    raw: dict[str, Any]
    environment: dict[str, str] = field(default_factory=dict)  # the config's environment_variables
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)  # "general_settings.upstream_retries" -> where it was

    def origin(self, problem: str) -> str:
        """``problem`` naming the key the user wrote, not the ``general_settings`` key it was mapped to."""
        for ours, theirs in self.origins.items():
            if problem.startswith(ours) and problem[len(ours) : len(ours) + 1] in ("", ":", ".", "["):
                return theirs + problem[len(ours) :]
        return problem


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

    settings = {name: out.raw.pop(name, None) for name in ("litellm_settings", "router_settings")}
    sections = {name: dict(value) for name, value in settings.items() if isinstance(value, dict)}
    _map_settings(out, sections)
    for name, value in settings.items():
        left = sections.get(name, value)
        if left:
            out.warnings.append(f"{name}: ignored ({IGNORED}){_keys(left)}")
    for section in sorted(LITELLM_SECTIONS & set(out.raw)):
        out.warnings.append(f"{section}: ignored ({IGNORED}){_keys(out.raw.pop(section))}")

    general = out.raw.get("general_settings")
    if isinstance(general, dict):
        ours = set(our_general) | set(MAPPED_GENERAL)
        ignored = sorted(str(k) for k in general if k in LITELLM_GENERAL_SETTINGS and k not in ours)
        out.raw["general_settings"] = {k: v for k, v in general.items() if k not in ignored}
        out.warnings += [f"general_settings.{key}: ignored ({IGNORED})" for key in ignored]
    return out


def _map_settings(out: Adapted, sections: dict[str, dict[str, Any]]) -> None:
    """Move the LiteLLM settings that have a meaning here (``MAPPED_SETTINGS``) out of ``sections`` and into
    ``general_settings``, unless it sets them itself."""
    general = out.raw.get("general_settings")
    if general is not None and not isinstance(general, dict):
        return  # reported by validation
    general = dict(general or {})
    for ours in dict.fromkeys(MAPPED_SETTINGS.values()):
        found = [
            (f"{section}.{key}", sections[section].pop(key))
            for (section, key), target in MAPPED_SETTINGS.items()
            if target == ours and key in sections.get(section, {})
        ]
        if not found or ours in general:
            continue
        (path, value), others = found[0], found[1:]
        out.warnings += [f"{where}: {path} ({value!r}) is used instead" for where, other in others if other != value]
        general[ours] = _mapped_value(ours, path, value, out.warnings)
        out.origins[f"general_settings.{ours}"] = path
    if general:
        out.raw["general_settings"] = general


def _mapped_value(ours: str, path: str, value: Any, warnings: list[str]) -> Any:
    """What a LiteLLM value means here: a retry count within our range, a strategy we implement."""
    if ours == "upstream_retries" and isinstance(value, int) and not isinstance(value, bool):
        capped = min(max(value, 0), MAX_UPSTREAM_RETRIES)
        if capped != value:
            warnings.append(
                f"{path}: {value} is outside general_settings.upstream_retries' range (0-{MAX_UPSTREAM_RETRIES});"
                f" {capped} is used"
            )
        return capped
    known = isinstance(value, str) and value in LITELLM_ROUTING_STRATEGIES
    if ours == "routing_strategy" and known and value not in ROUTING_STRATEGIES:
        warnings.append(f"{path}: {value!r} is not implemented by lcm-proxy; simple-shuffle is used instead")
        return "simple-shuffle"
    return value


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


def short_key_warnings(keys: Sequence[str], master: Any) -> list[str]:
    """A warning for each proxy key shorter than ``SHORT_KEY``, naming where it was written but not the key."""
    return [
        f"{'general_settings.master_key' if key == master else f'general_settings.api_keys[{index}].key'}:"
        f" {len(key)} characters; a short key is easy to guess: use a long random one (e.g. openssl rand -hex 24)"
        " on a proxy that others can reach"
        for index, key in enumerate(keys)
        if len(key) < SHORT_KEY
    ]


def litellm_database_warnings(url: str | None) -> list[str]:
    """A PostgreSQL ``database_url`` pasted from a LiteLLM proxy config names LiteLLM's own database: said when
    its name is LiteLLM's (``check-config`` and ``serve`` also look for LiteLLM's tables when they can connect,
    ``proxy.store.postgres.store.litellm_tables``)."""
    if url is None:
        return []
    name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.lstrip("/"))
    if name.lower() != LITELLM_DATABASE_NAME:
        return []
    return [
        f"general_settings.database_url: the database is named {name!r}, as LiteLLM proxy's own database is in"
        f" its docs: if it is LiteLLM proxy's own database, {OWN_DATABASE}"
    ]


def litellm_tables_warning(where: str, tables: Sequence[str]) -> str:
    """``where`` (a URL without its password) holds LiteLLM proxy's tables: it is LiteLLM's own database."""
    shown = ", ".join(tables[:3]) + (", ..." if len(tables) > 3 else "")
    return (
        f"general_settings.database_url: {where} holds LiteLLM proxy's tables ({len(tables)}: {shown}): it is"
        f" LiteLLM proxy's own database; {OWN_DATABASE}"
    )


def _as_admin(entry: Any, master: str) -> Any:

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


def model_list_warnings(model_list: Sequence[Any]) -> list[str]:
    """Near misses inside each entry's litellm_params and model_info, and an entry that repeats an earlier
    one: entries sharing a model_name are deployments of one model, but the very same one twice is a copy."""
    warnings: list[str] = []
    first: dict[tuple[str, str], int] = {}
    for index, deployment in enumerate(model_list):
        params, info = deployment.litellm_params, deployment.model_info
        warnings += model_key_warnings(index, (params.model_extra or {}).keys(), (info.model_extra or {}).keys())
        earlier = first.setdefault((deployment.model_name, params.model_dump_json()), index)
        if earlier != index:
            warnings.append(
                f"model_list[{index}]: the same deployment as model_list[{earlier}] (model_name"
                f" {deployment.model_name!r}, the same litellm_params): it gets a second share of the requests"
            )
    return warnings
