"""The recall loop alone, with a scripted upstream: chunk shapes real providers send."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from proxy.routing import ResolvedModel
from proxy.toolloop import RecallLoop

TARGET = ResolvedModel("m", {"model": "openai/m"}, None, None)
BASE = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}


class ScriptedUpstream:
    def __init__(self, rounds: list[list[dict[str, Any]]]) -> None:
        self.rounds = rounds
        self.requests: list[dict[str, Any]] = []

    async def open_stream(self, target: ResolvedModel, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        self.requests.append(body)
        chunks = self.rounds.pop(0)

        class Stream:
            async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
                for chunk in chunks:
                    yield chunk

            async def aclose(self) -> None:
                pass

        return Stream()  # type: ignore[return-value]


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {**BASE, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def collect(loop: RecallLoop, body: dict[str, Any], client_tools: Any = None) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        stream = await loop.open_stream(body, client_tools, include_usage=False)
        return [c async for c in stream]

    return asyncio.run(go())


async def run_tool(name: str, arguments: str) -> str:
    return f"result of {name}"


def test_finish_in_the_same_chunk_as_a_client_tool_call() -> None:
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    upstream = ScriptedUpstream([[chunk({"role": "assistant"}), chunk({"tool_calls": [call]}, finish="tool_calls")]])
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    out = collect(RecallLoop(upstream, TARGET, run_tool, 3, room=5000), {"messages": [], "tools": tools}, tools)  # type: ignore[arg-type]
    finishes = [c["choices"][0]["finish_reason"] for c in out if c["choices"][0].get("finish_reason")]
    assert finishes == ["tool_calls"]
    assert [
        c["choices"][0]["delta"]["tool_calls"][0]["id"] for c in out if c["choices"][0]["delta"].get("tool_calls")
    ] == ["c1"]


def test_text_before_a_recall_call_is_sent_once_and_role_once() -> None:
    grep = {
        "index": 0,
        "id": "r1",
        "type": "function",
        "function": {"name": "lcm_grep", "arguments": '{"pattern": "x"}'},
    }
    upstream = ScriptedUpstream(
        [
            [
                chunk({"role": "assistant", "content": "Let me look. "}),
                chunk({"tool_calls": [grep]}),
                chunk({}, finish="tool_calls"),
            ],
            [chunk({"role": "assistant", "content": "Found it."}), chunk({}, finish="stop")],
        ]
    )
    out = collect(
        RecallLoop(upstream, TARGET, run_tool, 3, room=5000), {"messages": [{"role": "user", "content": "q"}]}
    )  # type: ignore[arg-type]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in out) == "Let me look. Found it."
    assert sum(1 for c in out if "role" in c["choices"][0]["delta"]) == 1
    assert [c["choices"][0]["finish_reason"] for c in out if c["choices"][0].get("finish_reason")] == ["stop"]
    assert upstream.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "r1",
        "content": "result of lcm_grep",
    }


def test_content_tool_call_and_finish_in_one_chunk() -> None:
    """One chunk with text, a client tool call and the finish: the text goes on, then the call, then the finish
    (a content-only chunk must not take the finish's place)."""
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    one = chunk({"role": "assistant", "content": "Checking.", "tool_calls": [call]}, finish="tool_calls")
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    out = collect(
        RecallLoop(ScriptedUpstream([[one]]), TARGET, run_tool, 3, room=5000), {"messages": [], "tools": tools}, tools
    )  # type: ignore[arg-type]
    kinds = [
        "content"
        if c["choices"][0]["delta"].get("content")
        else "call"
        if c["choices"][0]["delta"].get("tool_calls")
        else "finish"
        for c in out
    ]
    assert kinds == ["content", "call", "finish"]
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert [c["choices"][0]["finish_reason"] for c in out[:-1]] == [None, None]


def test_ids_come_from_the_first_answer_chunk_not_an_empty_preamble() -> None:
    """Azure sends a content-filter chunk first, with no choices and empty id/object/model."""
    preamble = {"id": "", "object": "", "created": 0, "model": "", "choices": [], "prompt_filter_results": []}
    real = {**BASE, "id": "chatcmpl-real"}
    first = {**real, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]}
    last = {**real, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    out = collect(
        RecallLoop(ScriptedUpstream([[preamble, first, last]]), TARGET, run_tool, 3, room=5000), {"messages": []}
    )  # type: ignore[arg-type]
    assert [(c["id"], c["object"], c["model"]) for c in out] == [("chatcmpl-real", "chat.completion.chunk", "m")] * 2


def test_tools_that_are_not_functions_do_not_break_the_loop() -> None:
    """``custom`` tools (no ``function``, or ``function: null``) are the client's; recall calls still run."""
    from proxy.toolloop import tool_name, with_recall_tools

    odd = [{"type": "custom", "function": None, "custom": {"name": "x"}}, {"type": "custom"}, "junk"]
    offered = with_recall_tools({"messages": [], "tools": odd})
    assert offered["tools"][:3] == odd and {tool_name(t) for t in offered["tools"][3:]} >= {"lcm_grep"}
    grep = {"index": 0, "id": "r1", "type": "function", "function": {"name": "lcm_grep", "arguments": "{}"}}
    upstream = ScriptedUpstream(
        [[chunk({"tool_calls": [grep]}, finish="tool_calls")], [chunk({"content": "done"}), chunk({}, finish="stop")]]
    )
    out = collect(RecallLoop(upstream, TARGET, run_tool, 3, room=5000), offered, odd)  # type: ignore[arg-type]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in out) == "done"
    assert upstream.requests[1]["messages"][-1]["content"] == "result of lcm_grep"


def test_recall_calls_past_the_per_round_cap_are_not_run() -> None:
    # A prompt-injected model asks for 40 greps in one round: only the first MAX_CALLS_PER_ROUND run; the rest are
    # answered with an error the model can read, so the round stays bounded.
    from proxy.toolloop import MAX_CALLS_PER_ROUND

    calls = [
        {
            "index": i,
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "lcm_grep", "arguments": '{"pattern": "x"}'},
        }
        for i in range(40)
    ]
    ran: list[str] = []

    async def counting_tool(name: str, arguments: str) -> str:
        ran.append(name)
        return "found"

    upstream = ScriptedUpstream(
        [
            [chunk({"role": "assistant", "tool_calls": calls}, finish="tool_calls")],
            [chunk({"content": "ok"}, finish="stop")],
        ]
    )
    out = collect(RecallLoop(upstream, TARGET, counting_tool, 3, room=100_000), {"messages": []})  # type: ignore[arg-type]
    assert len(ran) == MAX_CALLS_PER_ROUND < len(calls)
    results = [m for m in upstream.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in results].count("found") == MAX_CALLS_PER_ROUND
    assert all(m["content"].startswith("Error: at most") for m in results[MAX_CALLS_PER_ROUND:])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in out) == "ok"
