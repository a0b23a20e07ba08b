"""Tool calls that cannot be told apart or cannot be run, end to end: one rule, streamed or not, with the recall
loop offered or not.

An answer with two tool calls under one id, or a call without a function name, is a malformed answer: a 502
``upstream_bad_response`` naming the upstream, or, streamed, an ``upstream_bad_stream`` error event in place of
the calls and the finish. Nothing of it runs, a recall call never reaches the client, and the client never
gets ``finish_reason: tool_calls`` without a call. Shapes real servers send for *one* call (the whole name
again on every delta, a fresh id on every fragment) stay one call, run once."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from proxy.upstream import direct
from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import RunningProxy


@pytest.fixture(params=["plain", "recall"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def mode_proxy(proxy_factory: Any, mode: str) -> RunningProxy:
    """Without the recall loop (a short new conversation), or with it (``retrieval_tools: always``)."""
    lcm = {"retrieval_tools": "always"} if mode == "recall" else {}
    return proxy_factory(lcm=lcm)  # type: ignore[no-any-return]


def grep(pattern: str, call_id: str) -> dict[str, Any]:
    arguments = json.dumps({"pattern": pattern})
    return {"id": call_id, "type": "function", "function": {"name": "lcm_grep", "arguments": arguments}}


def ask(proxy: RunningProxy, stream: bool) -> tuple[httpx.Response, list[Any]]:
    """The client's request; with ``stream`` the SSE events it received (``[DONE]`` as a string)."""
    body = {"model": "test-model", "messages": [{"role": "user", "content": "what did we say?"}], "stream": stream}
    if not stream:
        return httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=30), []
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=body, timeout=30) as response:
        response.read()
    lines = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    return response, [line if line == "[DONE]" else json.loads(line) for line in lines]


def offered(fake: FakeUpstream) -> list[str]:
    return [t["function"]["name"] for t in fake.requests[0].body.get("tools") or []]


def assert_malformed(
    fake: FakeUpstream, mode: str, stream: bool, response: httpx.Response, events: list[Any], what: str
) -> None:
    assert ("lcm_grep" in offered(fake)) is (mode == "recall")
    assert len(fake.requests) == 1  # nothing ran: a recall call run would have asked the upstream again
    if not stream:
        assert response.status_code == 502, response.text
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("upstream_error", "upstream_bad_response")
    else:
        assert response.status_code == 200
        *relayed, last = events  # no [DONE]: the stream ends with the error
        error = last["error"]
        assert (error["type"], error["code"]) == ("upstream_error", "upstream_bad_stream"), error
        assert not any(e["choices"][0].get("finish_reason") for e in relayed)  # never "tool_calls" with no call
        calls = [t for e in relayed for t in e["choices"][0]["delta"].get("tool_calls") or []]
        if mode == "recall":
            assert calls == []  # held until the round's outcome was known: no lcm_grep reached the client
    assert error["message"].startswith("The upstream provider for model 'test-model'")
    assert what in error["message"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_two_calls_with_one_id_are_a_malformed_answer(
    mode_proxy: RunningProxy, fake_upstream: FakeUpstream, mode: str, stream: bool
) -> None:
    """Streamed, the two lcm_grep calls (index 0 and 1, one id) were merged into one call named
    "lcm_greplcm_grep" and relayed to the client as tool calls it never offered; not streamed, both ran and
    the next round carried two results under one tool_call_id."""
    fake_upstream.enqueue(Reply(content=None, tool_calls=[grep("launch", "call_1"), grep("budget", "call_1")]))
    fake_upstream.enqueue(Reply(content="done"))
    response, events = ask(mode_proxy, stream)
    assert_malformed(fake_upstream, mode, stream, response, events, "two tool calls with the same id")


NAMELESS = {
    "function_null": {"id": "call_1", "type": "function", "function": None},
    "name_empty": {"id": "call_1", "type": "function", "function": {"name": "", "arguments": "{}"}},
    "name_missing": {"id": "call_1", "type": "function", "function": {"arguments": "{}"}},
}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("shape", list(NAMELESS))
def test_a_call_without_a_name_is_a_malformed_answer(
    mode_proxy: RunningProxy, fake_upstream: FakeUpstream, mode: str, stream: bool, shape: str
) -> None:
    """Streamed, ``function: null`` reached the client as ``finish_reason: tool_calls`` with no call to make;
    not streamed, the same answer was a 502."""
    fake_upstream.enqueue(Reply(content=None, tool_calls=[NAMELESS[shape]]), Reply(content="done"))
    response, events = ask(mode_proxy, stream)
    # LiteLLM itself cannot read a JSON body with ``function: null``: the same 502, in its words; the direct
    # path (the default for this OpenAI-compatible upstream) reads it and names what is wrong.
    unreadable = shape == "function_null" and not stream
    if unreadable and direct.ENABLED:
        what = "a tool call without a function object"
    elif unreadable:
        what = "not a chat completion that could be read"
    else:
        what = "a tool call without a function name"
    assert_malformed(fake_upstream, mode, stream, response, events, what)


# --- shapes of one call that real servers stream: still one call, run once ----------------------------------

BASE = {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1, "model": "fake-model"}


def sse(*deltas: dict[str, Any], finish: str = "tool_calls") -> list[bytes | float]:
    events = [{**BASE, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    events.append({**BASE, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def piece(call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    call: dict[str, Any] = {"index": 0, "type": "function", "function": function}
    return {"tool_calls": [call | ({"id": call_id} if call_id else {})]}


ONE_CALL = {
    # MiniMax through NVIDIA NIM: the id and the whole name again on every delta.
    "name_on_every_delta": [piece("r1", "lcm_grep", '{"pattern":'), piece("r1", "lcm_grep", ' "launch"}')],
    # LM Studio: the name once, then every fragment of the arguments under a fresh id and no name.
    "fresh_id_per_fragment": [
        piece("r1", "lcm_grep", ""),
        piece("f2", None, '{"pattern":'),
        piece("f3", None, ' "launch"}'),
    ],
}


@pytest.mark.parametrize("shape", list(ONE_CALL))
def test_one_call_streamed_in_pieces_runs_once(proxy_factory: Any, fake_upstream: FakeUpstream, shape: str) -> None:
    recall = proxy_factory(lcm={"retrieval_tools": "always"})
    fake_upstream.enqueue(Reply(raw_sse=sse({"role": "assistant", "content": ""}, *ONE_CALL[shape])))
    fake_upstream.enqueue(Reply(content="Nothing about the launch."))
    response, events = ask(recall, stream=True)
    assert response.status_code == 200 and events[-1] == "[DONE]"
    relayed = events[:-1]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in relayed) == "Nothing about the launch."
    assert not any(e["choices"][0]["delta"].get("tool_calls") for e in relayed)
    assert [e["choices"][0]["finish_reason"] for e in relayed if e["choices"][0].get("finish_reason")] == ["stop"]
    assert len(fake_upstream.requests) == 2
    *_, call_message, result = fake_upstream.requests[1].body["messages"]
    assert call_message["tool_calls"] == [
        {"id": "r1", "type": "function", "function": {"name": "lcm_grep", "arguments": '{"pattern": "launch"}'}}
    ]
    assert result["role"] == "tool" and result["tool_call_id"] == "r1"
    assert result["content"].startswith("No matches for 'launch'")  # lcm_grep ran, with the whole arguments


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("name", ["lcm_greplcm_describe", "lcm_search"])
def test_a_call_to_an_lcm_name_never_reaches_the_client(
    proxy_factory: Any, fake_upstream: FakeUpstream, stream: bool, name: str
) -> None:
    """A recall call garbled by a provider's stream shape, or a recall tool the model made up, was relayed to the
    client as a call to a tool it never offered. The proxy answers it (an error naming the tool) and goes on."""
    recall = proxy_factory(lcm={"retrieval_tools": "always"})
    call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": "{}"}}
    fake_upstream.enqueue(Reply(content=None, tool_calls=[call]), Reply(content="Answered from memory."))
    response, events = ask(recall, stream)
    assert response.status_code == 200, response.text
    if stream:
        assert not any(e["choices"][0]["delta"].get("tool_calls") for e in events[:-1])
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == "Answered from memory."
    else:
        message = response.json()["choices"][0]["message"]
        assert "tool_calls" not in message and message["content"] == "Answered from memory."
    assert len(fake_upstream.requests) == 2
    result = fake_upstream.requests[1].body["messages"][-1]
    assert (result["role"], result["tool_call_id"], result["content"]) == (
        "tool",
        "call_1",
        f"Error: unknown tool {name}",
    )


def test_every_recall_tool_is_an_lcm_name() -> None:
    """The loop keeps every ``lcm_`` call from the client: a recall tool named otherwise would reach it."""
    from proxy.engine.recall.schema import RECALL_TOOL_NAMES
    from proxy.relay.toolloop import RECALL_PREFIX

    assert RECALL_TOOL_NAMES and all(name.startswith(RECALL_PREFIX) for name in RECALL_TOOL_NAMES)
