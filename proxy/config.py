"""The YAML configuration: loading, ``os.environ/NAME`` references, validation.

The file has three sections. ``model_list`` uses LiteLLM proxy's exact shape so that a model list from an
existing LiteLLM config can be pasted in unchanged; ``litellm_params`` and ``model_info`` are LiteLLM's to
interpret, so unknown keys *inside them* are allowed (a near miss of one that matters is a warning).
Everywhere else an unknown key is an error that names its path: a misspelt knob that is silently ignored is
worse than a refusal to start. The rest of a LiteLLM proxy config is read by ``proxy.config_compat``: what
maps is used, LiteLLM's other keys are ignored with a warning. Warnings ride on the loaded config
(``ProxyConfig.warnings``) for ``check-config`` to print and ``serve`` to log.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from proxy.config_compat import (
    adapt_litellm_config,
    litellm_database_warnings,
    map_general_settings,
    model_list_warnings,
    short_key_warnings,
    unused_environment,
)
from proxy.errors import ConfigError
from proxy.store import Location

ENV_PREFIX = "os.environ/"
LOOPBACK_HOST = "127.0.0.1"
HOST_ENTRY = re.compile(r"\*|\.?[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?|\[?[0-9a-f:.]*:[0-9a-f:.]*\]?", re.IGNORECASE)
ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[a-z0-9_.~-]+)(:[0-9]{1,5})?", re.IGNORECASE)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LiteLLMParams(BaseModel):
    """Passed to LiteLLM as keyword arguments; only ``model`` is ours to require."""

    model_config = ConfigDict(extra="allow", frozen=True)
    model: str = Field(min_length=1)
    api_key: str | None = None
    api_base: str | None = None
    timeout: float | None = Field(default=None, gt=0)
    stream_timeout: float | None = Field(default=None, gt=0)


class ModelInfo(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    max_input_tokens: int | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
    # Whether the model makes structured tool calls (LiteLLM's key). Unset: LiteLLM's model map, else learned
    # from the model's answers; the recall tools are offered only to models that do.
    supports_function_calling: bool | None = None
    # How much more than o200k (the proxy's own count) this model's tokenizer may count: the window is divided
    # by it. Unset: a default for the model's family (``proxy.engine.tokens.token_margin``).
    token_margin: float | None = Field(default=None, ge=1.0, le=3.0)


class ModelDeployment(_Strict):
    model_name: str = Field(min_length=1)
    litellm_params: LiteLLMParams
    model_info: ModelInfo = ModelInfo()
    # ``os.environ/`` references left unresolved because the command at hand does not use this deployment
    # (operator commands); the router refuses to resolve to it.
    _unresolved: list[str] = PrivateAttr(default_factory=list)

    @field_validator("model_name")
    @classmethod
    def _one_wildcard(cls, name: str) -> str:
        # One ``*`` captures one part of the name, which replaces the ``*`` of litellm_params.model.
        if name.count("*") > 1:
            raise ValueError("at most one '*' is allowed (it stands for the rest of the requested name)")
        return name


class ApiKey(_Strict):
    """A proxy API key and the tenant it belongs to. Tenants never see each other's conversations."""

    # Any length, as LiteLLM takes any master_key (its docs use sk-1234); one shorter than SHORT_KEY is a warning.
    key: str = Field(min_length=1)
    tenant: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@-]+$")
    # An admin key (``general_settings.master_key`` is one) may also read and delete other tenants' data
    # under ``/lcm/`` by naming them (``?tenant=``); any other key only ever sees its own tenant.
    admin: bool = False


def tenant_for_bare_key(key: str) -> str:
    """``key-`` and 12 hex digits of a salted SHA-256 of the key: stable, and it does not reveal the key."""
    return "key-" + hashlib.sha256(b"lcm-proxy tenant\x00" + key.encode()).hexdigest()[:12]


class ModelGroupAlias(_Strict):
    """LiteLLM's long form of a ``model_group_alias`` entry: its target, and whether ``/v1/models`` hides it."""

    model: str
    hidden: bool = False


class GeneralSettings(_Strict):
    # None means "127.0.0.1 unless API keys are configured, then 0.0.0.0" (see ``bind_host``).
    host: str | None = None
    port: int = Field(default=4000, ge=0, le=65535)
    api_keys: list[ApiKey] = []
    data_dir: Path | None = None
    # postgresql://... (LiteLLM proxy's key; sqlite:///DIR is read as data_dir): conversations in PostgreSQL,
    # shared by every replica. None: SQLite under data_dir.
    database_url: str | None = None
    # LiteLLM's key: PostgreSQL connections each worker process keeps at most.
    database_connection_pool_limit: int = Field(default=16, ge=1, le=1000)
    # Seconds for one upstream call (LiteLLM's own default is 6000 s, far too long for a proxy).
    request_timeout: float = Field(default=600.0, gt=0)
    connect_timeout: float = Field(default=10.0, gt=0)
    # Retries the proxy itself makes on 429/5xx/connection errors before the first byte. LiteLLM's and the
    # OpenAI SDK's hidden retries are always turned off, so this is the only retry policy in play: each retry
    # is one more pass over the model's deployments and fallbacks (``proxy.upstream.Upstream._call``).
    upstream_retries: int = Field(default=0, ge=0, le=10)  # config_compat.MAX_UPSTREAM_RETRIES
    # LiteLLM's router settings (``router_settings``): which of a model's deployments (model_list entries with
    # one model_name) goes first, and the models tried when all of them failed before the first byte.
    routing_strategy: Literal["simple-shuffle", "least-busy"] = "simple-shuffle"
    fallbacks: list[dict[str, list[str]]] = []  # LiteLLM's shape: [{"gpt-4o": ["gpt-4o-mini"]}]
    # Other names for a model group: {"gpt-4": "gpt-4o"} or {"gpt-4": {"model": "gpt-4o", "hidden": true}}.
    model_group_alias: dict[str, str | ModelGroupAlias] = {}
    allowed_fails: int = Field(default=3, ge=1)  # failures in a row before a deployment cools down
    cooldown_time: float = Field(default=5.0, ge=0)  # seconds it is skipped then (0: never)
    # LiteLLM's drop_params: parameters a provider does not support are dropped by LiteLLM, not refused.
    drop_params: bool = False
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    # Seconds a request body has to arrive in full once the handler starts reading it; past that the request
    # is answered 408 and its connection let go (a client that trickles its upload holds no slot for long).
    body_read_timeout: float = Field(default=60.0, gt=0)
    # The most a relayed upstream answer (embeddings) may be: a larger one is a 502 naming the model. OpenAI's
    # largest (2,048 inputs x 3,072 floats) is ~130 MB of JSON; the proxy relays it in chunks, never whole.
    max_upstream_response_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False
    # Browser clients: the origins (scheme://host[:port], or "*" for any) whose pages may call the proxy. Empty:
    # CORS is off and no response carries a CORS header (``proxy.wire.cors``).
    cors_allow_origins: list[str] = []
    # The Host names the proxy answers to (``proxy.wire.guard``): host names or IP addresses, any port; a leading
    # dot takes a domain and its subdomains; "*" any. Loopback names and addresses are always served. None: on a
    # loopback bind only those (a page's DNS-rebound name is refused), on a non-loopback bind any.
    allowed_hosts: list[str] | None = None

    @field_validator("model_group_alias", mode="before")
    @classmethod
    def _aliases(cls, aliases: Any) -> Any:
        """A bad entry, named: the union's own errors would name its member types (".str", ".ModelGroupAlias")."""
        for alias, target in aliases.items() if isinstance(aliases, dict) else ():
            long_form = (
                isinstance(target, dict) and isinstance(target.get("model"), str) and set(target) <= {"model", "hidden"}
            )
            if not (isinstance(target, str) or (long_form and isinstance(target.get("hidden", False), bool))):
                raise ValueError(
                    f"entry {alias!r}: expected a model_name, or {{model: MODEL_NAME, hidden: true|false}}"
                )
        return aliases

    @field_validator("cors_allow_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        for index, origin in enumerate(origins):
            if origin != "*" and not ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"entry {index} ({origin!r}) is not an origin: expected scheme://host[:port] (no path, no"
                    " trailing slash) or '*'"
                )
        return [origin.lower() for origin in origins]  # browsers send scheme and host in lower case

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str] | None) -> list[str] | None:
        for index, host in enumerate(hosts or []):
            if not HOST_ENTRY.fullmatch(host):
                raise ValueError(
                    f"entry {index} ({host!r}) is not a host name: expected a name or an IP address (no scheme,"
                    " port or path), '.example.com' for a domain and its subdomains, or '*'"
                )
        return None if hosts is None else [host.lower() for host in hosts]

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("api_keys", mode="before")
    @classmethod
    def _plain_keys(cls, value: Any) -> Any:
        # A bare string is shorthand for a key whose tenant is derived from the key itself. Not from its place in
        # the list: removing or reordering keys would hand one key's history to another.
        if isinstance(value, list):
            return [{"key": k, "tenant": tenant_for_bare_key(k)} if isinstance(k, str) else k for k in value]
        return value

    @model_validator(mode="after")
    def _unique_keys(self) -> GeneralSettings:
        keys = [k.key for k in self.api_keys]
        if len(keys) != len(set(keys)):
            raise ValueError("api_keys: the same key is listed twice")
        return self

    def bind_host(self) -> str:
        if self.host is not None:
            return self.host
        return "0.0.0.0" if self.api_keys else LOOPBACK_HOST

    def location(self) -> Location:
        return Location(self.resolved_data_dir(), self.database_url, self.database_connection_pool_limit)

    def resolved_data_dir(self) -> Path:
        if self.data_dir is not None:
            return self.data_dir.expanduser()
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / "lcm-proxy"


class LcmSettings(_Strict):
    """Context-management knobs (ARCHITECTURE.md, "Compaction", "Interception" and "Defaults").

    The size knobs left unset (None) scale with the model's window (``proxy.engine.budget.sizes``): a value
    sized for a 128k model must not refuse a paste to a 2k one or write summaries larger than its window.
    """

    enabled: bool = True
    context_threshold: float = Field(default=0.75, gt=0, le=1)
    fresh_tail_count: int = Field(default=32, ge=1)  # a maximum: the tail also stays within a token share
    leaf_chunk_tokens: int | None = Field(default=None, ge=100)
    leaf_target_tokens: int | None = Field(default=None, ge=32)
    condensed_target_tokens: int | None = Field(default=None, ge=32)
    leaf_min_fanout: int = Field(default=8, ge=2)
    condensed_min_fanout: int = Field(default=4, ge=2)
    fallback_max_tokens: int | None = Field(default=None, ge=32)
    large_file_token_threshold: int | None = Field(default=None, ge=100)
    tool_result_token_threshold: int | None = Field(default=None, ge=50)
    summary_model: str | None = None
    summary_timeout: float = Field(default=120.0, gt=0)
    # Seconds a request waits for an inline compaction; past it the request is answered from what fits and
    # the compaction finishes in the background.
    inline_compaction_seconds: float = Field(default=30.0, gt=0)
    # A sweep's compaction lease is renewed this often and expires after three missed renewals: a killed
    # worker or replica blocks its conversation's compaction for that long (proxy.engine.lease).
    compaction_lease_heartbeat_seconds: float = Field(default=2.0, gt=0)
    # Context window for models whose size neither model_info nor LiteLLM's model map knows.
    default_context_window: int = Field(default=128000, ge=1024)
    # Ask each OpenAI-compatible api_base server for its context size at startup (llama.cpp's GET /props,
    # vLLM's /v1/models); a smaller one than configured is used instead (proxy.windows).
    probe_context_window: bool = True
    # Output tokens reserved when the request sets neither max_tokens nor max_completion_tokens.
    default_output_reserve: int = Field(default=4096, ge=0)
    retrieval_tools: Literal["auto", "always", "off"] = "auto"
    # Original excerpts found with the newest user message, placed right before it, when older material is
    # outside the forwarded context (for models that do not call the recall tools, i.e. most small ones).
    auto_recall: Literal["auto", "off"] = "auto"
    auto_recall_tokens: int | None = Field(default=None, ge=32)
    # Background summaries give way to chat requests on the same upstream: auto = servers on this machine
    # (loopback api_base, e.g. llama.cpp with one slot), always, or never.
    background_yields: Literal["auto", "always", "never"] = "auto"
    max_tool_rounds: int = Field(default=6, ge=1, le=50)
    max_sweep_iterations: int = Field(default=24, ge=1)  # passes per sweep (each one summarizer call at most)
    sweep_deadline_seconds: float = Field(default=300.0, gt=0)
    max_summarizer_calls_per_hour: int = Field(default=120, ge=1)
    # Conversations idle this many days are deleted, at startup and hourly (proxy.engine.deletion); None: kept.
    retention_days: int | None = Field(default=None, ge=1)
    # DELETE /lcm/conversations/{id} per key (token bucket): this many a minute on average, bursts of
    # delete_burst; over it, a 429 with Retry-After. None: no limit.
    delete_rate_per_minute: float | None = Field(default=30.0, gt=0)
    delete_burst: int = Field(default=10, ge=1)

    @field_validator("retrieval_tools", "auto_recall", "background_yields", mode="before")
    @classmethod
    def _switch(cls, value: Any, info: Any) -> Any:
        """YAML reads an unquoted ``off``/``no`` as false and ``on``/``yes`` as true. False is the setting's
        off value; true is ``auto``, the on value that still looks at the model (``always`` can cost a small
        model a third of its window, which nobody should get by writing ``on``)."""
        if isinstance(value, bool):
            return "auto" if value else ("never" if info.field_name == "background_yields" else "off")
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> LcmSettings:
        small, large = self.tool_result_token_threshold, self.large_file_token_threshold
        if small is not None and large is not None and small > large:
            raise ValueError("tool_result_token_threshold must not exceed large_file_token_threshold")
        return self


class ProxyConfig(_Strict):
    model_list: list[ModelDeployment] = Field(min_length=1)
    general_settings: GeneralSettings = GeneralSettings()
    lcm_settings: LcmSettings = LcmSettings()
    # Not errors, but worth saying once: check-config prints them, serve logs them.
    _warnings: list[str] = PrivateAttr(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings)


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


def resolve_env_references(value: Any, path: str = "", missing: list[str] | None = None) -> Any:
    """Resolve every ``os.environ/NAME`` in ``value``. An unset variable is recorded in ``missing`` (its
    reference left in place), or raises ``ConfigError`` without a list."""
    resolver = _Resolver({}, None)
    out = resolver(value, path)
    if missing is None and resolver.missing:
        raise ConfigError("<config>", resolver.missing)
    if missing is not None:
        missing += resolver.missing
    return out


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
    from proxy.routing import unreachable_models  # routing imports this module

    problems += unreachable_models(config)
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
