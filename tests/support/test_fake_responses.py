"""The fake OpenAI Responses upstream behaves like the real API for the official SDK, and is as strict as it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.fake_responses import FakeResponses, RReply, sign_reasoning
from tests.support.servers import serve_in_thread

MODEL = "gpt-5-codex"
TOOL: dict[str, Any] = {
    "type": "function",
    "name": "shell",
    "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "strict": False,
}
ENCRYPTED = ["reasoning.encrypted_content"]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeResponses, str]]:
    fake = FakeResponses()
    with serve_in_thread(fake.app) as url:
        yield fake, url


@pytest.fixture
def fake(served: tuple[FakeResponses, str]) -> FakeResponses:
    served[0].reset()
    served[0].window = None
    return served[0]


@pytest.fixture
def url(served: tuple[FakeResponses, str]) -> str:
    return served[1]


@pytest.fixture
def client(url: str) -> Any:  # Any: the SDK's typed parameters are not what these tests check
    return openai.OpenAI(api_key="sk-test", base_url=f"{url}/v1", max_retries=0)


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def bad_request(client: Any, **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("model", MODEL)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**kwargs)
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error"
    assert set(body) == {"message", "type", "param", "code"}
    return body


def test_non_stream_text_echoes_and_records(fake: FakeResponses, client: Any) -> None:
    response = client.responses.create(model=MODEL, input=[user("hello there")], instructions="Be terse.")
    assert response.object == "response" and response.status == "completed" and response.model == MODEL
    assert response.output_text == "echo: hello there"
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.instructions == "Be terse." and response.error is None
    recorded = fake.last
    assert recorded.path == "/v1/responses" and recorded.body["input"] == [user("hello there")]
    assert recorded.headers["authorization"] == "Bearer sk-test"


def test_a_string_input_is_the_user_text(client: Any) -> None:
    assert client.responses.create(model=MODEL, input="plain").output_text == "echo: plain"


def test_stream_events_in_order_with_sequence_numbers(fake: FakeResponses, client: Any) -> None:
    fake.enqueue(RReply(text="two words", function_calls=[{"name": "shell", "arguments": {"command": "ls"}}]))
    events = list(client.responses.create(model=MODEL, input=[user("go")], tools=[TOOL], stream=True))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output_text == "two words" and final.usage is not None
    call = final.output[1]
    assert call.type == "function_call" and call.name == "shell" and call.arguments == '{"command": "ls"}'


def test_the_sdks_stream_helper_accumulates_the_answer(fake: FakeResponses, client: Any) -> None:
    fake.enqueue(RReply(text="streamed answer", reasoning="thinking it over"))
    with client.responses.stream(model=MODEL, input=[user("go")], include=ENCRYPTED) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "streamed answer" == final.output_text
    reasoning = final.output[0]
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "thinking it over"
    assert reasoning.encrypted_content == sign_reasoning(reasoning.id, [{"type": "summary_text",
                                                                         "text": "thinking it over"}])  # fmt: skip


def test_a_tool_round_trip_with_reasoning_replayed(fake: FakeResponses, client: Any) -> None:
    fake.enqueue(RReply(reasoning="use the shell", function_calls=[{"name": "shell", "arguments": {"command": "ls"}}]))
    first = client.responses.create(model=MODEL, input=[user("list")], tools=[TOOL], include=ENCRYPTED, store=False)
    reasoning, call = first.output
    history = [user("list"), reasoning.model_dump(exclude_none=True), call.model_dump(exclude_none=True)]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}
    second = client.responses.create(model=MODEL, input=[*history, output], tools=[TOOL])
    assert second.output_text == "echo: list"
    # the call replayed without its reasoning item is accepted too
    third = client.responses.create(model=MODEL, input=[user("list"), history[2], output], tools=[TOOL])
    assert third.status == "completed"


def test_reasoning_the_fake_did_not_issue_is_refused(fake: FakeResponses, client: Any) -> None:
    fake.enqueue(RReply(text="ok", reasoning="first thoughts"))
    reasoning = client.responses.create(model=MODEL, input=[user("a")], include=ENCRYPTED).output[0]
    item = reasoning.model_dump(exclude_none=True)
    changed = {**item, "summary": [{"type": "summary_text", "text": "other thoughts"}]}
    body = bad_request(client, input=[user("a"), changed, user("b")])
    assert body["code"] == "invalid_encrypted_content" and "could not be verified" in body["message"]
    moved = {**item, "id": "rs_other"}
    assert bad_request(client, input=[user("a"), moved])["code"] == "invalid_encrypted_content"
    bare = {k: v for k, v in item.items() if k != "encrypted_content"}
    assert bad_request(client, input=[user("a"), bare])["param"] == "input[1]"
    client.responses.create(model=MODEL, input=[user("a"), item, user("b")])  # the item as issued is fine


@pytest.mark.parametrize(
    "item",
    [
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAlcm-proxy-handle"},
        {"type": "compaction_trigger"},
    ],
)
def test_compaction_items_are_never_accepted(client: Any, item: dict[str, Any]) -> None:
    body = bad_request(client, input=[user("a"), item])
    assert body["code"] == "invalid_encrypted_content"
    assert body["message"].startswith("The encrypted content ") and "could not be verified" in body["message"]


def test_an_output_without_its_call_is_refused(client: Any) -> None:
    orphan = {"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}
    body = bad_request(client, input=[user("a"), orphan], tools=[TOOL])
    assert body["message"] == "No tool call found for function call output with call_id call_nowhere."
    late = {"type": "function_call", "call_id": "call_nowhere", "name": "shell", "arguments": "{}"}
    bad_request(client, input=[user("a"), orphan, late], tools=[TOOL])  # the call must come first


def test_previous_response_id_is_refused(client: Any) -> None:
    first = client.responses.create(model=MODEL, input="a")
    body = bad_request(client, input="b", previous_response_id=first.id)
    assert body["param"] == "previous_response_id" and body["code"] == "previous_response_not_found"


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "message", "role": "tool", "content": "x"}, "input[0].role"),
        ({"type": "web_search_call", "id": "ws_1"}, "input[0].type"),
        ({"type": "item_reference", "id": "msg_1"}, "input[0]"),
    ],
)
def test_unknown_roles_and_items_are_refused(client: Any, item: dict[str, Any], param: str) -> None:
    assert bad_request(client, input=[item])["param"] == param


def test_an_input_over_the_window_is_context_length_exceeded(fake: FakeResponses, client: Any) -> None:
    fake.window = 50
    client.responses.create(model=MODEL, input="short")
    body = bad_request(client, input="x" * 400)
    assert body["code"] == "context_length_exceeded" and body["param"] == "input"


def test_missing_fields_and_missing_key(url: str) -> None:
    with httpx.Client(base_url=f"{url}/v1", headers={"authorization": "Bearer k"}) as http:
        for body, name in (({"input": "a"}, "model"), ({"model": MODEL}, "input")):
            answer = http.post("/responses", json=body)
            assert answer.status_code == 400
            assert answer.json()["error"]["param"] == name
            assert answer.json()["error"]["code"] == "missing_required_parameter"
        assert http.post("/responses", content=b"{nope").status_code == 400
    assert httpx.post(f"{url}/v1/responses", json={"model": MODEL, "input": "a"}).status_code == 401


def test_scripted_errors_before_and_during_a_stream(fake: FakeResponses, client: Any) -> None:
    fake.enqueue(RReply(status=429, error_message="Rate limit reached", error_code="rate_limit_exceeded",
                        headers={"retry-after": "1"}))  # fmt: skip
    with pytest.raises(openai.RateLimitError) as caught:
        client.responses.create(model=MODEL, input="a")
    assert caught.value.code == "rate_limit_exceeded"
    fake.enqueue(RReply(status=500, error_message="boom", error_code="server_error", error_mid_stream=True))
    events = list(client.responses.create(model=MODEL, input="a", stream=True))
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]
    assert events[-1].response.error.code == "server_error"
    fake.responder = lambda body: RReply(text=f"model {body['model']}")
    assert client.responses.create(model=MODEL, input="a").output_text == f"model {MODEL}"
