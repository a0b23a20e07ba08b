"""The YAML configuration: loading, ``os.environ/NAME`` references, validation.

The file has three sections. ``model_list`` uses LiteLLM proxy's exact shape so that a model list from an
existing LiteLLM config can be pasted in unchanged; ``litellm_params`` and ``model_info`` are LiteLLM's to
interpret, so unknown keys *inside them* are allowed. Everywhere else an unknown key is an error that names
its path: a misspelt knob that is silently ignored is worse than a refusal to start.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from proxy.errors import ConfigError

ENV_PREFIX = "os.environ/"
LOOPBACK_HOST = "127.0.0.1"


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


class ModelDeployment(_Strict):
    model_name: str = Field(min_length=1)
    litellm_params: LiteLLMParams
    model_info: ModelInfo = ModelInfo()


class ApiKey(_Strict):
    """A proxy API key and the tenant it belongs to. Tenants never see each other's conversations."""

    key: str = Field(min_length=8)
    tenant: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@-]+$")


def tenant_for_bare_key(key: str) -> str:
    """``key-`` and 12 hex digits of a salted SHA-256 of the key: stable, and it does not reveal the key."""
    return "key-" + hashlib.sha256(b"lcm-proxy tenant\x00" + key.encode()).hexdigest()[:12]


class GeneralSettings(_Strict):
    # None means "127.0.0.1 unless API keys are configured, then 0.0.0.0" (see ``bind_host``).
    host: str | None = None
    port: int = Field(default=4000, ge=0, le=65535)
    api_keys: list[ApiKey] = []
    data_dir: Path | None = None
    # Seconds for one upstream call (LiteLLM's own default is 6000 s, far too long for a proxy).
    request_timeout: float = Field(default=600.0, gt=0)
    connect_timeout: float = Field(default=10.0, gt=0)
    # Retries the proxy itself makes on 429/5xx/connection errors before the first byte. LiteLLM's and the
    # OpenAI SDK's hidden retries are always turned off, so this is the only retry policy in play.
    upstream_retries: int = Field(default=0, ge=0, le=10)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False

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

    def resolved_data_dir(self) -> Path:
        if self.data_dir is not None:
            return self.data_dir.expanduser()
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / "lcm-proxy"


class LcmSettings(_Strict):
    """Context-management knobs (DESIGN.md, "Compaction" and "Interception").

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
    # Context window for models whose size neither model_info nor LiteLLM's model map knows.
    default_context_window: int = Field(default=128000, ge=1024)
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


def resolve_env_references(value: Any, path: str = "", missing: list[str] | None = None) -> Any:
    """Replace every ``"os.environ/NAME"`` string, at any depth, by the variable's value. An unset variable
    is recorded in ``missing`` (its reference left in place), or raises ``ConfigError`` without a list."""
    if isinstance(value, dict):
        return {k: resolve_env_references(v, f"{path}.{k}" if path else str(k), missing) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_env_references(v, f"{path}[{i}]", missing) for i, v in enumerate(value)]
    if isinstance(value, str) and value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX) :]
        if name in os.environ:
            return os.environ[name]
        problem = f"{path}: environment variable {name} is not set"
        if missing is None:
            raise ConfigError("<config>", [problem])
        missing.append(problem)
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


def _describe(error: Any) -> str:
    where = _format_location(tuple(error["loc"]))
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key"
    if error["type"] == "missing":
        return f"{where}: required key is missing"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}"


def parse_config(raw: Any, source: str = "<config>") -> ProxyConfig:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(source, ["(top level): expected a mapping of sections"])
    missing: list[str] = []
    resolved = resolve_env_references(raw, missing=missing)
    try:
        config = ProxyConfig.model_validate(resolved)
    except ValidationError as exc:
        # Every problem at once, unset variables first; not a second complaint about a reference left in place.
        unset = {problem.split(": ", 1)[0] for problem in missing}
        found = [_describe(e) for e in exc.errors()]
        raise ConfigError(source, missing + [p for p in found if p.split(": ", 1)[0] not in unset]) from None
    if missing:
        raise ConfigError(source, missing)
    return config


def load_config(path: str | Path) -> ProxyConfig:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read file: {exc.strerror}"]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not valid YAML: {exc}"]) from None
    return parse_config(raw, str(path))
