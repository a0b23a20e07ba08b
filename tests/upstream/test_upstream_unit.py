"""Unit tests of the upstream module alone, with respx standing in for the provider's HTTP API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from proxy.config.settings import GeneralSettings
from proxy.errors import UpstreamConnectionError, UpstreamContextLengthError, UpstreamError, UpstreamTimeoutError
from proxy.upstream import pool
from proxy.upstream.client import Upstream, is_context_length_error, load_litellm, translate_exception
from proxy.upstream.routing import ResolvedModel

API = "http://upstream.test/v1"
TARGET = ResolvedModel(
    alias="m",
    litellm_params={"model": "openai/real", "api_base": API, "api_key": "k-123"},
    max_input_tokens=None,
    max_output_tokens=None,
)
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
OK = {
    "id": "x",
    "object": "chat.completion",
    "created": 1,
    "model": "real",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "yo", "refusal": None},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


@pytest.fixture(autouse=True)
def httpx_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """respx mocks httpx: here the calls the proxy sends itself go out through httpx (``pool.HTTPX``); the
    aiohttp client they use otherwise is tested on real sockets (tests/upstream/test_pool.py)."""
    monkeypatch.setattr(pool, "HTTPX", True)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    litellm = load_litellm()
    previous = litellm.disable_aiohttp_transport
    litellm.disable_aiohttp_transport = True  # let respx see LiteLLM's traffic
    try:
        yield Upstream(GeneralSettings(request_timeout=2, upstream_retries=2))
    finally:
        litellm.disable_aiohttp_transport = previous


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def error_body(message: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422, 429, 500, 503])
def test_status_is_kept_with_upstream_message(upstream: Upstream, status: int) -> None:
    with respx.mock(assert_all_called=False) as mock:
        route = mock.post(f"{API}/chat/completions").respond(status, json=error_body(f"boom {status}", "c1"))
        with pytest.raises(UpstreamError) as info:
            run(upstream.complete(TARGET, BODY))
    assert info.value.status == status
    assert info.value.message == f"boom {status}"
    assert info.value.code == "c1"
    retried = status == 429 or status >= 500
    assert route.call_count == (3 if retried else 1)  # upstream_retries=2, only for retryable statuses


def test_connect_error_is_502(upstream: Upstream) -> None:
    with respx.mock() as mock:
        mock.post(f"{API}/chat/completions").mock(side_effect=httpx.ConnectError("refused"))
        with pytest.raises(UpstreamConnectionError) as info:
            run(upstream.complete(TARGET, BODY))
    assert info.value.status == 502


def test_timeout_is_504(upstream: Upstream) -> None:
    with respx.mock() as mock:
        mock.post(f"{API}/chat/completions").mock(side_effect=httpx.ReadTimeout("slow"))
        with pytest.raises(UpstreamTimeoutError) as info:
            run(upstream.complete(TARGET, BODY))
    assert info.value.status == 504 and "2 s" in info.value.message


def test_retry_then_success(upstream: Upstream) -> None:
    with respx.mock() as mock:
        route = mock.post(f"{API}/chat/completions")
        route.side_effect = [httpx.Response(503, json=error_body("busy")), httpx.Response(200, json=OK)]
        result = run(upstream.complete(TARGET, BODY))
    assert result["choices"][0]["message"] == {"role": "assistant", "content": "yo", "refusal": None}
    assert route.call_count == 2


def test_request_sends_configured_key_and_no_hidden_fields(upstream: Upstream) -> None:
    with respx.mock() as mock:
        route = mock.post(f"{API}/chat/completions").respond(200, json=OK)
        run(upstream.complete(TARGET, {**BODY, "metadata": {"a": "b"}}))
    sent = json.loads(route.calls.last.request.content)
    assert route.calls.last.request.headers["authorization"] == "Bearer k-123"
    assert sent == {"model": "real", "messages": BODY["messages"], "metadata": {"a": "b"}}


def test_missing_key_with_api_base_never_sends_proxy_environment_key(
    upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-proxy-host-secret")
    target = ResolvedModel(
        alias="m",
        litellm_params={"model": "openai/real", "api_base": API},
        max_input_tokens=None,
        max_output_tokens=None,
    )
    with respx.mock() as mock:
        route = mock.post(f"{API}/chat/completions").respond(200, json=OK)
        run(upstream.complete(target, BODY))
    assert "sk-proxy-host-secret" not in route.calls.last.request.headers["authorization"]


def test_translate_unknown_exception_is_502() -> None:
    error = translate_exception(RuntimeError("weird"))
    assert error.status == 502 and "weird" in error.message


def test_request_that_could_not_be_written_is_sent_again_once() -> None:
    """A pooled keep-alive connection that the upstream closed just as it was reused: writing the request
    fails, the upstream saw nothing, so it is sent again at once (up to three times) even with
    upstream_retries=0 (the load run got 502 "Could not connect" for it). A connection that cannot be opened
    is not sent again."""
    litellm = load_litellm()
    previous = litellm.disable_aiohttp_transport
    litellm.disable_aiohttp_transport = True
    upstream = Upstream(GeneralSettings(request_timeout=2, upstream_retries=0))
    try:
        with respx.mock() as mock:
            route = mock.post(f"{API}/chat/completions")
            route.side_effect = [httpx.WriteError("Cannot write to closing transport"), httpx.Response(200, json=OK)]
            assert run(upstream.complete(TARGET, BODY))["choices"][0]["message"]["content"] == "yo"
        assert route.call_count == 2
        with respx.mock() as mock:
            route = mock.post(f"{API}/chat/completions")
            route.side_effect = [httpx.WriteError("closing")] * 4 + [httpx.Response(200, json=OK)]
            with pytest.raises(UpstreamConnectionError):
                run(upstream.complete(TARGET, BODY))
        assert route.call_count == 4  # a bounded number of times, not in a loop
        with respx.mock() as mock:
            route = mock.post(f"{API}/chat/completions").mock(side_effect=httpx.ConnectError("refused"))
            with pytest.raises(UpstreamConnectionError):
                run(upstream.complete(TARGET, BODY))
        assert route.call_count == 1
    finally:
        litellm.disable_aiohttp_transport = previous


def test_aiohttp_write_failure_is_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same through LiteLLM's aiohttp transport, as it arrives there: httpx.ConnectError("Can not write
    request body") caused by aiohttp's ClientConnectionResetError."""
    import aiohttp

    upstream = Upstream(GeneralSettings(request_timeout=2, upstream_retries=0))
    calls: list[int] = []

    async def acompletion(**kwargs: Any) -> str:
        calls.append(1)
        if len(calls) == 1:
            try:
                raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
            except aiohttp.ClientConnectionResetError as exc:
                raise httpx.ConnectError("Can not write request body for http://upstream.test") from exc
        return "answered"

    monkeypatch.setattr(upstream._litellm, "acompletion", acompletion)
    assert run(upstream._send({}, 2.0)) == "answered"
    assert len(calls) == 2


def test_litellm_prices_nothing_and_schedules_no_success_logging(
    upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cost tracking (streamed or not) and LiteLLM's success-logging task for non-streamed calls are switched
    off (about a quarter of LiteLLM's CPU per call); a LiteLLM upgrade that moves either back onto the request
    path fails here. (A stream's end-of-stream logging task is unconditional in LiteLLM.) The provider still
    receives the client's messages, not LiteLLM's empty stand-in."""
    from litellm import cost_calculator
    from litellm.litellm_core_utils.litellm_logging import Logging

    priced: list[int] = []
    logged: list[int] = []
    original_cost = cost_calculator.completion_cost
    original_log = Logging.async_success_handler

    def counting_cost(*args: Any, **kwargs: Any) -> Any:
        priced.append(1)
        return original_cost(*args, **kwargs)

    def counting_log(self: Any, *args: Any, **kwargs: Any) -> Any:
        logged.append(1)  # when the handler's coroutine is made, i.e. when the logging task starts
        return original_log(self, *args, **kwargs)

    monkeypatch.setattr(cost_calculator, "completion_cost", counting_cost)
    monkeypatch.setattr(Logging, "async_success_handler", counting_log)
    stream_body = (
        b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"real","choices":[{"index":0,'
        b'"delta":{"role":"assistant","content":"yo"},"finish_reason":null}]}\n\n'
        b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"real","choices":[{"index":0,'
        b'"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    )

    async def both() -> tuple[Any, list[Any]]:
        answer = await upstream.complete(TARGET, BODY)
        # Run every task the call scheduled to its end (a logging task calls the handler as it starts): no clock.
        await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}), return_exceptions=True)
        assert logged == []
        stream = await upstream.open_stream(TARGET, {**BODY, "stream": True})
        return answer, [chunk async for chunk in stream]

    with respx.mock() as mock:
        route = mock.post(f"{API}/chat/completions").mock(
            side_effect=[
                httpx.Response(200, json=OK),
                httpx.Response(200, content=stream_body, headers={"content-type": "text/event-stream"}),
            ]
        )
        answer, chunks = run(both())
    assert answer["choices"][0]["message"]["content"] == "yo"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "yo"
    assert [json.loads(call.request.content)["messages"] for call in route.calls] == [BODY["messages"]] * 2
    assert priced == []


class _TranslatedStream:
    """What LiteLLM hands back for a provider it translates: its own chunk objects and whether the provider
    itself sent a finish_reason."""

    def __init__(self, chunks: list[Any], received_finish_reason: str | None) -> None:
        self.chunks, self.received_finish_reason = chunks, received_finish_reason

    async def __aiter__(self) -> Any:
        for chunk in self.chunks:
            yield chunk


@pytest.mark.parametrize("provider_finished", [True, False])
def test_translated_stream_chunks_and_truncation(provider_finished: bool) -> None:
    """Providers that do not speak OpenAI's format stream through LiteLLM's translation: chunks become wire
    JSON without LiteLLM's extras, an invented usage chunk is dropped unless asked for, and a finish that
    LiteLLM made up for a cut stream is an error."""
    from litellm.types.utils import ModelResponseStream, StreamingChoices, Usage

    from proxy.upstream.stream import litellm_chunks as _litellm_chunks

    chunks = [
        ModelResponseStream(choices=[StreamingChoices(index=0, delta={"role": "assistant", "content": "hi"})]),
        ModelResponseStream(choices=[StreamingChoices(index=0, delta={}, finish_reason="stop")]),
        ModelResponseStream(
            choices=[StreamingChoices(index=0, delta={})],
            usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
        ),
    ]
    wrapper = _TranslatedStream(chunks, "stop" if provider_finished else None)

    async def collect(include_usage: bool) -> list[Any]:
        return [chunk async for chunk in _litellm_chunks(wrapper, include_usage)]

    if not provider_finished:
        with pytest.raises(UpstreamError, match="before the response was complete"):
            run(collect(False))
        return
    plain = run(collect(False))
    assert [c["choices"][0].get("finish_reason") for c in plain] == [None, "stop"]
    assert plain[0]["choices"][0]["delta"]["content"] == "hi" and all("usage" not in c for c in plain)
    with_usage = run(collect(True))
    assert with_usage[-1]["choices"] == [] and with_usage[-1]["usage"]["total_tokens"] == 2


# --- issue 14: the upstream's error fields, malformed bodies, naming the upstream ----------------------------

LLAMA_TOO_LONG = {
    "error": {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 5000,
        "n_ctx": 4096,
    }
}
OPENAI_TOO_LONG = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
VLLM_TOO_LONG = {
    "object": "error",
    "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


@pytest.mark.parametrize(
    ("body", "kind", "code"),
    [
        (LLAMA_TOO_LONG, "exceed_context_size_error", "400"),
        (OPENAI_TOO_LONG, "invalid_request_error", "context_length_exceeded"),
        (VLLM_TOO_LONG, "BadRequestError", "400"),
    ],
    ids=["llama.cpp", "openai", "vllm"],
)
def test_context_length_errors_keep_the_upstream_fields_and_are_recognised(
    upstream: Upstream, body: dict[str, Any], kind: str, code: str
) -> None:
    """LiteLLM re-raises these as its ContextWindowExceededError without the provider's JSON: the type and
    code reached the client as "upstream_error" and null. An integer code is kept as its string."""
    with respx.mock() as mock:
        mock.post(f"{API}/chat/completions").respond(400, json=body)
        with pytest.raises(UpstreamError) as info:
            run(upstream.complete(TARGET, BODY))
    error = info.value
    assert (error.status, error.type, error.code) == (400, kind, code)
    assert error.message == (body.get("error") or body)["message"]
    assert is_context_length_error(error) and isinstance(error, UpstreamContextLengthError)


def test_is_context_length_error_by_code_type_or_message() -> None:
    assert is_context_length_error(UpstreamError("x", status=400, code="context_length_exceeded"))
    assert is_context_length_error(UpstreamError("x", status=400, type="exceed_context_size_error"))
    assert is_context_length_error(UpstreamError("prompt is too long: 210000 tokens > 200000 maximum", status=400))
    assert is_context_length_error(UpstreamError("This model's maximum context length is 4096 tokens.", status=400))
    assert not is_context_length_error(UpstreamError("Invalid 'temperature'", status=400, code="invalid_value"))
    assert not is_context_length_error(UpstreamTimeoutError("did not respond"))


def test_an_ordinary_400_is_not_a_context_length_error(upstream: Upstream) -> None:
    with respx.mock() as mock:
        mock.post(f"{API}/chat/completions").respond(400, json=error_body("Invalid 'temperature'", "invalid_value"))
        with pytest.raises(UpstreamError) as info:
            run(upstream.complete(TARGET, BODY))
    assert not is_context_length_error(info.value) and info.value.code == "invalid_value"


@pytest.mark.parametrize(
    "content",
    [
        b"<html>oops</html>",
        b"",
        b"[1, 2]",
        b'{"id": "x", "choices": "abc"}',
        b'{"id": "x", "choices": ["abc"]}',
        b'{"id": "x", "choices": [{"index": 0, "message": null, "finish_reason": "stop"}]}',
        json.dumps(
            {"choices": [{"index": 0, "message": {"role": "assistant", "tool_calls": [{"id": "a", "function": None}]}}]}
        ).encode(),
        json.dumps(
            {"choices": [{"index": 0, "message": {"role": "assistant", "tool_calls": [{"id": "a", "function": {}}]}}]}
        ).encode(),
    ],
    ids=["html", "empty", "json_list", "choices_str", "choice_str", "message_null", "function_null", "no_name"],
)
def test_malformed_200_is_a_bad_gateway_naming_the_upstream(upstream: Upstream, content: bytes) -> None:
    """LiteLLM reports a body it cannot read as its own 500 (with a Python traceback in the message): the
    client got a 500 that blamed the proxy. It is the upstream's fault; the proxy does not resend it."""
    with respx.mock() as mock:
        route = mock.post(f"{API}/chat/completions").respond(200, content=content)
        with pytest.raises(UpstreamError) as info:
            run(upstream.complete(TARGET, BODY))
    error = info.value
    assert (error.status, error.type, error.code) == (502, "upstream_error", "upstream_bad_response")
    assert error.message.startswith("The upstream provider for model 'm' sent a malformed response")
    assert "Traceback" not in error.message and "k-123" not in error.message
    assert route.call_count == 1  # answered (and billed): not sent again, unlike a 5xx (upstream_retries=2)


def test_connection_error_names_the_model_and_api_base_never_the_key(upstream: Upstream) -> None:
    with respx.mock() as mock:
        mock.post(f"{API}/chat/completions").mock(side_effect=httpx.ConnectError("refused"))
        with pytest.raises(UpstreamConnectionError) as info:
            run(upstream.complete(TARGET, BODY))
    assert info.value.message == "Could not connect to the upstream provider for model 'm'."


def test_describe_upstream_names_the_alias_never_the_api_base() -> None:
    from proxy.upstream.client import describe_upstream

    def target(api_base: str | None) -> ResolvedModel:
        params = {"model": "openai/x", "api_key": "k-123"} | ({"api_base": api_base} if api_base else {})
        return ResolvedModel("local", params, None, None)

    assert describe_upstream(target("https://user:s3cret@llm.internal:8443/v1?key=abc#f")) == (
        "the upstream provider for model 'local'"  # a deployment's host, port and path are the operator's
    )
    assert describe_upstream(target(None)) == "the upstream provider for model 'local'"
    assert describe_upstream(target("not a url")) == "the upstream provider for model 'local'"
