"""The overhead benchmark's doors besides Chat Completions: Anthropic's ``/v1/messages`` and OpenAI's
``/v1/responses`` (``bench/overhead.py`` measures them; this module says what is sent where and prints them).

Each door is measured with a short request, non-streaming and streaming, one client at a time, through lcm-proxy
and LiteLLM proxy to two kinds of deployment: one that speaks the door's own API (the fake's ``/v1/messages`` or
``/v1/responses``) and an ``openai/`` chat deployment the proxy translates to the fake's ``/v1/chat/completions``.
The baseline is the fake's own route for the door, called directly. The bare forwarders have no such routes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

BASELINE = "upstream directly (baseline)"
AIOHTTP = "bare aiohttp forwarder"
LITELLM_SDK = "bare litellm.acompletion forwarder"
LITELLM_PROXY = "LiteLLM proxy"
LCM = "lcm-proxy"
COMPARATORS = (AIOHTTP, LITELLM_SDK, LITELLM_PROXY)

KEY = "k-12345678"
SHORT_MESSAGES = [{"role": "user", "content": "Hello there, how are you today?"}]
JSON_HEADERS = {"content-type": "application/json"}

# One model name per kind of deployment, in lcm-proxy's config and LiteLLM proxy's; the fake ignores the name.
NATIVE = "claude-native"  # anthropic/ with api_base the fake: the fake's /v1/messages
TRANSLATED = "claude-translated"  # openai/ with api_base the fake: its /v1/chat/completions
RESPONSES_NATIVE = "gpt-native"  # openai/responses/ with api_base the fake's /v1: the fake's /v1/responses
RESPONSES_TRANSLATED = "gpt-translated"  # openai/: its /v1/chat/completions


@dataclass(frozen=True)
class Door:
    title: str  # of its latency table
    path: str
    headers: dict[str, str]
    end: bytes  # what one of a stream's data lines holds when the stream is whole
    body: Callable[[str, bool], bytes]  # (model, stream) -> the request body
    rows: dict[str, list[tuple[str, str]]]  # server -> [(row name, model)]: native first, then translated
    kinds: tuple[str, str]  # the two kinds of deployment, as the ratio rows name them


def messages_body(model: str, stream: bool) -> bytes:
    body: dict[str, Any] = {"model": model, "max_tokens": 64, "messages": SHORT_MESSAGES}
    return orjson.dumps({**body, "stream": True} if stream else body)


def responses_body(model: str, stream: bool) -> bytes:
    body: dict[str, Any] = {"model": model, "max_output_tokens": 64, "input": SHORT_MESSAGES}
    return orjson.dumps({**body, "stream": True} if stream else body)


MESSAGES = Door(
    title="Anthropic /v1/messages",
    path="/v1/messages",
    headers={**JSON_HEADERS, "x-api-key": KEY, "anthropic-version": "2023-06-01"},
    end=b'"message_stop"',
    body=messages_body,
    rows={
        BASELINE: [(BASELINE, NATIVE)],
        LITELLM_PROXY: [
            (f"{LITELLM_PROXY}, anthropic/ deployment", NATIVE),
            (f"{LITELLM_PROXY}, openai/ deployment (translated)", TRANSLATED),
        ],
        LCM: [
            (f"{LCM}, anthropic/ deployment (native)", NATIVE),
            (f"{LCM}, openai/ deployment (translated)", TRANSLATED),
        ],
    },
    kinds=("anthropic/", "openai/"),
)

RESPONSES = Door(
    title="OpenAI /v1/responses",
    path="/v1/responses",
    headers={**JSON_HEADERS, "authorization": f"Bearer {KEY}"},
    end=b'"response.completed"',
    body=responses_body,
    rows={
        BASELINE: [(BASELINE, RESPONSES_NATIVE)],
        LITELLM_PROXY: [
            (f"{LITELLM_PROXY}, openai/responses/ deployment", RESPONSES_NATIVE),
            (f"{LITELLM_PROXY}, openai/ deployment (translated)", RESPONSES_TRANSLATED),
        ],
        LCM: [
            (f"{LCM}, openai/responses/ deployment (native)", RESPONSES_NATIVE),
            (f"{LCM}, openai/ deployment (translated)", RESPONSES_TRANSLATED),
        ],
    },
    kinds=("openai/responses/", "openai/"),
)

DOORS = (MESSAGES, RESPONSES)


def deployment(name: str, model: str, api_base: str, **params: Any) -> dict[str, Any]:
    return {"model_name": name, "litellm_params": {"model": model, "api_base": api_base, "api_key": KEY, **params}}


def lcm_deployments(upstream: str) -> list[dict[str, Any]]:
    """The doors' deployments in lcm-proxy's config. The Messages door's native path posts to
    ``{api_base}/v1/messages``, the Responses door's to ``{api_base}/responses``."""
    return [
        deployment(NATIVE, f"anthropic/{NATIVE}", upstream),
        deployment(TRANSLATED, f"openai/{TRANSLATED}", f"{upstream}/v1"),
        deployment(RESPONSES_NATIVE, f"openai/responses/{RESPONSES_NATIVE}", f"{upstream}/v1"),
        deployment(RESPONSES_TRANSLATED, f"openai/{RESPONSES_TRANSLATED}", f"{upstream}/v1"),
    ]


def litellm_deployments(upstream: str) -> list[dict[str, Any]]:
    """The same deployments in LiteLLM proxy's config (max_retries 0, as for lcm-proxy). An ``openai/`` model is
    one LiteLLM calls through OpenAI's Responses API natively, so the translated Responses deployment asks for its
    chat-completions bridge (``use_chat_completions_api``), the translation lcm-proxy's door makes."""
    return [
        deployment(NATIVE, f"anthropic/{NATIVE}", upstream, max_retries=0),
        deployment(TRANSLATED, f"openai/{TRANSLATED}", f"{upstream}/v1", max_retries=0),
        deployment(RESPONSES_NATIVE, f"openai/responses/{RESPONSES_NATIVE}", f"{upstream}/v1", max_retries=0),
        deployment(
            RESPONSES_TRANSLATED,
            f"openai/{RESPONSES_TRANSLATED}",
            f"{upstream}/v1",
            max_retries=0,
            use_chat_completions_api=True,
        ),
    ]


@dataclass
class DoorResult:
    """One row group of a door's table, in seconds (``stream_first``: to the first SSE data line)."""

    name: str
    short: list[float] = field(default_factory=list)
    stream_first: list[float] = field(default_factory=list)
    stream_total: list[float] = field(default_factory=list)


# --- tables ------------------------------------------------------------------------------------------------


def p(values: list[float], q: float) -> float:
    """The q-quantile in milliseconds (nearest rank)."""
    return sorted(values)[min(len(values) - 1, int(len(values) * q))] * 1000


DOOR_ROWS = (("short", "short"), ("streaming: first byte", "stream_first"), ("streaming: total", "stream_total"))


def latency_rows(result: Any, baseline: Any, labels: tuple[tuple[str, str], ...]) -> list[str]:
    rows = []
    for label, attr in labels:
        values, base = getattr(result, attr), getattr(baseline, attr)
        p50, p99 = p(values, 0.5), p(values, 0.99)
        cells = [result.name, label, f"{p50:.2f}", f"{p99:.2f}"]
        if result is baseline:
            cells += ["", ""]
        else:
            cells += [f"{p50 - p(base, 0.5):.2f}", f"{p99 - p(base, 0.99):.2f}"]
        rows.append(f"| {' | '.join(cells)} |")
    return rows


def added_p50(result: Any, baseline: Any, attr: str) -> float:
    return float(statistics.median(getattr(result, attr)) - statistics.median(getattr(baseline, attr))) * 1000


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs > 0 and ours > 0 else "n/a"


def print_door_table(door: Door, results: dict[str, DoorResult], requests: int) -> None:
    if BASELINE not in results:
        return
    print(
        f"\n## overhead: {door.title} latency, one client at a time ({requests} requests per cell,"
        " every server in its own process)\n"
    )
    print("| in front of the fake upstream | request | p50 ms | p99 ms | added p50 ms | added p99 ms |")
    print("|---|---|---:|---:|---:|---:|")
    for result in results.values():
        print("\n".join(latency_rows(result, results[BASELINE], DOOR_ROWS)))


def door_ratio_rows(door: Door, results: dict[str, DoorResult]) -> list[str]:
    """lcm-proxy's added p50 on the door ÷ LiteLLM proxy's, per kind of deployment (no target set)."""
    baseline = results.get(BASELINE)
    rows = []
    for index, kind in enumerate(door.kinds):
        ours, theirs = door.rows[LCM][index][0], door.rows[LITELLM_PROXY][index][0]
        for label, attr in (("short non-streaming", "short"), ("streaming first byte", "stream_first")):
            cells = ["—"] * len(COMPARATORS)
            if baseline is not None and ours in results:
                at = COMPARATORS.index(LITELLM_PROXY)
                cells[at] = "skipped"
                if theirs in results:
                    mine, other = (added_p50(results[n], baseline, attr) for n in (ours, theirs))
                    cells[at] = ratio(mine, other)
            rows.append(f"| added p50: {door.path} {label}, {kind} deployment | {' | '.join(cells)} | none set | — |")
    return rows
