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
