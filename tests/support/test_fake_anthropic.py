"""The fake Anthropic upstream behaves like the real API for the official SDK, and is as strict as it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.fake_anthropic import BETA_FOR_FIELD, COMPACTION_ANSWER, AReply, FakeAnthropic, all_text
from tests.support.servers import serve_in_thread

MODEL = "claude-sonnet-4-5"
BINDING = BETA_FOR_FIELD["thinking.block_binding"]
TOOL: dict[str, Any] = {
    "name": "read_file",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeAnthropic, str]]:
    fake = FakeAnthropic()
    with serve_in_thread(fake.app) as url:
        yield fake, url


@pytest.fixture
def fake(served: tuple[FakeAnthropic, str]) -> FakeAnthropic:
    served[0].reset()
    served[0].window = None
    return served[0]


@pytest.fixture
def url(served: tuple[FakeAnthropic, str]) -> str:
    return served[1]


@pytest.fixture
def client(url: str) -> Any:  # Any: the SDK's typed parameters are not what these tests check
    return anthropic.Anthropic(api_key="sk-test", base_url=url, max_retries=0)


def create(client: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    return client.messages.create(model=MODEL, max_tokens=1024, messages=messages, **kwargs)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def bad_request(client: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    with pytest.raises(anthropic.BadRequestError) as caught:
        create(client, messages, **kwargs)
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    return str(body["error"]["message"])


def test_non_stream_text_echoes_and_records(fake: FakeAnthropic, client: Any) -> None:
    message = create(client, [user("hello there")], extra_query={"beta": "true"})
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "echo: hello there"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert message.usage.cache_creation is not None
    recorded = fake.last
    assert recorded.path == "/v1/messages?beta=true"
    assert recorded.body["messages"] == [user("hello there")]
    # this SDK (2.x) sends the key as a bearer token
    assert "sk-test" in (recorded.headers.get("x-api-key", "") + recorded.headers.get("authorization", ""))
    assert "anthropic-version" in recorded.headers


def test_stream_accumulates_to_the_non_stream_content(fake: FakeAnthropic, client: Any) -> None:
    reply = AReply(
        text="Let me look at it.",
        thinking="I should read the file",
        tool_uses=[{"id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}}],
    )
    fake.enqueue(reply, reply)
    plain = create(client, [user("read a.py")], tools=[TOOL])
    with client.messages.stream(model=MODEL, max_tokens=1024, messages=[user("read a.py")], tools=[TOOL]) as stream:
        streamed = stream.get_final_message()
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in plain.content]
    assert [b.type for b in plain.content] == ["thinking", "text", "tool_use"]
    assert streamed.stop_reason == plain.stop_reason == "tool_use"
    assert streamed.usage.output_tokens == plain.usage.output_tokens


def test_stream_event_sequence_and_framing(url: str) -> None:
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    body = {"model": MODEL, "max_tokens": 10, "stream": True, "messages": [user("hi")]}
    raw = httpx.post(f"{url}/v1/messages", json=body, headers=headers).text
    frames = raw.split("\n\n")
    assert frames[-1] == ""
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames[:-1]]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(f.split("\n")[1].startswith("data: {") for f in frames[:-1])
    assert '"stop_sequence": null' in frames[-3] and '"output_tokens"' in frames[-3]


def test_text_stream(fake: FakeAnthropic, client: Any) -> None:
    with client.messages.stream(model=MODEL, max_tokens=100, messages=[user("say something")]) as stream:
        text = "".join(stream.text_stream)
    assert text == "echo: say something"
    assert fake.last.body["stream"] is True


def test_tool_use_round_trip(fake: FakeAnthropic, client: Any) -> None:
    fake.enqueue(AReply(tool_uses=[{"name": "read_file", "input": {"path": "a.py"}}]))
    first = create(client, [user("read a.py")], tools=[TOOL])
    use = first.content[0]
    assert use.type == "tool_use" and use.id.startswith("toolu_") and use.input == {"path": "a.py"}
    history = [
        user("read a.py"),
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "print(1)"}]},
    ]
    second = create(client, history, tools=[TOOL])
    assert second.content[0].text == "echo: print(1)"


def thinking_history(client: Any, fake: FakeAnthropic, system: str) -> list[dict[str, Any]]:
    fake.enqueue(AReply(text="4", thinking="two plus two"))
    with client.messages.stream(model=MODEL, max_tokens=1024, system=system, messages=[user("2+2?")]) as stream:
        first = stream.get_final_message()
    assert first.content[0].type == "thinking" and first.content[0].signature
    return [user("2+2?"), {"role": "assistant", "content": [b.model_dump() for b in first.content]}, user("and 3+3?")]


def test_thinking_replay_with_a_valid_signature_is_accepted(fake: FakeAnthropic, client: Any) -> None:
    history = thinking_history(client, fake, "billing line")
    # the breakpoint moved onto the replayed message: cache_control does not count in the binding
    history[1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    assert create(client, history, system="billing line").content[0].text == "echo: and 3+3?"


def test_thinking_replay_after_the_system_changed_is_refused(fake: FakeAnthropic, client: Any) -> None:
    history = thinking_history(client, fake, "billing line A")
    message = bad_request(client, history, system="billing line B")
    assert message == "messages.1.content.0: thinking block is bound to a different conversation prefix"
    system_blocks = [{"type": "text", "text": "billing line A"}, {"type": "text", "text": "more"}]
    assert "bound to a different conversation prefix" in bad_request(client, history, system=system_blocks)


def test_thinking_drop_block_needs_its_beta(fake: FakeAnthropic, client: Any) -> None:
    history = thinking_history(client, fake, "billing line A")
    drop = {"type": "enabled", "budget_tokens": 1024, "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
    message = bad_request(client, history, system="billing line B", extra_body={"thinking": drop})
    assert message == "thinking.block_binding: Extra inputs are not permitted"
    answer = create(
        client,
        history,
        system="billing line B",
        extra_body={"thinking": drop},
        extra_headers={"anthropic-beta": f"other-beta,{BINDING}"},
    )
    assert answer.content[0].text == "echo: and 3+3?"
    assert fake.dropped_thinking == 1


def test_thinking_signature_forged_or_text_altered_is_refused(fake: FakeAnthropic, client: Any) -> None:
    history = thinking_history(client, fake, "s")
    history[1]["content"][0]["thinking"] = "two plus two is five"
    assert bad_request(client, history, system="s") == "messages.1.content.0: Invalid `signature` in `thinking` block"
    history[1]["content"][0].update(thinking="two plus two", signature="RXFrZm9yZ2Vk")
    assert bad_request(client, history, system="s") == "messages.1.content.0: Invalid `signature` in `thinking` block"
    redacted = [
        user("q"),
        {
            "role": "assistant",
            "content": [{"type": "redacted_thinking", "data": "anything"}, {"type": "text", "text": "a"}],
        },
        user("q2"),
    ]
    assert create(client, redacted).content[0].text == "echo: q2"


@pytest.mark.parametrize(
    ("key", "kwargs", "where"),
    [
        (
            "context_management",
            {"extra_body": {"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}},
            "context_management",
        ),
        ("output_config", {"extra_body": {"output_config": {"effort": "low"}}}, "output_config"),
        ("tools[].strict", {"tools": [{**TOOL, "strict": True}]}, "tools.0.custom.strict"),
        (
            "tools[].defer_loading",
            {"tools": [TOOL, {**TOOL, "name": "b", "defer_loading": True}]},
            "tools.1.custom.defer_loading",
        ),
    ],
)
def test_a_field_without_its_beta_is_refused(client: Any, key: str, kwargs: dict[str, Any], where: str) -> None:
    assert bad_request(client, [user("hi")], **kwargs) == f"{where}: Extra inputs are not permitted"
    beta = {"anthropic-beta": f"interleaved-thinking-2025-05-14, {BETA_FOR_FIELD[key]}"}
    assert create(client, [user("hi")], extra_headers=beta, **kwargs).content[0].text == "echo: hi"
    # a beta without its field is fine
    assert create(client, [user("hi")], extra_headers=beta).content[0].text == "echo: hi"


def test_more_than_four_cache_controls_are_refused(client: Any) -> None:
    mark = {"type": "ephemeral"}
    system = [
        {"type": "text", "text": "a", "cache_control": mark},
        {"type": "text", "text": "b", "cache_control": mark},
    ]
    content = [
        {"type": "text", "text": "x", "cache_control": mark},
        {"type": "text", "text": "y", "cache_control": mark},
    ]
    tools = [{**TOOL, "cache_control": mark}]
    message = bad_request(client, [{"role": "user", "content": content}], system=system, tools=tools)
    assert message == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    assert create(client, [{"role": "user", "content": content}], system=system).content


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "assistant", "content": "hi"}, user("x")], 'messages: first message must use the "user" role'),
        (
            [user("a"), user("b")],
            'messages: roles must alternate between "user" and "assistant", but found multiple "user" roles in a row',
        ),
        (
            [
                user("a"),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {}}],
                },
                user("b"),
            ],
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_9.",
        ),
        (
            [
                user("a"),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "first"},
                        {"type": "tool_result", "tool_use_id": "toolu_9", "content": "r"},
                    ],
                },
            ],
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_9.",
        ),
        (
            [
                user("a"),
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_7", "content": "r"}]},
            ],
            "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_7.",
        ),
        (
            [user("a"), {"role": "assistant", "content": []}, user("b")],
            "messages.1: all messages must have non-empty content",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": ""}]}],
            "messages: text content blocks must be non-empty",
        ),
    ],
)
def test_conversation_shape_is_enforced(client: Any, messages: list[dict[str, Any]], expected: str) -> None:
    assert bad_request(client, messages).startswith(expected)


def test_headers_and_max_tokens_are_required(fake: FakeAnthropic, url: str) -> None:
    body = {"model": MODEL, "max_tokens": 10, "messages": [user("hi")]}
    no_key = httpx.post(f"{url}/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"
    bearer = httpx.post(
        f"{url}/v1/messages", json=body, headers={"authorization": "Bearer t", "anthropic-version": "2023-06-01"}
    )
    assert bearer.status_code == 200
    no_version = httpx.post(f"{url}/v1/messages", json=body, headers={"x-api-key": "k"})
    assert no_version.status_code == 400 and "anthropic-version" in no_version.json()["error"]["message"]
    del body["max_tokens"]
    missing = httpx.post(f"{url}/v1/messages", json=body, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert missing.status_code == 400
    assert missing.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    assert len(fake.requests) == 4


def test_window_and_scripted_errors(fake: FakeAnthropic, client: Any) -> None:
    fake.window = 50
    message = bad_request(client, [user("word " * 100)])
    assert message.startswith("prompt is too long: ") and message.endswith(" tokens > 50 maximum")
    fake.window = None
    fake.enqueue(AReply(status=529, error_message="Overloaded"))
    with pytest.raises(anthropic.InternalServerError) as caught:
        create(client, [user("hi")])
    assert isinstance(caught.value, anthropic.OverloadedError) and caught.value.status_code == 529
    assert caught.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    fake.enqueue(AReply(status=400, error_message="prompt is too long: 210000 tokens > 200000 maximum"))
    assert bad_request(client, [user("hi")]) == "prompt is too long: 210000 tokens > 200000 maximum"


def test_count_tokens_and_prompt_caching(fake: FakeAnthropic, client: Any) -> None:
    mark = {"type": "ephemeral"}
    system = [{"type": "text", "text": "You are a coding agent. " * 40, "cache_control": mark}]
    turn1 = [{"role": "user", "content": [{"type": "text", "text": "first question " * 20, "cache_control": mark}]}]
    counted = client.messages.count_tokens(model=MODEL, system=system, messages=turn1, tools=[TOOL])
    assert fake.last.path == "/v1/messages/count_tokens"
    first = create(client, turn1, system=system, tools=[TOOL]).usage
    assert first.cache_read_input_tokens == 0 and first.cache_creation_input_tokens == counted.input_tokens
    assert first.input_tokens + first.cache_creation_input_tokens == counted.input_tokens
    assert (
        first.cache_creation is not None
        and first.cache_creation.ephemeral_5m_input_tokens == first.cache_creation_input_tokens
    )
    turn2: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "first question " * 20}]},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": [{"type": "text", "text": "second", "cache_control": mark}]},
    ]
    second = create(client, turn2, system=system, tools=[TOOL]).usage
    assert second.cache_read_input_tokens == counted.input_tokens  # the whole first request was repeated
    assert second.cache_creation_input_tokens > 0 and second.input_tokens == 0
    assert client.messages.count_tokens(model=MODEL, system=system, messages=turn2, tools=[TOOL]).input_tokens == (
        second.cache_read_input_tokens + second.cache_creation_input_tokens
    )
    changed = [{"type": "text", "text": "Another system", "cache_control": mark}]
    assert create(client, turn2, system=changed, tools=[TOOL]).usage.cache_read_input_tokens == 0


def test_default_answers_compaction_and_responder(fake: FakeAnthropic, client: Any) -> None:
    prompt = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nWrite <analysis> then <summary>."
    assert create(client, [user(prompt)]).content[0].text == COMPACTION_ANSWER
    fake.responder = lambda body: AReply(text=f"{len(body['messages'])} messages")
    assert create(client, [user("x")]).content[0].text == "1 messages"
    assert "secret fact" in all_text({"system": "sys", "messages": [user("a secret fact")]})


def test_an_error_in_the_middle_of_a_stream(fake: FakeAnthropic, client: Any) -> None:
    fake.enqueue(AReply(status=529, error_message="Overloaded", error_mid_stream=True))
    with pytest.raises(anthropic.APIStatusError) as caught:  # noqa: SIM117
        with client.messages.stream(model=MODEL, max_tokens=10, messages=[user("hi")]) as stream:
            stream.get_final_message()
    assert "Overloaded" in str(caught.value)
