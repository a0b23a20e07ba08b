"""What the overhead benchmark sends where (``bench/overhead.py`` measures it): the three doors, their
deployments, and the requests users send.

Each door (``/v1/chat/completions``, Anthropic's ``/v1/messages``, OpenAI's ``/v1/responses``) is measured per kind
of deployment: one that speaks the door's own API (for chat, every deployment) and, for the Messages and Responses
doors, an ``openai/`` chat deployment the proxy translates to the fake's ``/v1/chat/completions``. The requests
(``REQUESTS``), one client at a time:

- **first turn**: a new conversation, a different one each request (what starts every session);
- **continuation**: that conversation's second request: the first turn, the fake's answer to it, a new question
  (what every later turn of a session is);
- **re-send**: the same one-message request again and again (a client retrying, or a cache's best case);
- **streaming first turn**: a new conversation, streamed: time to the first SSE data line and to the end.

The baseline is the fake's own route for the door, called directly. The bare aiohttp forwarder passes every door's
path through; the bare ``litellm.acompletion`` forwarder has chat only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

BASELINE = "upstream directly (baseline)"
AIOHTTP = "bare aiohttp forwarder"
LITELLM_SDK = "bare litellm.acompletion forwarder"
LITELLM_PROXY = "LiteLLM proxy"
LCM = "lcm-proxy"
COMPARATORS = (AIOHTTP, LITELLM_SDK, LITELLM_PROXY)

KEY = "k-12345678"
JSON_HEADERS = {"content-type": "application/json"}
QUESTION = "Hello there, how are you today?"
FOLLOW_UP = "And what should I pack for a weekend of hiking?"

# One model name per kind of deployment, in lcm-proxy's config and LiteLLM proxy's; the fake ignores the name.
CHAT = "m"  # openai/ with api_base the fake's /v1
NATIVE = "claude-native"  # anthropic/ with api_base the fake: the fake's /v1/messages
TRANSLATED = "claude-translated"  # openai/ with api_base the fake: its /v1/chat/completions
RESPONSES_NATIVE = "gpt-native"  # openai/responses/ with api_base the fake's /v1: the fake's /v1/responses
RESPONSES_TRANSLATED = "gpt-translated"  # openai/: its /v1/chat/completions

# (label, request kind, streamed): the rows of each door's latency table.
REQUESTS = (
    ("first turn", "first", False),
    ("continuation (+1 exchange)", "continue", False),
    ("re-send (identical)", "resend", False),
    ("streaming first turn: first byte", "stream", True),
)
STREAM_TOTAL = "streaming first turn: total"


def turn(tag: str, index: int) -> str:
    """The first user message of conversation ``index`` of a row: unique, so each is a new conversation."""
    return f"[{tag} #{index}] {QUESTION}"


def messages_of(kind: str, tag: str, index: int) -> list[tuple[str, str]]:
    """(role, text) of a request: ``continue`` re-sends the first turn with the fake's answer (its echo)."""
    if kind == "resend":
        return [("user", QUESTION)]
    first = turn(tag, index)
    if kind == "continue":
        return [("user", first), ("assistant", f"echo: {first}"), ("user", FOLLOW_UP)]
    return [("user", first)]


def chat_body(model: str, said: list[tuple[str, str]], stream: bool) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": r, "content": t} for r, t in said], "stream": stream}


def messages_body(model: str, said: list[tuple[str, str]], stream: bool) -> dict[str, Any]:
    messages = [{"role": r, "content": t if r == "user" else [{"type": "text", "text": t}]} for r, t in said]
    return {"model": model, "max_tokens": 64, "messages": messages, "stream": stream}


def responses_body(model: str, said: list[tuple[str, str]], stream: bool) -> dict[str, Any]:
    def item(role: str, text: str) -> dict[str, Any]:
        part = "output_text" if role == "assistant" else "input_text"
        return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}

    return {"model": model, "max_output_tokens": 64, "input": [item(r, t) for r, t in said], "stream": stream}


@dataclass(frozen=True)
class Door:
    name: str  # of its tables
    path: str
    headers: dict[str, str]
    end: bytes  # what one of a stream's data lines holds when the stream is whole
    shape: Callable[[str, list[tuple[str, str]], bool], dict[str, Any]]
    kinds: tuple[tuple[str, str], ...]  # (kind of deployment, model name)
    servers: tuple[str, ...]  # which comparators have this door

    def body(self, model: str, kind: str, tag: str, index: int) -> bytes:
        return orjson.dumps(self.shape(model, messages_of(kind, tag, index), kind == "stream"))


CHAT_DOOR = Door(
    name="/v1/chat/completions",
    path="/v1/chat/completions",
    headers=JSON_HEADERS,
    end=b"[DONE]",
    shape=chat_body,
    kinds=(("openai/", CHAT),),
    servers=(AIOHTTP, LITELLM_SDK, LITELLM_PROXY),
)
MESSAGES = Door(
    name="Anthropic /v1/messages",
    path="/v1/messages",
    headers={**JSON_HEADERS, "x-api-key": KEY, "anthropic-version": "2023-06-01"},
    end=b'"message_stop"',
    shape=messages_body,
    kinds=(("anthropic/ (native)", NATIVE), ("openai/ (translated)", TRANSLATED)),
    servers=(AIOHTTP, LITELLM_PROXY),
)
RESPONSES = Door(
    name="OpenAI /v1/responses",
    path="/v1/responses",
    headers={**JSON_HEADERS, "authorization": f"Bearer {KEY}"},
    end=b'"response.completed"',
    shape=responses_body,
    kinds=(("openai/responses/ (native)", RESPONSES_NATIVE), ("openai/ (translated)", RESPONSES_TRANSLATED)),
    servers=(AIOHTTP, LITELLM_PROXY),
)
DOORS = (CHAT_DOOR, MESSAGES, RESPONSES)


def deployment(name: str, model: str, api_base: str, **params: Any) -> dict[str, Any]:
    return {"model_name": name, "litellm_params": {"model": model, "api_base": api_base, "api_key": KEY, **params}}


def lcm_deployments(upstream: str) -> list[dict[str, Any]]:
    """The doors' deployments in lcm-proxy's config. The Messages door's native path posts to
    ``{api_base}/v1/messages``, the Responses door's to ``{api_base}/responses``."""
    return [
        deployment(CHAT, f"openai/{CHAT}", f"{upstream}/v1"),
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
        deployment(CHAT, f"openai/{CHAT}", f"{upstream}/v1", max_retries=0),
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
