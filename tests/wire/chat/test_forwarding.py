"""The official openai SDK against the real proxy, which forwards to a real fake upstream."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import UPSTREAM_KEY, RunningProxy

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
WEATHER_CALL = {
    "id": "call_abc",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
}


def client(proxy: RunningProxy, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0, timeout=20)


def test_non_streaming_completion(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="The answer is 42."))
    result = client(proxy).chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "What is the answer?"}]
    )
    assert result.choices[0].message.content == "The answer is 42."
    assert result.choices[0].finish_reason == "stop"
    assert result.usage is not None and result.usage.total_tokens == 18
    assert result.id == "chatcmpl-fake"
    # The alias was resolved: the upstream saw its own model name and the configured upstream key.
    assert fake_upstream.last.body["model"] == "fake-model"
    assert fake_upstream.last.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


def test_streaming_with_usage(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="one two three four"))
    stream = client(proxy).chat.completions.create(
        model="test-model",
        messages=[{"role": "user", "content": "count"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three four"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1]
    assert usage_chunks[0].choices == [] and usage_chunks[0].usage.total_tokens == 18
    assert fake_upstream.last.body["stream_options"] == {"include_usage": True}


def test_streaming_without_usage_sends_no_usage_chunk(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="a b"))
    chunks = list(
        client(proxy).chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": "x"}], stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_raw_sse_ends_with_done(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="hi there"))
    with httpx.stream(
        "POST",
        f"{proxy.base_url}/chat/completions",
        json={"model": "test-model", "messages": [{"role": "user", "content": "x"}], "stream": True},
        timeout=20,
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    payloads = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(line.startswith("data: ") for line in lines)
    assert all(p["object"] == "chat.completion.chunk" and "provider_specific_fields" not in p for p in payloads)


def test_tool_calls_non_streaming(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content=None, tool_calls=[WEATHER_CALL]))
    result = client(proxy).chat.completions.create(
        model="test-model",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=TOOLS,
        tool_choice="auto",
    )
    message = result.choices[0].message
    assert result.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "call_abc",
        "get_weather",
        {"city": "Oslo"},
    )
    assert fake_upstream.last.body["tools"] == TOOLS and fake_upstream.last.body["tool_choice"] == "auto"


def test_tool_calls_streaming(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content=None, tool_calls=[WEATHER_CALL]))
    chunks = list(
        client(proxy).chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS, stream=True
        )
    )
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [d.id for d in deltas if d.id] == ["call_abc"]
    assert "".join(d.function.arguments or "" for d in deltas if d.function) == '{"city":"Oslo"}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_models_list(proxy: RunningProxy) -> None:
    ids = [m.id for m in client(proxy).models.list()]
    assert ids == ["test-model", "unreachable"]


FULL_TRANSCRIPT: list[dict[str, Any]] = [
    {"role": "developer", "content": "You are terse."},
    {"role": "system", "content": [{"type": "text", "text": "Today is a fixed date."}]},
    {"role": "user", "content": "Weather in Oslo?", "name": "alice"},
    {"role": "assistant", "content": None, "refusal": None, "tool_calls": [WEATHER_CALL]},
    {"role": "tool", "tool_call_id": "call_abc", "content": "12C, rain"},
    {"role": "assistant", "content": "12C and rainy."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "And this picture?"},
            {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
            },
        ],
    },
]

PASSTHROUGH_FIELDS: dict[str, Any] = {
    "tools": TOOLS,
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}},
    "n": 2,
    "seed": 7,
    "temperature": 0.3,
    "top_p": 0.9,
    "max_completion_tokens": 123,
    "stop": ["END"],
    "presence_penalty": 0.1,
    "frequency_penalty": 0.2,
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "top_logprobs": 2,
    "parallel_tool_calls": False,
    "metadata": {"trace": "t-1", "team": "core"},
    "user": "user-123",
    "reasoning_effort": "low",
    "vendor_extra": {"nested": [1, 2, {"deep": True}]},
    "top_k": 40,
}


@pytest.mark.parametrize("stream", [False, True])
def test_forwarded_body_is_identical_to_client_body(
    proxy: RunningProxy, fake_upstream: FakeUpstream, stream: bool
) -> None:
    body: dict[str, Any] = {"model": "test-model", "messages": FULL_TRANSCRIPT, **PASSTHROUGH_FIELDS}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    sent = copy.deepcopy(body)
    response = httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=20)
    assert response.status_code == 200, response.text
    received = fake_upstream.last.body
    assert received.pop("model") == "fake-model"
    sent.pop("model")
    assert received == sent


def test_openai_sdk_extra_body_and_headers_pass(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    client(proxy).chat.completions.create(
        model="test-model",
        messages=[{"role": "user", "content": "hi"}],
        metadata={"k": "v"},
        extra_body={"guided_json": {"type": "object"}},
    )
    assert fake_upstream.last.body["guided_json"] == {"type": "object"}
    assert fake_upstream.last.body["metadata"] == {"k": "v"}
    assert fake_upstream.last.body["messages"] == [{"role": "user", "content": "hi"}]


def _sse(*events: Any) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def _relayed(proxy: RunningProxy, body: dict[str, Any]) -> list[Any]:
    events = []
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return events


def test_streamed_chunks_arrive_exactly_as_the_upstream_sent_them(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    """An OpenAI-compatible upstream's chunks are relayed as sent: its own ``created``, ``system_fingerprint``,
    vendor fields in chunks and deltas, logprobs, and its usage chunk with ``choices: []`` — LiteLLM's
    per-chunk rebuild would rewrite ``created`` and drop or reshape the rest. Keep-alive comments, other SSE
    fields and a two-line data event are read correctly."""
    base = {"id": "chatcmpl-vendor", "object": "chat.completion.chunk", "created": 1234567, "model": "fake-model"}
    sent = [
        {
            **base,
            "system_fingerprint": "fp_1",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        },
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "Hel", "reasoning_content": "think"},
                    "logprobs": {"content": []},
                    "finish_reason": None,
                }
            ],
            "x_vendor": {"latency_ms": 3},
        },
        {**base, "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**base, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}},
    ]
    text = json.dumps(sent[2])
    two_lines = text.replace(", ", ",\ndata: ", 1).encode()  # one event in two data lines (joined by a newline)
    raw = b": keep-alive\n\nevent: message\nid: 1\n" + _sse(sent[0], sent[1], two_lines, sent[3], sent[4], b"[DONE]")
    fake_upstream.enqueue(Reply(raw_body=raw))
    body = {
        "model": "test-model",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert _relayed(proxy, body) == [*sent, "[DONE]"]
    # Without include_usage, a usage chunk the upstream sends anyway is not passed on.
    fake_upstream.enqueue(Reply(raw_body=_sse(*sent, b"[DONE]")))
    assert _relayed(proxy, {**body, "stream_options": None} | {"stream": True}) == [*sent[:4], "[DONE]"]


def test_error_event_inside_the_upstream_stream_reaches_the_client(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake-model"}
    first = {**base, "choices": [{"index": 0, "delta": {"content": "partial"}, "finish_reason": None}]}
    error = {
        "error": {
            "message": "The server had an error while processing your request.",
            "type": "server_error",
            "code": None,
        }
    }
    fake_upstream.enqueue(Reply(raw_body=_sse(first, error)))
    events = _relayed(proxy, {"model": "test-model", "messages": [{"role": "user", "content": "y"}], "stream": True})
    assert events[0] == first
    assert events[1]["error"]["message"] == error["error"]["message"] and events[1]["error"]["type"] == "server_error"
    assert "[DONE]" not in events
    # An upstream that ends without ever sending a finish_reason (even with [DONE]) cut the answer short.
    fake_upstream.enqueue(Reply(raw_body=_sse(first, b"[DONE]")))
    events = _relayed(proxy, {"model": "test-model", "messages": [{"role": "user", "content": "z"}], "stream": True})
    assert events[0] == first and events[1]["error"]["code"] == "upstream_stream_truncated"
    # A stream event that is not JSON is the upstream's fault: a clear 502-class error, not a proxy crash.
    fake_upstream.enqueue(Reply(raw_body=_sse(first, b"{not json")))
    events = _relayed(proxy, {"model": "test-model", "messages": [{"role": "user", "content": "w"}], "stream": True})
    assert events[0] == first and events[1]["error"]["code"] == "upstream_bad_stream"


def test_stream_error_events_never_echo_the_upstream_key(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    """A provider that rejects the key inside a 200 stream, echoing it, reaches the client redacted, as the
    same rejection as an HTTP 401 does."""
    error = {"error": {"message": f"Incorrect API key provided: {UPSTREAM_KEY}", "type": "invalid_request_error"}}
    fake_upstream.enqueue(Reply(raw_body=_sse(error)))
    body = {"model": "test-model", "messages": [{"role": "user", "content": "k"}], "stream": True}
    response = httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=30)
    assert UPSTREAM_KEY not in response.text
    assert "Incorrect API key provided: [redacted]" in response.text


def test_null_error_field_and_interleaved_choices(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    """``"error": null`` on a chunk is no error; with n > 1 every choice must finish, or the stream was cut."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake-model"}

    def choice(index: int, content: str | None, finish: str | None) -> dict[str, Any]:
        delta = {} if content is None else {"content": content}
        return {**base, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}

    usage = {**base, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}
    sent = [choice(0, "A", None), choice(1, "B", None), choice(0, None, "stop"), choice(1, None, "length")]
    fake_upstream.enqueue(Reply(raw_body=_sse(*sent, {**usage, "error": None}, b"[DONE]")))
    body = {
        "model": "test-model",
        "messages": [{"role": "user", "content": "n"}],
        "stream": True,
        "n": 2,
        "stream_options": {"include_usage": True},
    }
    assert _relayed(proxy, body) == [*sent, {**usage, "error": None}, "[DONE]"]
    # Choice 1 never finishes: the answer was cut short even though choice 0 did.
    fake_upstream.enqueue(Reply(raw_body=_sse(*sent[:3], b"[DONE]")))
    events = _relayed(proxy, {**body, "messages": [{"role": "user", "content": "m"}]})
    assert events[:3] == sent[:3] and events[3]["error"]["code"] == "upstream_stream_truncated"
