"""proxy.upstream.translate: Anthropic's Messages API <-> OpenAI's Chat Completions, written from the spec of the
translation (what Claude Code sends, what an OpenAI-compatible upstream answers), not from the module's output."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from proxy.upstream.translate import (
    ChatToMessagesStream,
    anthropic_error,
    chat_to_messages,
    messages_to_chat,
    sse_bytes,
    usage_to_anthropic,
)

ZERO_CREATION = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}
READ_SCHEMA = {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}
REMINDER = "<system-reminder>\nThe todo list is empty.\n</system-reminder>"


def claude_code_request() -> dict[str, Any]:
    """What Claude Code sends: system blocks with cache_control, thinking, parallel tool calls, their results
    followed by a system reminder, server tools next to client tools, metadata with a user id."""
    return {
        "model": "qwen3-coder",
        "max_tokens": 32000,
        "stream": True,
        "temperature": 1,
        "top_k": 40,
        "metadata": {"user_id": "user_abc_account_123_session_456"},
        "thinking": {"type": "enabled", "budget_tokens": 4000},
        "context_management": {"edits": []},
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Working directory: /repo", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        ],
        "tools": [
            {
                "name": "Read",
                "description": "Read a file",
                "input_schema": READ_SCHEMA,
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
            {"type": "custom", "name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}},
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Read a.py and b.py", "cache_control": {"type": "ephemeral"}}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Two files.", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Reading both."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a.py"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {"file_path": "b.py"}},
                    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
                    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "print('a')"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "print('b')"}, {"type": "text", "text": "# end"}],
                        "cache_control": {"type": "ephemeral"},
                    },
                    {"type": "text", "text": REMINDER},
                ],
            },
        ],
    }


def test_a_claude_code_request_becomes_chat_messages_in_openai_order() -> None:
    chat = messages_to_chat(claude_code_request())
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code.\n\nWorking directory: /repo"},
        {"role": "user", "content": "Read a.py and b.py"},
        {
            "role": "assistant",
            "content": "Reading both.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path":"a.py"}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path":"b.py"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "print('a')"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "print('b')\n# end"},
        {"role": "user", "content": REMINDER},
    ]


def test_a_claude_code_request_keeps_only_what_chat_knows() -> None:
    chat = messages_to_chat(claude_code_request())
    assert chat["model"] == "qwen3-coder"
    assert chat["max_tokens"] == 32000 and chat["temperature"] == 1
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "Read", "description": "Read a file", "parameters": READ_SCHEMA}},
        {
            "type": "function",
            "function": {"name": "Bash", "description": "Run a command", "parameters": {"type": "object"}},
        },
    ]
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is False
    for dropped in ("top_k", "metadata", "thinking", "context_management", "system", "stop_sequences", "tool_use"):
        assert dropped not in chat
    wire = orjson.dumps(chat).decode()
    for absent in ("cache_control", "user_abc", "signature", "Two files", "opaque", "srvtoolu", "web_search"):
        assert absent not in wire


def test_the_input_body_is_never_mutated() -> None:
    body = claude_code_request()
    body["messages"].append(
        {
            "role": "user",
            "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}}],
        }
    )
    before = copy.deepcopy(body)
    chat = messages_to_chat(body)
    assert body == before
    chat["tools"][0]["function"]["parameters"]["properties"]["x"] = {}  # not shared with the input
    chat["messages"][-1]["content"][0]["image_url"]["url"] = "changed"
    assert body == before


@pytest.mark.parametrize(
    ("block", "part"),
    [
        (
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}},
        ),
        (
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
        ),
        (
            {
                "type": "document",
                "title": "notes.md",
                "source": {"type": "text", "media_type": "text/plain", "data": "# Notes"},
            },
            {"type": "text", "text": "notes.md:\n# Notes"},
        ),
        (
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain"}},
            {"type": "text", "text": "document:\nplain"},
        ),
        (
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
            {"type": "file", "file": {"filename": "document.pdf", "file_data": "data:application/pdf;base64,JVBE"}},
        ),
        (
            {
                "type": "document",
                "title": "spec.pdf",
                "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "file", "file": {"filename": "spec.pdf", "file_data": "data:application/pdf;base64,JVBE"}},
        ),
    ],
)
def test_user_blocks_become_chat_parts(block: dict[str, Any], part: dict[str, Any]) -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "See:"}, block]}],
    }
    assert messages_to_chat(body)["messages"] == [{"role": "user", "content": [{"type": "text", "text": "See:"}, part]}]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("plain", "plain"),
        ([{"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}}], "one"),
        (
            [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
            [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        ),
    ],
)
def test_user_text_is_a_string_when_it_is_one_piece(content: Any, expected: Any) -> None:
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": content}]}
    assert messages_to_chat(body)["messages"] == [{"role": "user", "content": expected}]


@pytest.mark.parametrize(
    ("result", "text"),
    [
        ({"content": "boom", "is_error": True}, "Error: boom"),
        ({"content": "Error: already", "is_error": True}, "Error: already"),
        (
            {
                "content": [
                    {"type": "text", "text": "shot:"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}},
                ]
            },
            "shot:\n[image]",
        ),
        ({"content": [{"type": "text", "text": "x"}], "is_error": True}, "Error: x"),
        ({}, ""),
    ],
)
def test_tool_results_become_tool_messages(result: dict[str, Any], text: str) -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", **result}]}],
    }
    assert messages_to_chat(body)["messages"] == [
        {"role": "tool", "tool_call_id": "t1", "content": text}
    ]  # no empty user message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("Hi", {"role": "assistant", "content": "Hi"}),
        (
            [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}],
            {"role": "assistant", "content": "Hi there"},
        ),
        ([{"type": "thinking", "thinking": "t", "signature": "s"}], {"role": "assistant", "content": ""}),
        (
            [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "tool_use", "id": "c", "name": "Bash", "input": {}},
            ],
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}],
            },
        ),
        ([{"type": "future_block", "x": 1}, {"type": "text", "text": "ok"}], {"role": "assistant", "content": "ok"}),
    ],
)
def test_assistant_messages(content: Any, expected: dict[str, Any]) -> None:
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "assistant", "content": content}]}
    assert messages_to_chat(body)["messages"] == [expected]


def test_system_messages_in_place_and_system_as_a_string() -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "a"},
            {
                "role": "system",
                "content": [{"type": "text", "text": "Mode changed."}, {"type": "text", "text": "Plan."}],
            },
            {"role": "user", "content": "b"},
        ],
    }
    assert messages_to_chat(body)["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a"},
        {"role": "system", "content": "Mode changed.\n\nPlan."},
        {"role": "user", "content": "b"},
    ]


TOOL = {"name": "Read", "input_schema": {"type": "object"}}


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        ({"type": "tool", "name": "Read"}, {"tool_choice": {"type": "function", "function": {"name": "Read"}}}),
        ({"type": "any", "disable_parallel_tool_use": True}, {"tool_choice": "required", "parallel_tool_calls": False}),
        (
            {"type": "tool", "name": "Read", "disable_parallel_tool_use": False},
            {"tool_choice": {"type": "function", "function": {"name": "Read"}}},
        ),
        (None, {}),
    ],
)
def test_tool_choice(tool_choice: Any, expected: dict[str, Any]) -> None:
    body: dict[str, Any] = {"model": "m", "max_tokens": 10, "messages": [], "tools": [TOOL]}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    chat = messages_to_chat(body)
    assert {k: chat[k] for k in ("tool_choice", "parallel_tool_calls") if k in chat} == expected
    assert chat["tools"] == [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}]


def test_without_client_tools_there_is_no_tools_nor_tool_choice() -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}, {"type": "bash_20250124", "name": "bash"}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }
    chat = messages_to_chat(body)
    assert "tools" not in chat and "tool_choice" not in chat and "parallel_tool_calls" not in chat


def test_sampling_parameters() -> None:
    body = {
        "model": "anthropic/claude-x",
        "max_tokens": 5,
        "stop_sequences": ["END"],
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 3,
        "stream": False,
        "service_tier": "auto",
        "messages": [],
    }
    assert messages_to_chat(body) == {
        "model": "anthropic/claude-x",
        "messages": [],
        "max_tokens": 5,
        "stop": ["END"],
        "temperature": 0.2,
        "top_p": 0.9,
    }


# --- Answers ---


def test_a_whole_answer_with_text_and_two_tool_calls() -> None:
    result = {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",  # some servers say stop even with tool calls
                "message": {
                    "role": "assistant",
                    "reasoning_content": "hidden thoughts",
                    "content": "Reading both.",
                    "tool_calls": [
                        {
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "Read", "arguments": '{"file_path": "a.py"}'},
                        },
                        {"id": "call_b", "type": "function", "function": {"name": "Bash", "arguments": ""}},
                    ],
                },
            }
        ],
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 100},
        },
    }
    assert chat_to_messages(result, "claude-sonnet") == {
        "id": "msg_chatcmpl-9",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet",
        "content": [
            {"type": "text", "text": "Reading both."},
            {"type": "tool_use", "id": "call_a", "name": "Read", "input": {"file_path": "a.py"}},
            {"type": "tool_use", "id": "call_b", "name": "Bash", "input": {}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 20,
            "output_tokens": 30,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 100,
            "cache_creation": ZERO_CREATION,
        },
    }


@pytest.mark.parametrize(
    ("message", "finish_reason", "content", "stop_reason"),
    [
        ({"content": "Hi"}, "stop", [{"type": "text", "text": "Hi"}], "end_turn"),
        ({"content": "Hi"}, "length", [{"type": "text", "text": "Hi"}], "max_tokens"),
        ({"content": ""}, "content_filter", [{"type": "text", "text": ""}], "refusal"),
        ({"content": None, "reasoning_content": "r"}, None, [{"type": "text", "text": ""}], "end_turn"),
        ({"content": "Hi"}, "something_new", [{"type": "text", "text": "Hi"}], "end_turn"),
        (
            {"content": None, "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{bad"}}]},
            "tool_calls",
            [{"type": "tool_use", "id": "c", "name": "f", "input": {"_raw_arguments": "{bad"}}],
            "tool_use",
        ),
        (
            {"content": "", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
            "function_call",
            [{"type": "tool_use", "id": "c", "name": "f", "input": {}}],
            "tool_use",
        ),
    ],
)
def test_answer_content_and_stop_reason(
    message: dict[str, Any], finish_reason: Any, content: list[Any], stop_reason: str
) -> None:
    answer = chat_to_messages({"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}, "m")
    assert answer["content"] == content and answer["stop_reason"] == stop_reason
    assert answer["id"].startswith("msg_") and len(answer["id"]) > 8
    assert answer["usage"]["cache_creation"] == ZERO_CREATION


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (None, (0, 0, 0)),
        ({"prompt_tokens": 10, "completion_tokens": 3}, (10, 3, 0)),
        ({"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}, (2, 3, 8)),
        ({"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": None}, (10, 3, 0)),
    ],
)
def test_usage_to_anthropic(usage: Any, expected: tuple[int, int, int]) -> None:
    inputs, outputs, read = expected
    assert usage_to_anthropic(usage) == {
        "input_tokens": inputs,
        "output_tokens": outputs,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": read,
        "cache_creation": ZERO_CREATION,
    }


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "api_error"),
        (529, "overloaded_error"),
    ],
)
def test_anthropic_error(status: int, kind: str) -> None:
    assert anthropic_error(status, "no") == {"type": "error", "error": {"type": kind, "message": "no"}}


# --- Streams ---


def chunk(delta: dict[str, Any] | None = None, finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}],
        **extra,
    }


def call(index: int, arguments: str, call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
    piece: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id:
        piece.update(id=call_id, type="function")
        piece["function"]["name"] = name
    return {"tool_calls": [piece]}


ARGS_A = '{"file_path": "src/a.py"}'
ARGS_B = '{"command": "ls -la", "timeout": 5}'
USAGE = {"prompt_tokens": 50, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 40}}


def split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def text_then_two_calls() -> list[dict[str, Any]]:
    chunks = [chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "think"})]
    chunks += [chunk({"content": piece}) for piece in ("I'll ", "look", ".")]
    chunks.append(chunk(call(0, "", "call_a", "Read")))
    chunks += [chunk(call(0, piece)) for piece in split(ARGS_A, 4)]
    chunks.append(chunk(call(1, ARGS_B[:3], "call_b", "Bash")))
    chunks += [chunk(call(1, piece)) for piece in split(ARGS_B[3:], 5)]
    chunks.append(chunk({}, "tool_calls"))
    chunks.append({"id": "chatcmpl-s", "object": "chat.completion.chunk", "choices": [], "usage": USAGE})
    return chunks


def run(stream: ChatToMessagesStream, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    events = [event for c in chunks for event in stream.feed(c)]
    return events + stream.finish()


def shape(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each event's type, index and block or delta type, runs of the same delta collapsed."""
    out: list[tuple[Any, ...]] = []
    for event in events:
        detail = event.get("content_block", event.get("delta", {})).get("type") if "index" in event else None
        item = (event["type"], event.get("index"), detail)
        if not (out and out[-1] == item and event["type"] == "content_block_delta"):
            out.append(item)
    return out


def test_a_stream_of_text_then_two_tool_calls() -> None:
    events = run(ChatToMessagesStream("claude-sonnet", input_tokens=3), text_then_two_calls())
    assert shape(events) == [
        ("message_start", None, None),
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "tool_use"),
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    start = events[0]["message"]
    assert start["id"].startswith("msg_") and start["model"] == "claude-sonnet" and start["content"] == []
    assert start["usage"] == {
        "input_tokens": 3,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": ZERO_CREATION,
    }
    text = "".join(e["delta"]["text"] for e in events if e.get("delta", {}).get("type") == "text_delta")
    assert text == "I'll look."
    blocks = {e["index"]: e["content_block"] for e in events if e["type"] == "content_block_start"}
    assert blocks[1] == {"type": "tool_use", "id": "call_a", "name": "Read", "input": {}}
    assert blocks[2] == {"type": "tool_use", "id": "call_b", "name": "Bash", "input": {}}
    for index, arguments in ((1, ARGS_A), (2, ARGS_B)):
        pieces = [
            e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta" and e["index"] == index
        ]
        assert all(pieces) and len(pieces) > 1
        assert orjson.loads("".join(pieces)) == orjson.loads(arguments)
    starts = [e["index"] for e in events if e["type"] == "content_block_start"]
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert starts == stops == [0, 1, 2]
    assert events[-2] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {
            "output_tokens": 7,
            "input_tokens": 10,
            "cache_read_input_tokens": 40,
            "cache_creation_input_tokens": 0,
        },
    }
    assert events[-1] == {"type": "message_stop"}


def test_a_whole_tool_call_in_one_delta_and_a_wrong_finish_reason() -> None:
    chunks = [
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c1", "type": "function", "function": {"name": "Read", "arguments": ARGS_A}},
                    {"index": 1, "id": "c2", "type": "function", "function": {"name": "Bash", "arguments": ""}},
                ]
            },
            "stop",
        )
    ]
    events = run(ChatToMessagesStream("m", message_id="msg_fixed"), chunks)
    assert events[0]["message"]["id"] == "msg_fixed"
    assert [(e["type"], e.get("index")) for e in events[1:]] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),  # no arguments: no delta at all
        ("content_block_stop", 1),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[2]["delta"] == {"type": "input_json_delta", "partial_json": ARGS_A}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"] == {
        "output_tokens": 0,
        "input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }


def test_calls_numbered_zero_by_their_provider_and_text_after_a_call() -> None:
    """Some providers give every call index 0 (a new id tells them apart) or omit the index; text may follow a call."""
    chunks = [
        chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "Read", "arguments": '{"file_path"'}}]}),
        chunk(
            {"tool_calls": [{"index": 0, "id": "c1", "function": {"arguments": ': "a"}'}}]}
        ),  # the id repeated: same call
        chunk({"tool_calls": [{"index": 0, "id": "c2", "function": {"name": "Bash", "arguments": "{}"}}]}),
        chunk({"content": "Done."}),
        chunk({"tool_calls": [{"id": "c3", "function": {"name": "Grep", "arguments": '{"q": 1}'}}]}),
        chunk({"tool_calls": [{"function": {"arguments": ""}}]}, "tool_calls"),
    ]
    events = run(ChatToMessagesStream("m"), chunks)
    starts = [(e["index"], e["content_block"].get("id")) for e in events if e["type"] == "content_block_start"]
    assert starts == [(0, "c1"), (1, "c2"), (2, None), (3, "c3")]
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1, 2, 3]
    pieces: dict[int, str] = {}
    for e in events:
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            pieces[e["index"]] = pieces.get(e["index"], "") + e["delta"]["partial_json"]
    assert pieces == {0: '{"file_path": "a"}', 1: "{}", 3: '{"q": 1}'}


def test_more_of_a_call_whose_block_is_closed_is_dropped() -> None:
    chunks = [chunk(call(0, '{"a": 1}', "c1", "f")), chunk({"content": "text"}), chunk(call(0, "garbage"))]
    events = run(ChatToMessagesStream("m"), chunks)
    assert [(e["type"], e.get("index")) for e in events[1:-2]] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
    ]


@pytest.mark.parametrize(
    ("finish_reason", "stop_reason"),
    [("stop", "end_turn"), ("length", "max_tokens"), ("content_filter", "refusal"), (None, "end_turn")],
)
def test_a_text_stream_stop_reason(finish_reason: str | None, stop_reason: str) -> None:
    events = run(ChatToMessagesStream("m"), [chunk({"content": "Hi"}), chunk({}, finish_reason)])
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[-2]["delta"]["stop_reason"] == stop_reason


def test_a_stream_with_only_usage() -> None:
    stream = ChatToMessagesStream("m", input_tokens=99)
    events = run(stream, [{"id": "x", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 0}}])
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]
    assert events[0]["message"]["usage"]["input_tokens"] == 99
    assert events[1]["usage"] == {
        "output_tokens": 0,
        "input_tokens": 12,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    assert events[1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


def test_finish_without_any_chunk_and_its_idempotence() -> None:
    stream = ChatToMessagesStream("m", input_tokens=5)
    events = stream.finish()
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]
    assert events[1]["usage"]["input_tokens"] == 5  # no usage came: the constructor's count
    assert stream.finish() == []
    assert stream.feed(chunk({"content": "late"})) == []


def test_finish_is_idempotent_after_a_stream() -> None:
    stream = ChatToMessagesStream("m")
    events = run(stream, text_then_two_calls())
    assert events[-1] == {"type": "message_stop"}
    assert stream.finish() == [] and stream.feed(chunk({"content": "x"})) == []


def test_sse_bytes() -> None:
    assert sse_bytes({"type": "message_stop"}) == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    frame = sse_bytes({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "é"}})
    assert frame.startswith(b"event: content_block_delta\ndata: {") and frame.endswith(b"}\n\n")
    assert orjson.loads(frame.split(b"data: ", 1)[1]) == {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "é"},
    }


def test_the_anthropic_sdk_accumulates_the_stream() -> None:
    # The pinned SDK of the test extra (pyproject.toml): its own accumulator of stream events.
    from anthropic.lib.streaming._messages import accumulate_event as accumulate

    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in run(ChatToMessagesStream("claude-sonnet", input_tokens=3), text_then_two_calls()):
        snapshot = accumulate(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    assert [block.type for block in snapshot.content] == ["text", "tool_use", "tool_use"]
    assert snapshot.content[0].text == "I'll look."
    assert snapshot.content[1].input == orjson.loads(ARGS_A) and snapshot.content[1].name == "Read"
    assert snapshot.content[2].input == orjson.loads(ARGS_B) and snapshot.content[2].id == "call_b"
    assert snapshot.stop_reason == "tool_use"
    assert (snapshot.usage.input_tokens, snapshot.usage.output_tokens, snapshot.usage.cache_read_input_tokens) == (
        10,
        7,
        40,
    )
