"""OpenAI's Responses API called natively (``proxy.upstream.responses`` through ``Upstream``), with respx
standing in for the provider: which deployments speak it, what is sent, answers, errors and streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from proxy.config.settings import GeneralSettings
from proxy.errors import UpstreamError
from proxy.upstream import pool, responses
from proxy.upstream.client import Upstream, load_litellm
from proxy.upstream.responses import ResponsesStream, client_headers, is_responses
from proxy.upstream.routing import ResolvedModel
from proxy.upstream.sse_events import Event
from tests.support.fake_responses import FakeResponses, RReply
from tests.support.servers import serve_in_thread

API = "http://upstream.test/v1"
TARGET = ResolvedModel(
    alias="codex",
    litellm_params={"model": "openai/responses/gpt-5", "api_base": API, "api_key": "k-123"},
    max_input_tokens=None,
    max_output_tokens=None,
)
BODY: dict[str, Any] = {"model": "codex", "input": [{"type": "message", "role": "user", "content": "hi"}]}
ANSWER: dict[str, Any] = {"id": "resp_1", "object": "response", "status": "completed", "output": []}


@pytest.fixture(autouse=True)
def httpx_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """respx mocks httpx: here the calls the proxy sends itself go out through httpx (``pool.HTTPX``); the
    aiohttp client they use otherwise is tested on real sockets (tests/upstream/test_pool.py)."""
    monkeypatch.setattr(pool, "HTTPX", True)


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


CREATED = {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_1", "output": []}}
ITEM = {"type": "message", "id": "msg_1", "role": "assistant", "content": [], "status": "in_progress"}
ADDED = {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": ITEM}
DELTA = {
    "type": "response.output_text.delta",
    "sequence_number": 2,
    "item_id": "msg_1",
    "output_index": 0,
    "content_index": 0,
    "delta": "yo",
}
COMPLETED = {"type": "response.completed", "sequence_number": 3, "response": {"id": "resp_1", "output": [ITEM]}}


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    litellm = load_litellm()
    previous = litellm.disable_aiohttp_transport
    litellm.disable_aiohttp_transport = True
    try:
        yield Upstream(GeneralSettings(request_timeout=2, upstream_retries=1))
    finally:
        litellm.disable_aiohttp_transport = previous


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize(
    ("model", "mode", "expected"),
    [
        ("openai/responses/gpt-5", None, True),
        ("azure/responses/my-deployment", None, True),
        ("openai/gpt-5", None, False),
        ("openai/gpt-5", "responses", True),
        ("azure/my-deployment", "responses", True),
        ("openai/gpt-5", "chat", False),
        ("anthropic/claude-sonnet-4-5", "responses", False),  # an Anthropic deployment never speaks it
        ("hosted_vllm/responses/x", None, False),
        ("not-a-provider/x", None, False),
    ],
)
def test_which_deployments_speak_responses(model: str, mode: str | None, expected: bool) -> None:
    kwargs: dict[str, Any] = {"model": model, "api_base": API}
    if mode is not None:
        kwargs["model_info"] = {"mode": mode}
    assert is_responses(load_litellm(), kwargs) is expected


def test_speaks_responses_reads_the_deployments_model_info(upstream: Upstream) -> None:
    plain = ResolvedModel(alias="m", litellm_params={"model": "openai/gpt-5"}, max_input_tokens=None,
                          max_output_tokens=None)  # fmt: skip
    assert upstream.speaks_responses(TARGET)
    assert not upstream.speaks_responses(plain)
    assert upstream.speaks_responses(ResolvedModel(**{**plain.__dict__, "mode": "responses"}))
    assert not upstream.speaks_messages(TARGET)


def test_model_info_mode_reaches_the_resolved_model() -> None:
    from proxy.config.settings import ModelDeployment
    from proxy.upstream.routing import ModelRouter

    deployment = ModelDeployment.model_validate(
        {"model_name": "m", "litellm_params": {"model": "openai/gpt-5"}, "model_info": {"mode": "responses"}}
    )
    assert ModelRouter([deployment]).resolve("m").mode == "responses"


def test_client_headers_keep_codex_headers_and_no_credential() -> None:
    headers = {
        "Authorization": "Bearer client-key",
        "api-key": "x",
        "OpenAI-Organization": "org-client",
        "User-Agent": "codex_cli_rs/0.169",
        "originator": "codex_cli_rs",
        "session-id": "abc",
        "x-codex-turn-metadata": "{}",
        "x-codex-beta-features": "remote_compaction_v2",
        "content-length": "12",
    }
    assert client_headers(headers) == {
        "user-agent": "codex_cli_rs/0.169",
        "originator": "codex_cli_rs",
        "session-id": "abc",
        "x-codex-turn-metadata": "{}",
        "x-codex-beta-features": "remote_compaction_v2",
    }


def test_a_plain_answer_and_what_was_sent(upstream: Upstream) -> None:
    target = ResolvedModel(
        **{**TARGET.__dict__, "litellm_params": {**TARGET.litellm_params, "extra_headers": {"X-Team": "a"}}}
    )
    with respx.mock() as mock:
        route = mock.post(f"{API}/responses").respond(200, json=ANSWER)
        answer = run(upstream.responses(target, BODY, {"session-id": "s1"}))
    assert answer == ANSWER
    request = route.calls.last.request
    assert json.loads(request.content) == {**BODY, "model": "gpt-5"}  # the responses/ prefix stripped
    assert request.headers["authorization"] == "Bearer k-123"
    assert request.headers["session-id"] == "s1" and request.headers["x-team"] == "a"
    assert request.headers["accept"] == "application/json"
    assert upstream.balancer.in_flight.get(TARGET.deployment, 0) == 0


def test_azure_url_and_key_header(upstream: Upstream) -> None:
    base = "https://example.openai.azure.com"
    target = ResolvedModel(alias="a", litellm_params={"model": "azure/responses/dep", "api_base": base,
                           "api_key": "az-key"}, max_input_tokens=None, max_output_tokens=None)  # fmt: skip
    versioned = ResolvedModel(**{**target.__dict__, "litellm_params": {**target.litellm_params,
                              "api_version": "2025-04-01-preview"}})  # fmt: skip
    with respx.mock() as mock:
        v1 = mock.post(f"{base}/openai/v1/responses").respond(200, json=ANSWER)
        dated = mock.post(f"{base}/openai/responses", params={"api-version": "2025-04-01-preview"}).respond(
            200, json=ANSWER
        )
        run(upstream.responses(target, BODY, {}))
        run(upstream.responses(versioned, BODY, {}))
    assert v1.calls.last.request.headers["api-key"] == "az-key"
    assert "authorization" not in v1.calls.last.request.headers
    assert json.loads(dated.calls.last.request.content)["model"] == "dep"


@pytest.mark.parametrize("status", [400, 401, 404, 429, 500])
def test_error_status_keeps_the_providers_fields(upstream: Upstream, status: int) -> None:
    body = {"error": {"message": f"no {status}", "type": "invalid_request_error", "param": "input", "code": "c"}}
    with respx.mock() as mock:
        route = mock.post(f"{API}/responses").respond(status, json=body)
        with pytest.raises(UpstreamError) as info:
            run(upstream.responses(TARGET, BODY, {}))
    assert (info.value.status, info.value.message, info.value.code) == (status, f"no {status}", "c")
    assert route.call_count == (2 if status in (429, 500) else 1)  # upstream_retries=1: retryable ones again


def test_context_length_refusal_is_a_context_length_error(upstream: Upstream) -> None:
    body = {"error": {"message": "Your input exceeds the context window of this model.", "type":
            "invalid_request_error", "param": "input", "code": "context_length_exceeded"}}  # fmt: skip
    with respx.mock() as mock:
        mock.post(f"{API}/responses").respond(400, json=body)
        with pytest.raises(UpstreamError) as info:
            run(upstream.responses(TARGET, BODY, {}))
    assert info.value.code == "context_length_exceeded" and info.value.status == 400


@pytest.mark.parametrize("content", [b"[1, 2]", b"<html>", b""])
def test_an_answer_that_is_no_json_object_is_a_502(upstream: Upstream, content: bytes) -> None:
    with respx.mock() as mock:
        mock.post(f"{API}/responses").respond(200, content=content)
        with pytest.raises(UpstreamError) as info:
            run(upstream.responses(TARGET, BODY, {}))
    assert (info.value.status, info.value.code) == (502, "upstream_bad_response")


def test_an_answer_over_the_byte_cap_is_a_502() -> None:
    litellm = load_litellm()
    previous, litellm.disable_aiohttp_transport = litellm.disable_aiohttp_transport, True
    try:
        small = Upstream(GeneralSettings(request_timeout=2, max_upstream_response_bytes=1024))
        with respx.mock() as mock:
            mock.post(f"{API}/responses").respond(200, json={**ANSWER, "pad": "x" * 2000})
            with pytest.raises(UpstreamError) as info:
                run(small.responses(TARGET, BODY, {}))
    finally:
        litellm.disable_aiohttp_transport = previous
    assert (info.value.status, info.value.code) == (502, "upstream_response_too_large")


async def _read(upstream: Upstream) -> tuple[list[Event], list[str]]:
    stream = await upstream.open_responses_stream(TARGET, {**BODY, "stream": True}, {})
    closed: list[str] = []
    stream.on_close(lambda: closed.append("closed"))
    try:
        events = [event async for event in stream]
    finally:
        await stream.aclose()
        await stream.aclose()  # closed once
    return events, closed


def test_a_stream_relays_each_event_as_it_came(upstream: Upstream) -> None:
    content = sse(CREATED, ADDED) + b": keep-alive\n\n" + sse(DELTA, COMPLETED).replace(b"\n", b"\r\n")
    with respx.mock() as mock:
        route = mock.post(f"{API}/responses").respond(
            200, content=content + b"data: [DONE]\n\n", headers={"content-type": "text/event-stream"}
        )
        events, closed = run(_read(upstream))
    assert [e.type for e in events] == ["response.created", "response.output_item.added",
                                        "response.output_text.delta", "response.completed"]  # fmt: skip
    assert events[0].raw == sse(CREATED) and events[2].data == DELTA
    assert events[3].raw == sse(COMPLETED)  # CRLF read as LF
    assert closed == ["closed"]
    assert route.calls.last.request.headers["accept"] == "text/event-stream"
    assert upstream.balancer.in_flight.get(TARGET.deployment, 0) == 0


@pytest.mark.parametrize(
    "event",
    [
        {**ADDED, "output_index": "0"},
        {k: v for k, v in ADDED.items() if k != "item"},
        {**ADDED, "type": "response.output_item.done", "output_index": True},
        {**DELTA, "delta": None},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 0, "delta": {}},
        {"type": "response.completed", "sequence_number": 9},
        {"type": "response.content_part.added", "item_id": "m", "output_index": 0, "content_index": 0},
        {"type": "response.output_text.done", "item_id": "m", "output_index": 0, "content_index": 0},
    ],
)
def test_a_malformed_event_is_a_502(upstream: Upstream, event: dict[str, Any]) -> None:
    with respx.mock() as mock:
        mock.post(f"{API}/responses").respond(200, content=sse(CREATED, event))
        with pytest.raises(UpstreamError) as info:
            run(_read(upstream))
    assert (info.value.status, info.value.code) == (502, "upstream_bad_stream")


def test_an_event_that_is_not_json_is_a_502(upstream: Upstream) -> None:
    with respx.mock() as mock:
        mock.post(f"{API}/responses").respond(200, content=sse(CREATED) + b"data: {nope\n\n")
        with pytest.raises(UpstreamError) as info:
            run(_read(upstream))
    assert info.value.status == 502


def test_unknown_and_error_events_are_relayed(upstream: Upstream) -> None:
    error = {"type": "error", "sequence_number": 1, "code": "server_error", "message": "boom", "param": None}
    future = {"type": "response.something_new", "sequence_number": 2, "whatever": [1]}
    with respx.mock() as mock:
        mock.post(f"{API}/responses").respond(200, content=sse(CREATED, error, future))
        events, _ = run(_read(upstream))
    assert [e.data for e in events[1:]] == [error, future]


def test_a_stream_refused_before_its_first_byte_moves_to_the_fallback(upstream: Upstream) -> None:
    other = "http://other.test/v1"
    second = ResolvedModel(**{**TARGET.__dict__, "litellm_params": {**TARGET.litellm_params, "api_base": other},
                              "deployment": "model_list[1]"})  # fmt: skip
    first = ResolvedModel(**{**TARGET.__dict__, "deployment": "model_list[0]"})
    target = ResolvedModel(**{**first.__dict__, "tiers": ((first,), (second,))})
    with respx.mock() as mock:
        down = mock.post(f"{API}/responses").respond(503, json={"error": {"message": "overloaded"}})
        up = mock.post(f"{other}/responses").respond(200, content=sse(CREATED, COMPLETED))

        async def go() -> list[str]:
            stream = await upstream.open_responses_stream(target, {**BODY, "stream": True}, {})
            try:
                return [event.type async for event in stream]
            finally:
                await stream.aclose()

        assert run(go()) == ["response.created", "response.completed"]
    assert down.call_count == 1 and up.call_count == 1


def test_send_uses_the_environment_for_openai_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_BASE", raising=False)
    model, url, auth = responses.endpoint(load_litellm(), {"model": "openai/responses/gpt-5"})
    assert (model, url, auth) == ("gpt-5", "https://api.openai.com/v1/responses", {"authorization": "Bearer sk-env"})


def test_a_stream_over_loopback_reads_events_split_across_chunks(upstream: Upstream) -> None:
    """Events split mid-line across network chunks are joined before parsing."""
    content = sse(CREATED, ADDED, DELTA, COMPLETED)

    async def chunks() -> Any:
        for i in range(0, len(content), 7):
            yield content[i : i + 7]

    async def go() -> list[Event]:
        response = httpx.Response(200, content=chunks())
        stream = ResponsesStream(response, "the upstream")
        return [event async for event in stream]

    assert [e.data for e in run(go())] == [CREATED, ADDED, DELTA, COMPLETED]


def test_against_the_fake_over_loopback() -> None:
    """The fake Responses upstream on a real socket: a streamed answer read natively, a refusal mapped."""
    fake = FakeResponses()
    fake.enqueue(RReply(text="hi there", function_calls=[{"name": "shell", "arguments": {"command": "ls"}}]))
    upstream = Upstream(GeneralSettings(request_timeout=5))
    with serve_in_thread(fake.app) as url:
        target = ResolvedModel(alias="codex", litellm_params={"model": "openai/responses/gpt-5-codex",
                               "api_base": f"{url}/v1", "api_key": "sk-up"}, max_input_tokens=None,
                               max_output_tokens=None)  # fmt: skip
        headers = client_headers({"session-id": "s1", "authorization": "Bearer client"})

        async def go() -> list[Event]:
            stream = await upstream.open_responses_stream(target, {**BODY, "stream": True}, headers)
            try:
                return [event async for event in stream]
            finally:
                await stream.aclose()

        events = run(go())
        compaction = {"type": "compaction", "id": "cmp_1", "encrypted_content": "ours"}
        with pytest.raises(UpstreamError) as refused:
            run(upstream.responses(target, {**BODY, "input": [*BODY["input"], compaction]}, headers))
    assert events[-1].type == "response.completed"
    assert [e.data["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1].data["response"]["output"][1]["name"] == "shell"
    assert fake.requests[0].body["model"] == "gpt-5-codex" and fake.requests[0].headers["session-id"] == "s1"
    assert fake.requests[0].headers["authorization"] == "Bearer sk-up"
    assert refused.value.status == 400 and refused.value.code == "invalid_encrypted_content"
    assert "could not be verified" in refused.value.message
