"""The YAML configuration: loading, ``os.environ/NAME`` references, validation.

The file has three sections. ``model_list`` uses LiteLLM proxy's exact shape so that a model list from an
existing LiteLLM config can be pasted in unchanged; ``litellm_params`` and ``model_info`` are LiteLLM's to
interpret, so unknown keys *inside them* are allowed (a near miss of one that matters is a warning).
Everywhere else an unknown key is an error that names its path: a misspelt knob that is silently ignored is
worse than a refusal to start. The rest of a LiteLLM proxy config is read by ``proxy.config.litellm_compat``: what
maps is used, LiteLLM's other keys are ignored with a warning. Warnings ride on the loaded config
(``ProxyConfig.warnings``) for ``check-config`` to print and ``serve`` to log.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from proxy.config.lcm import LcmSettings, Strict
from proxy.scopes import tenant_for_bare_key
from proxy.store.location import Location

ENV_PREFIX = "os.environ/"
LOOPBACK_HOST = "127.0.0.1"
HOST_ENTRY = re.compile(r"\*|\.?[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?|\[?[0-9a-f:.]*:[0-9a-f:.]*\]?", re.IGNORECASE)
ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[a-z0-9_.~-]+)(:[0-9]{1,5})?", re.IGNORECASE)


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
    # by it. Unset: a default for the model's family (``proxy.tokens.token_margin``).
    token_margin: float | None = Field(default=None, ge=1.0, le=3.0)
    # False: chat calls to this deployment go through litellm.acompletion even where the provider speaks OpenAI's
    # format (``proxy.upstream.direct``).
    lcm_direct: bool = True


class ModelDeployment(Strict):
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


class ApiKey(Strict):
    """A proxy API key and the tenant it belongs to. Tenants never see each other's conversations."""

    # Any length, as LiteLLM takes any master_key (its docs use sk-1234); one shorter than SHORT_KEY is a warning.
    key: str = Field(min_length=1)
    tenant: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@-]+$")
    # An admin key (``general_settings.master_key`` is one) may also read and delete other tenants' data
    # under ``/lcm/`` by naming them (``?tenant=``); any other key only ever sees its own tenant.
    admin: bool = False


class ModelGroupAlias(Strict):
    """LiteLLM's long form of a ``model_group_alias`` entry: its target, and whether ``/v1/models`` hides it."""

    model: str
    hidden: bool = False


class GeneralSettings(Strict):
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
    # is one more pass over the model's deployments and fallbacks (``proxy.upstream.client.Upstream._call``).
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


class ProxyConfig(Strict):
    model_list: list[ModelDeployment] = Field(min_length=1)
    general_settings: GeneralSettings = GeneralSettings()
    lcm_settings: LcmSettings = LcmSettings()
    # Not errors, but worth saying once: check-config prints them, serve logs them.
    _warnings: list[str] = PrivateAttr(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings)
