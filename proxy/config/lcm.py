"""``lcm_settings``: the context-management knobs, the part of the config the engine reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Strict(BaseModel):
    """A section of the config: unknown keys are errors, values frozen once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class LcmSettings(Strict):
    """Context-management knobs (docs/architecture.md, "Compaction", "Interception" and "Defaults").

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
    # vLLM's /v1/models); a smaller one than configured is used instead (proxy.upstream.windows).
    probe_context_window: bool = True
    # How long a context size learned from a server (its answer, or a refusal) holds: then its server is asked
    # again and may state a larger one (not asked: the size is forgotten). null: until the process ends.
    context_window_recheck_seconds: float | None = Field(default=600.0, gt=0)
    # Output tokens reserved when the request sets neither max_tokens nor max_completion_tokens.
    default_output_reserve: int = Field(default=4096, ge=0)
    retrieval_tools: Literal["auto", "always", "off"] = "auto"
    # Original excerpts found with the newest user message, placed right before it, when older material is
    # outside the forwarded context (for models that do not call the recall tools, i.e. most small ones).
    auto_recall: Literal["auto", "off"] = "auto"
    auto_recall_tokens: int | None = Field(default=None, ge=32)
    # The ledger of standing instructions (rules, constraints, preferences, goals, decisions, names), forwarded
    # right after the instructions once compaction has started, within its own share of the budget.
    standing_instructions: Literal["auto", "off"] = "auto"
    standing_instructions_tokens: int | None = Field(default=None, ge=32)
    # Background summaries give way to chat requests on the same upstream: auto = servers on this machine
    # (loopback api_base, e.g. llama.cpp with one slot), always, or never.
    background_yields: Literal["auto", "always", "never"] = "auto"
    # The input tokens the Messages door reports (usage, count_tokens): "forwarded", what the model was sent, so
    # Claude Code's meter shows the compacted context and its own auto-compaction does not fire while the proxy
    # keeps the context within the window; "client", what the client sent, so it compacts as it would without
    # the proxy (the proxy then answers that compaction from what it stores).
    client_usage: Literal["forwarded", "client"] = "forwarded"
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

    @field_validator("retrieval_tools", "auto_recall", "standing_instructions", "background_yields", mode="before")
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
