"""Responses <-> Chat Completions (``proxy.upstream.translate_responses``, ``..._stream``): requests item by
item, whole answers and streams, each answer and event parsed by OpenAI's own SDK."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pydantic
import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from proxy.errors import UpstreamError
from proxy.upstream.translate_responses import Untranslatable, chat_to_response, responses_to_chat
from proxy.upstream.translate_responses_stream import ChatToResponsesStream, ResponsesEvents

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
FUNCTION = {
    "type": "function",
    "name": "shell",
    "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}},
    "strict": False,
}
CUSTOM = {"type": "custom", "name": "apply_patch", "description": "Apply a patch", "format": {"type": "text"}}


def user(content: Any) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": content}


def chat(body: dict[str, Any]) -> dict[str, Any]:
    return responses_to_chat({"model": "m", **body})


# --- request ---


def test_instructions_and_a_string_input() -> None:
    assert chat({"instructions": "Be terse.", "input": "hi"}) == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
    }


def test_message_roles_and_parts() -> None:
    body = {
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "base prompt"}]},
            {"role": "system", "content": "sys"},  # an easy input message: no type
            user(
                [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "high"},
                    {"type": "input_image", "file_id": "file-1"},
                ]
            ),
            user([{"type": "input_file", "file_data": "data:application/pdf;base64,JV", "filename": "a.pdf"}]),
            {
                "type": "message",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "Sure", "annotations": []},
                    {"type": "refusal", "refusal": " not that"},
                ],
            },
            user([{"type": "input_text", "text": "alone"}]),
        ]
    }
    assert chat(body)["messages"] == [
        {"role": "system", "content": "base prompt"},
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "high"}},
            {"type": "file", "file": {"file_id": "file-1"}},
        ]},
        {"role": "user", "content": [
            {"type": "file", "file": {"file_data": "data:application/pdf;base64,JV", "filename": "a.pdf"}}
        ]},
        {"role": "assistant", "content": "Sure not that"},
        {"role": "user", "content": "alone"},
    ]  # fmt: skip


def call(call_id: str, name: str = "shell", arguments: str = '{"command":["ls"]}') -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_" + call_id, "call_id": call_id, "name": name, "arguments": arguments}


def output(call_id: str, out: Any = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": out}


def chat_call(call_id: str, name: str = "shell", arguments: str = '{"command":["ls"]}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_calls_merge_into_one_assistant_message_with_the_text_before_them() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"}
    body = {
        "input": [
            user("go"),
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running."}]},
            reasoning,
            call("c1"),
            reasoning,
            call("c2"),
            output("c1"),
            output("c2", [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "x"}]),
            call("c3"),
            output("c3"),
        ]
    }
    assert chat(body)["messages"] == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Running.", "tool_calls": [chat_call("c1"), chat_call("c2")]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "tool", "tool_call_id": "c2", "content": "a\n[image]"},
        {"role": "assistant", "content": None, "tool_calls": [chat_call("c3")]},
        {"role": "tool", "tool_call_id": "c3", "content": "ok"},
    ]


def test_a_call_after_a_user_message_starts_its_own_assistant_message() -> None:
    body = {"input": [{"type": "message", "role": "assistant", "content": "before"}, user("u"), call("c1")]}
    assert chat(body)["messages"][1:] == [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": [chat_call("c1")]},
    ]


def test_custom_tool_calls_and_outputs() -> None:
    patch = "*** Begin Patch\n*** End Patch\n"
    body = {
        "input": [
            user("patch it"),
            {"type": "custom_tool_call", "id": "ctc_1", "call_id": "c1", "name": "apply_patch", "input": patch},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"},
        ],
        "tools": [CUSTOM],
    }
    translated = chat(body)
    assert translated["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [chat_call("c1", "apply_patch", json.dumps({"input": patch}, separators=(",", ":")))],
    }
    assert translated["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "Done"}
    assert translated["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "apply_patch",
                "description": "Apply a patch",
                "parameters": {
                    "type": "object",
                    "properties": {"input": {"type": "string", "description": "The tool's input, as free-form text."}},
                    "required": ["input"],
                    "additionalProperties": False,
                },
            },
        }
    ]


def test_tools_and_parameters() -> None:
    body = {
        "input": "hi",
        "tools": [FUNCTION, {"type": "web_search"}, {"type": "local_shell"}],
        "tool_choice": {"type": "function", "name": "shell"},
        "parallel_tool_calls": False,
        "max_output_tokens": 100,
        "temperature": 0.2,
        "top_p": 0.9,
        "user": "u1",
        "metadata": {"k": "v"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}},
        "reasoning": {"effort": "high", "summary": "auto"},
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "session",
    }
    translated = chat(body)
    assert translated == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "shell",
                    "description": "Run a command",
                    "parameters": FUNCTION["parameters"],
                    "strict": False,
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "shell"}},
        "parallel_tool_calls": False,
        "max_tokens": 100,
        "temperature": 0.2,
        "top_p": 0.9,
        "user": "u1",
        "metadata": {"k": "v"},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
        },
        "reasoning_effort": "high",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert translated["tools"][0]["function"]["parameters"] is not FUNCTION["parameters"]  # copied, not shared


@pytest.mark.parametrize(
    ("choice", "expected"),
    [("auto", "auto"), ("none", "none"), ("required", "required"), ({"type": "allowed_tools"}, None),
     ({"type": "custom", "name": "apply_patch"}, {"type": "function", "function": {"name": "apply_patch"}})],
)  # fmt: skip
def test_tool_choice(choice: Any, expected: Any) -> None:
    assert chat({"input": "x", "tools": [FUNCTION], "tool_choice": choice}).get("tool_choice") == expected


def test_no_tools_means_no_tool_settings_and_json_object_format() -> None:
    translated = chat({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": "auto",
                       "parallel_tool_calls": True, "text": {"format": {"type": "json_object"}}})  # fmt: skip
    assert "tools" not in translated and "tool_choice" not in translated and "parallel_tool_calls" not in translated
    assert translated["response_format"] == {"type": "json_object"}
    assert "response_format" not in chat({"input": "x", "text": {"format": {"type": "text"}}})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [user("a"), {"type": "compaction", "id": "cmp_1", "encrypted_content": "x"}]}, "input[1]"),
        ({"input": [{"type": "compaction_trigger"}]}, "input[0]"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0]"),
        ({"input": ["text"]}, "input[0]"),
        ({"input": [user([{"type": "input_text", "text": "a"}, {"type": "mystery"}])]}, "input[0].content[1]"),
        ({"input": [{"type": "message", "role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [user(7)]}, "input[0].content"),
        ({"input": [output("c", 3)]}, "input[0].output"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "instructions": [user("a")]}, "instructions"),
    ],
)
def test_what_chat_cannot_carry_names_where(body: dict[str, Any], param: str) -> None:
    with pytest.raises(Untranslatable) as caught:
        chat(body)
    assert caught.value.param == param and caught.value.message


def test_the_request_is_not_mutated() -> None:
    body = {"model": "m", "input": [user("a"), call("c1"), output("c1")], "tools": [FUNCTION, CUSTOM],
            "metadata": {"a": "b"}}  # fmt: skip
    before = json.dumps(body, sort_keys=True)
    translated = responses_to_chat(body)
    translated["metadata"]["a"] = "changed"
    translated["tools"][0]["function"]["parameters"]["type"] = "changed"
    assert json.dumps(body, sort_keys=True) == before


# --- whole answers ---

REQUEST: dict[str, Any] = {
    "model": "codex-local",
    "instructions": "Be terse.",
    "input": "hi",
    "tools": [FUNCTION, CUSTOM],
    "store": False,
    "reasoning": {"effort": "medium"},
}
USAGE = {
    "prompt_tokens": 50,
    "completion_tokens": 7,
    "total_tokens": 57,
    "prompt_tokens_details": {"cached_tokens": 40},
    "completion_tokens_details": {"reasoning_tokens": 3},
}


def answer(message: dict[str, Any], finish_reason: str = "stop", usage: Any = USAGE) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "served",
            "choices": [choice], "usage": usage}  # fmt: skip


def test_a_text_answer() -> None:
    response = chat_to_response(answer({"content": "Hello."}), REQUEST, "resp_abc")
    parsed = Response.model_validate(response)
    assert parsed.id == "resp_abc" and parsed.status == "completed" and parsed.model == "codex-local"
    assert parsed.output_text == "Hello."
    item = response["output"][0]
    assert item["id"].startswith("msg_") and item["status"] == "completed" and item["role"] == "assistant"
    assert item["content"] == [{"type": "output_text", "text": "Hello.", "annotations": []}]
    assert response["usage"] == {
        "input_tokens": 50,
        "input_tokens_details": {"cached_tokens": 40, "cache_write_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 3},
        "total_tokens": 57,
    }
    assert response["created_at"] == 1700000000 and response["error"] is None
    assert response["instructions"] == "Be terse." and response["store"] is False
    assert response["tools"] == [FUNCTION, CUSTOM] and response["tool_choice"] == "auto"
    assert response["parallel_tool_calls"] is True and response["metadata"] == {}
    assert response["text"] == {"format": {"type": "text"}} and response["reasoning"] == {"effort": "medium"}
    assert response["incomplete_details"] is None and response["previous_response_id"] is None


def test_tool_calls_and_a_custom_tool_call() -> None:
    patch = "*** Begin Patch\n*** End Patch"
    calls = [
        chat_call("call_1"),
        chat_call("call_2", "apply_patch", json.dumps({"input": patch})),
        chat_call("call_3", "apply_patch", "raw text, not JSON"),
    ]
    response = chat_to_response(answer({"content": "On it.", "tool_calls": calls}, "tool_calls"), REQUEST, "r")
    Response.model_validate(response)
    message, function, custom, raw = response["output"]
    assert message["content"][0]["text"] == "On it."
    assert function["id"].startswith("fc_")
    assert {k: v for k, v in function.items() if k != "id"} == {
        "type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"command":["ls"]}',
        "status": "completed",
    }  # fmt: skip
    assert custom["type"] == "custom_tool_call" and custom["input"] == patch and custom["call_id"] == "call_2"
    assert raw["input"] == "raw text, not JSON"


@pytest.mark.parametrize(("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")])
def test_an_answer_cut_short_is_incomplete(finish: str, reason: str) -> None:
    response = chat_to_response(answer({"content": "Hel"}, finish), REQUEST, "r")
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": reason}
    assert Response.model_validate(response).incomplete_details is not None


def test_a_refusal_and_an_empty_answer_without_usage() -> None:
    refused = chat_to_response(answer({"content": None, "refusal": "No."}), REQUEST, "r")
    assert refused["output"][0]["content"] == [{"type": "refusal", "refusal": "No."}]
    empty = chat_to_response(answer({"content": None}, usage=None), {"model": "m", "input": "x"}, "r")
    assert empty["output"] == [] and empty["usage"]["total_tokens"] == 0
    for response in (refused, empty):
        Response.model_validate(response)


# --- streams ---


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "x", "choices": [choice]}


def call_delta(index: int, arguments: str, call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id:
        entry["id"], entry["type"], entry["function"]["name"] = call_id, "function", name
    return {"tool_calls": [entry]}


ARGS = '{"command":["ls","-la"]}'


def text_then_calls() -> list[dict[str, Any]]:
    chunks = [chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "hmm"})]
    chunks += [chunk({"content": piece}) for piece in ("I'll ", "look", ".")]
    chunks.append(chunk(call_delta(0, "", "call_a", "shell")))
    chunks += [chunk(call_delta(0, ARGS[i : i + 5])) for i in range(0, len(ARGS), 5)]
    chunks.append(chunk(call_delta(1, '{"input":"*** Begin', "call_b", "apply_patch")))
    chunks.append(chunk(call_delta(1, ' Patch"}')))
    chunks.append(chunk({}, "tool_calls"))
    chunks.append({"id": "chatcmpl-s", "object": "chat.completion.chunk", "choices": [], "usage": USAGE})
    return chunks


def run(chunks: list[dict[str, Any]], request: dict[str, Any] = REQUEST) -> list[dict[str, Any]]:
    translator = ResponsesEvents(request, "resp_s")
    events = translator.start() + [event for c in chunks for event in translator.feed(c)]
    return events + translator.finish()


def test_a_stream_of_text_then_a_call_and_a_custom_call() -> None:
    events = run(text_then_calls())
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * 5,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in done] == [0, 1, 2]
    assert done[0]["item"]["content"][0]["text"] == "I'll look."
    assert done[1]["item"]["arguments"] == ARGS and done[1]["item"]["call_id"] == "call_a"
    assert done[1]["item"]["status"] == "completed"
    assert done[2]["item"]["type"] == "custom_tool_call" and done[2]["item"]["input"] == "*** Begin Patch"
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"] == [e["item"] for e in done]
    assert final["usage"]["input_tokens"] == 50 and final["usage"]["output_tokens_details"]["reasoning_tokens"] == 3
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["item"]["id"] for e in added] == [e["item"]["id"] for e in done]  # each item keeps its id


def test_the_sdk_parses_and_accumulates_every_event() -> None:
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    events = run(text_then_calls())
    for event in events:
        parsed = EVENTS.validate_python(event)
        state.handle_event(parsed)
    response = state._completed_response
    assert response is not None and response.output_text == "I'll look."
    assert [item.type for item in response.output] == ["message", "function_call", "custom_tool_call"]


def test_text_after_a_call_opens_a_new_message_and_a_cut_answer_is_incomplete() -> None:
    chunks = [chunk(call_delta(0, "{}", "call_a", "shell")), chunk({"content": "then"}), chunk({}, "length")]
    events = run(chunks)
    done = [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"]
    assert done == ["function_call", "message"]
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    for event in events:
        EVENTS.validate_python(event)


def test_calls_numbered_zero_each_are_still_separate() -> None:
    chunks = [chunk(call_delta(0, "{}", "call_a", "shell")), chunk(call_delta(0, "{}", "call_b", "shell")),
              chunk({}, "tool_calls")]  # fmt: skip
    items = [e["item"] for e in run(chunks) if e["type"] == "response.output_item.done"]
    assert [item["call_id"] for item in items] == ["call_a", "call_b"]


def test_an_empty_stream_still_completes() -> None:
    events = run([chunk({}, "stop")])
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.completed"]
    assert events[-1]["response"]["output"] == []


class FakeChatStream:
    """What ``Upstream.open_stream`` returns, in miniature: chunks, then maybe an error; closed once."""

    def __init__(self, chunks: list[dict[str, Any]], error: Exception | None = None) -> None:
        self.chunks, self.error = chunks, error
        self.closed = 0
        self.hooks: list[Any] = []

    def on_close(self, hook: Any) -> None:
        self.hooks.append(hook)

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        for c in self.chunks:
            yield c
        if self.error is not None:
            raise self.error

    async def aclose(self) -> None:
        self.closed += 1
        for hook in self.hooks:
            hook()


def test_the_stream_yields_sse_events_and_closes_the_chat_stream() -> None:
    fake = FakeChatStream(text_then_calls())
    stream = ChatToResponsesStream(fake, REQUEST, "resp_s")
    closed: list[int] = []
    stream.on_close(lambda: closed.append(1))

    async def go() -> list[Any]:
        first = await stream.next_event()
        rest = [event async for event in stream]
        await stream.aclose()
        return [first, *rest]

    events = asyncio.run(go())
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    for event in events:
        name, data = event.raw.decode().split("\n")[:2]
        assert name == f"event: {event.type}" and json.loads(data.removeprefix("data: ")) == event.data
        assert event.raw.endswith(b"\n\n")
    assert [e.data["sequence_number"] for e in events] == list(range(len(events)))
    assert fake.closed == 1 and closed == [1]


def test_an_upstream_error_mid_stream_propagates() -> None:
    error = UpstreamError("The upstream provider closed the stream.", status=502, code="upstream_stream_truncated")
    fake = FakeChatStream([chunk({"content": "Hel"})], error)
    stream = ChatToResponsesStream(fake, REQUEST, "resp_s")

    async def go() -> list[str]:
        seen: list[str] = []
        try:
            async for event in stream:
                seen.append(event.type)
        finally:
            await stream.aclose()
        return seen

    with pytest.raises(UpstreamError) as caught:
        asyncio.run(go())
    assert caught.value.code == "upstream_stream_truncated" and fake.closed == 1
