"""A hostile upstream, end to end: every malformed reply, streamed or not, with the recall loop offered or not,
is answered with a 502 or an ``upstream_bad_stream`` event naming the upstream, never the proxy's 500 or
"Internal error in lcm-proxy while streaming". And a stream that only sends keep-alive comments is cut off by
its stream timeout (httpx's read timeout restarts on every byte; the proxy's counts data)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import UPSTREAM_KEY, RunningProxy

BASE = {"id": "chatcmpl-h", "object": "chat.completion.chunk", "created": 1, "model": "fake-model"}
FIRST = {**BASE, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": None}]}
FINISH = {**BASE, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
DONE = b"data: [DONE]\n\n"


def event(payload: Any) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"


def delta(value: Any, index: Any = 0) -> dict[str, Any]:
    return {**BASE, "choices": [{"index": index, "delta": value, "finish_reason": None}]}


def tool_call(function: Any, index: Any = 0) -> dict[str, Any]:
    return delta({"tool_calls": [{"index": index, "id": "call_1", "type": "function", "function": function}]})


MALFORMED_EVENTS: dict[str, Any] = {
    "not_json": b"{not json",
    "json_list": [1, 2],
    "choices_a_string": {**BASE, "choices": "abc"},
    "choices_a_number": {**BASE, "choices": 5},
    "choice_not_an_object": {**BASE, "choices": [1]},
    "choice_index_x": delta({"content": "a"}, index="x"),
    "delta_a_list": {**BASE, "choices": [{"index": 0, "delta": ["a"], "finish_reason": None}]},
    "content_a_number": delta({"content": 5}),
    "tool_index_x": tool_call({"name": "lcm_grep", "arguments": "{}"}, index="x"),
    "tool_name_a_number": tool_call({"name": 5, "arguments": "{}"}),
    "tool_arguments_an_object": tool_call({"name": "lcm_grep", "arguments": {"pattern": "x"}}),
    "function_a_string": tool_call("lcm_grep"),
}


def chat_result(message: Any, **extra: Any) -> bytes:
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    body = {"id": "chatcmpl-h", "object": "chat.completion", "created": 1, "model": "fake-model", "choices": [choice]}
    return json.dumps(body | extra).encode()


def calls_message(*calls: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


MALFORMED_BODIES: dict[str, bytes] = {
    "html": b"<html>oops</html>",
    "empty": b"",
    "json_list": b"[1, 2]",
    "choices_a_string": b'{"id": "x", "object": "chat.completion", "choices": "abc"}',
    "choice_a_string": b'{"id": "x", "object": "chat.completion", "choices": ["abc"]}',
    "message_null": chat_result(None),
    "content_a_number": chat_result({"role": "assistant", "content": 5}),
    "tool_calls_a_string": chat_result({"role": "assistant", "content": None, "tool_calls": "x"}),
    "function_null": chat_result(calls_message({"id": "c", "type": "function", "function": None})),
    "name_null": chat_result(calls_message({"id": "c", "type": "function", "function": {"name": None}})),
    "name_a_number": chat_result(calls_message({"id": "c", "type": "function", "function": {"name": 5}})),
}


@pytest.fixture(params=["plain", "recall"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def hostile_proxy(proxy_factory: Any, mode: str) -> RunningProxy:
    """The proxy without the recall loop for a short new conversation, or with it (``retrieval_tools: always``)."""
    lcm = {"retrieval_tools": "always"} if mode == "recall" else {}
    return proxy_factory(lcm=lcm)  # type: ignore[no-any-return]


def named_upstream(upstream_url: str) -> str:
    return "The upstream provider for model 'test-model' sent a malformed"


def assert_recall_loop(fake: FakeUpstream, mode: str) -> None:
    tools = [t["function"]["name"] for t in fake.requests[0].body.get("tools") or []]
    assert ("lcm_grep" in tools) is (mode == "recall")


def stream(proxy: RunningProxy, content: str = "hi") -> tuple[httpx.Response, list[Any]]:
    body = {"model": "test-model", "messages": [{"role": "user", "content": content}], "stream": True}
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=body, timeout=30) as response:
        response.read()
    lines = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    return response, [line if line == "[DONE]" else json.loads(line) for line in lines]


@pytest.mark.parametrize("name", list(MALFORMED_EVENTS))
def test_malformed_stream_event_is_a_bad_stream_event(
    hostile_proxy: RunningProxy, fake_upstream: FakeUpstream, upstream_url: str, mode: str, name: str
) -> None:
    fake_upstream.enqueue(Reply(raw_body=event(FIRST) + event(MALFORMED_EVENTS[name]) + event(FINISH) + DONE))
    response, events = stream(hostile_proxy)
    assert response.status_code == 200
    assert_recall_loop(fake_upstream, mode)
    *relayed, last = events
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in relayed) == "Hi"
    error = last["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_bad_stream"), error
    assert error["message"].startswith(named_upstream(upstream_url))
    assert "Internal error" not in response.text and UPSTREAM_KEY not in response.text


@pytest.mark.parametrize("name", ["not_json", "choices_a_number", "tool_index_x"])
def test_malformed_first_event_is_a_502(
    hostile_proxy: RunningProxy, fake_upstream: FakeUpstream, mode: str, name: str
) -> None:
    """Before the first byte went out the failure is still a real HTTP status."""
    fake_upstream.enqueue(Reply(raw_body=event(MALFORMED_EVENTS[name]) + event(FINISH) + DONE))
    response, _ = stream(hostile_proxy)
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "upstream_bad_stream"


@pytest.mark.parametrize("name", list(MALFORMED_BODIES))
def test_malformed_body_is_a_bad_gateway(
    hostile_proxy: RunningProxy, fake_upstream: FakeUpstream, upstream_url: str, mode: str, name: str
) -> None:
    fake_upstream.enqueue(Reply(raw_body=MALFORMED_BODIES[name]))
    body = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{hostile_proxy.base_url}/chat/completions", json=body, timeout=30)
    assert response.status_code == 502, response.text
    assert_recall_loop(fake_upstream, mode)
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_bad_response")
    assert error["message"].startswith(named_upstream(upstream_url))
    assert "Traceback" not in response.text and UPSTREAM_KEY not in response.text


PING = b": ping\n\n"


@pytest.fixture
def pinging_proxy(proxy_factory: Any, upstream_url: str, mode: str) -> RunningProxy:
    model = {
        "model_name": "pinging",
        "litellm_params": {
            "model": "openai/fake-model",
            "api_base": f"{upstream_url}/v1",
            "api_key": UPSTREAM_KEY,
            "stream_timeout": 0.5,
        },
        "model_info": {"max_input_tokens": 100000, "supports_function_calling": True},
    }
    lcm = {"retrieval_tools": "always"} if mode == "recall" else {}
    return proxy_factory(lcm=lcm, models=[model])  # type: ignore[no-any-return]


def stream_pinging(proxy: RunningProxy) -> tuple[httpx.Response, list[Any]]:
    body = {"model": "pinging", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=body, timeout=30) as response:
        response.read()
    lines = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    return response, [line if line == "[DONE]" else json.loads(line) for line in lines]


def test_keep_alive_comments_do_not_keep_a_stream_alive(
    pinging_proxy: RunningProxy, fake_upstream: FakeUpstream, mode: str
) -> None:
    """A comment every 0.05 s for 5 s, with no data, against a stream_timeout of 0.5 s: the stream is cut off
    with upstream_timeout (it ran to its end, past the timeout, when the timeout counted bytes)."""
    fake_upstream.enqueue(Reply(raw_sse=[event(FIRST), *[PING, 0.05] * 100, event(FINISH), DONE]))
    response, events = stream_pinging(pinging_proxy)
    assert response.status_code == 200
    assert "[DONE]" not in events
    *relayed, last = events
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in relayed) == "Hi"
    assert not any(e["choices"][0].get("finish_reason") for e in relayed)
    assert (last["error"]["code"], last["error"]["type"]) == ("upstream_timeout", "upstream_error")
    assert "for model 'pinging'" in last["error"]["message"] and "0.5 s" in last["error"]["message"]


def test_keep_alive_comments_before_the_first_chunk_are_a_504(
    pinging_proxy: RunningProxy, fake_upstream: FakeUpstream, mode: str
) -> None:
    fake_upstream.enqueue(Reply(raw_sse=[*[PING, 0.05] * 100, event(FIRST), event(FINISH), DONE]))
    response, _ = stream_pinging(pinging_proxy)
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "upstream_timeout"


def test_comments_between_chunks_within_the_timeout_are_harmless(
    pinging_proxy: RunningProxy, fake_upstream: FakeUpstream, mode: str
) -> None:
    """Data arriving within the timeout, with comments in between, streams to its end."""
    fake_upstream.enqueue(Reply(raw_sse=[PING, event(FIRST), PING, PING, event(FINISH), DONE]))
    response, events = stream_pinging(pinging_proxy)
    assert response.status_code == 200 and events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == "Hi"
