"""Upstream failures reach the client with a sensible status (or SSE event) and the upstream's message."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import UPSTREAM_KEY, RunningProxy


@dataclass
class Case:
    name: str
    reply: Reply | None  # None: use the "unreachable" model (connection refused)
    status: int
    message_part: str
    should_retry_false: bool


CASES = [
    Case("bad_request", Reply(status=400, error_message="Invalid 'temperature': too hot"), 400, "too hot", True),
    Case("unauthorized", Reply(status=401, error_message="Incorrect API key provided", error_type="invalid_api_key"), 401, "Incorrect API key", True),
    Case("not_found", Reply(status=404, error_message="The model `fake-model` does not exist"), 404, "does not exist", True),
    Case("rate_limited", Reply(status=429, error_message="Rate limit reached for requests", error_type="requests"), 429, "Rate limit reached", False),
    Case("server_error", Reply(status=500, error_message="The server had an error", error_type="server_error"), 500, "server had an error", False),
    Case("unavailable", Reply(status=503, error_message="Service overloaded", error_type="server_error"), 503, "overloaded", False),
    Case("connection_refused", None, 502, "Could not connect to the upstream provider for model 'unreachable'.", False),
    Case("read_timeout", Reply(delay=7.0), 504, "did not respond", False),
]  # fmt: skip


def _post(proxy: RunningProxy, model: str, stream: bool) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=30)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_upstream_error_table(proxy: RunningProxy, fake_upstream: FakeUpstream, case: Case, stream: bool) -> None:
    if case.reply is not None:
        fake_upstream.enqueue(case.reply)
    response = _post(proxy, "test-model" if case.reply else "unreachable", stream)
    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert case.message_part in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (response.headers.get("x-should-retry") == "false") is case.should_retry_false
    # Secrets never leak into error messages.
    assert UPSTREAM_KEY not in response.text
    # The message was stored before the upstream failed: the client still learns which conversation it is in.
    conversation = response.headers.get("x-lcm-conversation-id", "")
    stored = httpx.get(f"{proxy.url}/lcm/conversations/{conversation}/messages", timeout=30)
    assert stored.status_code == 200 and stored.json()["data"][-1]["message"] == {"role": "user", "content": "hi"}


def test_openai_sdk_sees_typed_errors(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    sdk = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    fake_upstream.enqueue(Reply(status=429, error_message="slow down"))
    with pytest.raises(openai.RateLimitError, match="slow down"):
        sdk.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "hi"}])
    fake_upstream.enqueue(Reply(status=400, error_message="bad thing", error_code="bad_code"))
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "hi"}])
    assert info.value.code == "bad_code"


def test_stream_cut_midway_becomes_error_event(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="one two three four five six", cut_after=3))
    body = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    payloads = [json.loads(e) for e in events]
    text = "".join(p["choices"][0]["delta"].get("content", "") for p in payloads if p.get("choices"))
    assert text == "one two three"
    assert payloads[-1]["error"]["code"] == "upstream_stream_truncated"
    # No fabricated clean finish before the error.
    assert not any(p["choices"][0].get("finish_reason") for p in payloads if p.get("choices"))


def test_stream_cut_raises_in_openai_sdk(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(content="alpha beta gamma delta", cut_after=2))
    sdk = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    received: list[str] = []
    with pytest.raises(openai.APIError, match="closed the stream"):
        for chunk in sdk.chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            received.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert "".join(received) == "alpha beta"


def test_client_disconnect_stops_upstream_stream(proxy_factory: Any, fake_upstream: FakeUpstream) -> None:
    """A client that hangs up mid-stream: the proxy hangs up on the upstream. The upstream sends a few words and
    then holds its stream open, silent, so that only the proxy closing it ends it; the proxy waits far longer
    for a chunk than this test waits, so its own timeout is not what ends it. No pacing: however slow the
    machine, the stream ends when, and only when, the proxy notices the client is gone."""
    proxy: RunningProxy = proxy_factory(request_timeout=600)
    reply = Reply(content="w0 w1 w2 w3", hold_open=True)
    fake_upstream.enqueue(reply)
    body = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if "w2" in line:
                break
    assert reply.streamed.finished.wait(60), "the upstream's stream is still open after the client hung up"
    assert reply.streamed.cancelled.is_set()


def test_malformed_upstream_json_is_a_bad_gateway(
    proxy: RunningProxy, fake_upstream: FakeUpstream, upstream_url: str
) -> None:
    """A 200 whose body is not a chat completion is the upstream's fault: exactly a 502 naming the model and its
    api_base (it was LiteLLM's 500, with a Python traceback for a message, which any 5xx check let pass)."""
    fake_upstream.enqueue(Reply(raw_body=b"<html>oops</html>"))
    response = _post(proxy, "test-model", stream=False)
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("upstream_error", "upstream_bad_response", None)
    assert error["message"].startswith("The upstream provider for model 'test-model' sent a malformed response")
    assert "Traceback" not in response.text and UPSTREAM_KEY not in response.text
    assert response.headers.get("x-should-retry") != "false"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_the_upstreams_error_type_and_code_reach_the_client(
    proxy: RunningProxy, fake_upstream: FakeUpstream, stream: bool
) -> None:
    """llama.cpp's context-size error reached the client as type "upstream_error", code null."""
    body = {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 5000,
            "n_ctx": 4096,
        }
    }
    # Twice: the proxy may compact and retry once after an upstream context-length error.
    fake_upstream.enqueue(*[Reply(status=400, raw_body=json.dumps(body).encode())] * 2)
    response = _post(proxy, "test-model", stream)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == {
        "message": body["error"]["message"],
        "type": "exceed_context_size_error",
        "param": None,
        "code": "400",
    }


@pytest.mark.parametrize("stream", [False, True])
def test_proxy_bug_is_a_non_retryable_500(proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch, stream: bool) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret internals")

    upstream = proxy.app.state.lcm.upstream
    monkeypatch.setattr(upstream, "open_stream" if stream else "complete", broken)
    response = _post(proxy, "test-model", stream)
    assert response.status_code == 500
    assert response.headers["x-should-retry"] == "false"
    assert "secret internals" not in response.text
    assert response.json()["error"]["type"] == "server_error"
