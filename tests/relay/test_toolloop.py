"""The recall loop alone, with a scripted upstream in process (``tests.support.upstream``): chunk shapes real
providers send."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.errors import UpstreamError
from proxy.relay.toolloop import RecallLoop
from proxy.upstream.routing import ResolvedModel
from tests.support.upstream import ScriptedUpstream

TARGET = ResolvedModel("m", {"model": "openai/m"}, None, None)
BASE = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}


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
    out = collect(RecallLoop(upstream, TARGET, run_tool, 3, room=5000), {"messages": [], "tools": tools}, tools)
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
    )
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
    )
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
    )
    assert [(c["id"], c["object"], c["model"]) for c in out] == [("chatcmpl-real", "chat.completion.chunk", "m")] * 2


def test_tools_that_are_not_functions_do_not_break_the_loop() -> None:
    """``custom`` tools (no ``function``, or ``function: null``) are the client's; recall calls still run."""
    from proxy.relay.toolloop import tool_name, with_recall_tools

    odd = [{"type": "custom", "function": None, "custom": {"name": "x"}}, {"type": "custom"}, "junk"]
    offered = with_recall_tools({"messages": [], "tools": odd})
    assert offered["tools"][:3] == odd and {tool_name(t) for t in offered["tools"][3:]} >= {"lcm_grep"}
    grep = {"index": 0, "id": "r1", "type": "function", "function": {"name": "lcm_grep", "arguments": "{}"}}
    upstream = ScriptedUpstream(
        [[chunk({"tool_calls": [grep]}, finish="tool_calls")], [chunk({"content": "done"}), chunk({}, finish="stop")]]
    )
    out = collect(RecallLoop(upstream, TARGET, run_tool, 3, room=5000), offered, odd)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in out) == "done"
    assert upstream.requests[1]["messages"][-1]["content"] == "result of lcm_grep"


def test_recall_calls_past_the_per_round_cap_are_not_run() -> None:
    # A prompt-injected model asks for 40 greps in one round: only the first MAX_CALLS_PER_ROUND run; the rest are
    # answered with an error the model can read, so the round stays bounded.
    from proxy.relay.toolloop import MAX_CALLS_PER_ROUND

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
    out = collect(RecallLoop(upstream, TARGET, counting_tool, 3, room=100_000), {"messages": []})
    assert len(ran) == MAX_CALLS_PER_ROUND < len(calls)
    results = [m for m in upstream.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in results].count("found") == MAX_CALLS_PER_ROUND
    assert all(m["content"].startswith("Error: at most") for m in results[MAX_CALLS_PER_ROUND:])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in out) == "ok"


# --- issue 14: one Round reads both paths --------------------------------------------------------------------


def relayed_text(out: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in out if c["choices"])


def relayed_calls(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for c in out if c["choices"] for t in c["choices"][0]["delta"].get("tool_calls") or []]


def recall_call(call_id: str, name: str, arguments: str, index: Any = 0) -> dict[str, Any]:
    call: dict[str, Any] = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return call if index is None else {"index": index, **call}


def test_text_in_the_finish_chunk_of_a_recall_round_is_relayed_and_sent_back() -> None:
    """The finish chunk carried the round's last text: it was held with the finish and lost when the round
    became a recall round (the client got "Let me  Found it.", the round-2 request lacked "look.")."""
    grep = recall_call("r1", "lcm_grep", '{"pattern": "x"}')
    upstream = ScriptedUpstream(
        [
            [
                chunk({"role": "assistant", "content": "Let me "}),
                chunk({"tool_calls": [grep]}),
                chunk({"content": "look."}, finish="tool_calls"),
            ],
            [chunk({"role": "assistant", "content": " Found it."}), chunk({}, finish="stop")],
        ]
    )
    out = collect(
        RecallLoop(upstream, TARGET, run_tool, 3, room=5000), {"messages": [{"role": "user", "content": "q"}]}
    )
    assert relayed_text(out) == "Let me look. Found it."
    assert [c["choices"][0]["finish_reason"] for c in out if c["choices"][0].get("finish_reason")] == ["stop"]
    call_message = upstream.requests[1]["messages"][1]
    assert call_message["role"] == "assistant" and call_message["content"] == "Let me look."
    assert [c["function"]["name"] for c in call_message["tool_calls"]] == ["lcm_grep"]


@pytest.mark.parametrize("index", [0, None], ids=["all_index_0", "no_index"])
def test_parallel_recall_calls_are_not_merged(index: Any) -> None:
    """Servers that number parallel calls all 0 or send no index: the proxy merged lcm_grep + lcm_describe into
    one call "lcm_greplcm_describe", which reached the client as a tool call."""
    grep = recall_call("r1", "lcm_grep", '{"pattern": "x"}', index)
    describe = recall_call("r2", "lcm_describe", '{"id": "s_1"}', index)
    upstream = ScriptedUpstream(
        [
            [
                chunk({"role": "assistant", "tool_calls": [grep]}),
                chunk({"tool_calls": [describe]}, finish="tool_calls"),
            ],
            [chunk({"content": "done"}), chunk({}, finish="stop")],
        ]
    )
    ran: list[tuple[str, str]] = []

    async def recording_tool(name: str, arguments: str) -> str:
        ran.append((name, arguments))
        return f"result of {name}"

    out = collect(RecallLoop(upstream, TARGET, recording_tool, 3, room=5000), {"messages": []})
    assert ran == [("lcm_grep", '{"pattern": "x"}'), ("lcm_describe", '{"id": "s_1"}')]
    assert relayed_text(out) == "done" and relayed_calls(out) == []
    call_message, *results = upstream.requests[1]["messages"]
    assert [c["id"] for c in call_message["tool_calls"]] == ["r1", "r2"]
    assert [r["tool_call_id"] for r in results] == ["r1", "r2"]


def test_recall_calls_mixed_with_a_client_call_never_reach_the_client() -> None:
    grep = recall_call("r1", "lcm_grep", '{"pattern": "x"}')
    weather = recall_call("c1", "get_weather", '{"city": "Oslo"}')
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    upstream = ScriptedUpstream(
        [[chunk({"tool_calls": [grep]}), chunk({"tool_calls": [weather]}, finish="tool_calls")]]
    )
    out = collect(RecallLoop(upstream, TARGET, run_tool, 3, room=5000), {"messages": [], "tools": tools}, tools)
    assert relayed_calls(out) == [{**weather, "index": 0}]
    assert [c["choices"][0]["finish_reason"] for c in out if c["choices"][0].get("finish_reason")] == ["tool_calls"]


@pytest.mark.parametrize(
    "bad",
    [
        {"index": "x", "id": "r1", "function": {"name": "lcm_grep", "arguments": "{}"}},
        {"index": 0, "id": "r1", "function": {"name": 5, "arguments": "{}"}},
        {"index": 0, "id": "r1", "function": {"name": "lcm_grep", "arguments": {"pattern": "x"}}},
    ],
    ids=["index_x", "name_a_number", "arguments_an_object"],
)
def test_malformed_stream_data_is_a_bad_stream_not_an_internal_error(bad: dict[str, Any]) -> None:
    upstream = ScriptedUpstream([[chunk({"role": "assistant", "content": "Hi"}), chunk({"tool_calls": [bad]})]])
    with pytest.raises(UpstreamError) as info:
        collect(RecallLoop(upstream, TARGET, run_tool, 3, room=5000), {"messages": []})
    assert (info.value.status, info.value.code) == (502, "upstream_bad_stream")
    assert "for model 'm'" in info.value.message


def result(content: str | None, calls: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    finish = "tool_calls" if calls else "stop"
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    } | extra


@pytest.mark.parametrize(
    "bad",
    [
        result(None, [{"id": "r1", "type": "function", "function": None}]),
        result(None, [{"id": "r1", "type": "function", "function": {"name": 5, "arguments": "{}"}}]),
        {"id": "x", "object": "chat.completion", "choices": "abc"},
    ],
    ids=["function_null", "name_a_number", "choices_a_string"],
)
def test_malformed_result_is_a_bad_gateway_naming_the_upstream(bad: dict[str, Any]) -> None:
    loop = RecallLoop(ScriptedUpstream([bad]), TARGET, run_tool, 3, room=5000)
    with pytest.raises(UpstreamError) as info:
        asyncio.run(loop.complete({"messages": []}, None))
    assert (info.value.status, info.value.code) == (502, "upstream_bad_response")
    assert "for model 'm'" in info.value.message


GREP = recall_call("r1", "lcm_grep", '{"pattern": "x"}', None)


def test_no_room_means_nothing_appended_and_a_final_round_without_recall_tools() -> None:
    """With no room left the recall call and its result were appended anyway, past the budget."""
    from proxy.relay.toolloop import with_recall_tools

    body = with_recall_tools({"messages": [{"role": "user", "content": "q"}]})
    streamed = ScriptedUpstream(
        [
            [chunk({"role": "assistant", "tool_calls": [{"index": 0, **GREP}]}, finish="tool_calls")],
            [chunk({"content": "From memory."}, finish="stop")],
        ]
    )
    out = collect(RecallLoop(streamed, TARGET, run_tool, 3, room=0), body)
    plain = ScriptedUpstream([result(None, [GREP]), result("From memory.")])
    answer = asyncio.run(RecallLoop(plain, TARGET, run_tool, 3, room=0).complete(body, None))
    assert relayed_text(out) == "From memory." == answer["choices"][0]["message"]["content"]
    for upstream in (streamed, plain):
        first, second = upstream.requests
        assert second["messages"] == first["messages"] == body["messages"]
        assert "tools" in first and "tools" not in second  # the recall tools are withdrawn


@pytest.mark.parametrize("room", [0, 40, 120, 300, 700, 2000, 6000])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_no_round_exceeds_the_room(room: int, stream: bool) -> None:
    """Every round's request stays within the room the loop was given, whatever the tools return."""
    from proxy.tokens import count_messages

    async def flooding_tool(name: str, arguments: str) -> str:
        return "a long result line about the launch plan\n" * 2000

    calls = [recall_call(f"r{i}", "lcm_grep", '{"pattern": "launch"}', None) for i in range(3)]
    if stream:
        call_chunk = chunk(
            {"content": "Looking. ", "tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]},
            finish="tool_calls",
        )
        upstream = ScriptedUpstream([[call_chunk] for _ in range(4)] + [[chunk({"content": "ok"}, finish="stop")]])
        collect(
            RecallLoop(upstream, TARGET, flooding_tool, 5, room=room), {"messages": [{"role": "user", "content": "q"}]}
        )
    else:
        upstream = ScriptedUpstream([result("Looking. ", calls) for _ in range(4)] + [result("ok")])
        loop = RecallLoop(upstream, TARGET, flooding_tool, 5, room=room)
        asyncio.run(loop.complete({"messages": [{"role": "user", "content": "q"}]}, None))
    base = count_messages(upstream.requests[0]["messages"])
    assert all(count_messages(r["messages"]) - base <= room for r in upstream.requests)
    assert len(upstream.requests) >= 2  # the loop did go on (a final round at the least)


def test_a_recall_round_is_run_by_the_proxy_and_the_client_gets_one_answer() -> None:
    """Answered in full: the recall call is run, its result sent back on the proxy's own copy of the messages,
    and the client receives the final answer alone, with the usage of both rounds."""
    ran: list[tuple[str, str]] = []

    async def recording_tool(name: str, arguments: str) -> str:
        ran.append((name, arguments))
        return "the launch moved to May"

    usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    upstream = ScriptedUpstream([result(None, [GREP], usage=usage), result("It moved to May.", usage=usage)])
    body = {"messages": [{"role": "user", "content": "when is the launch?"}]}
    answer = asyncio.run(RecallLoop(upstream, TARGET, recording_tool, 3, room=5000).complete(body, None))
    assert ran == [("lcm_grep", '{"pattern": "x"}')]
    message = answer["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "It moved to May."}
    assert answer["usage"] == {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24}
    second = upstream.requests[1]["messages"]
    assert second[:1] == body["messages"] and len(body["messages"]) == 1  # the client's own list is not extended
    assert second[1]["tool_calls"] == [GREP] and second[2] == {
        "role": "tool",
        "tool_call_id": "r1",
        "content": "the launch moved to May",
    }


def test_the_upstream_stream_is_closed_once_when_the_relay_ends() -> None:
    upstream = ScriptedUpstream([[chunk({"role": "assistant", "content": "Hi."}, finish="stop")]])
    out = collect(RecallLoop(upstream, TARGET, run_tool, 3, room=5000), {"messages": []})
    assert relayed_text(out) == "Hi."
    assert [s.closed for s in upstream.streams] == [1]
