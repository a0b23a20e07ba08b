"""The official ``openai`` SDK's ``client.responses`` through the Responses door, against the fake OpenAI-compatible
upstream (translated to Chat Completions) and the strict fake Responses API (native): text, streams, tool calls,
reasoning replayed, ``previous_response_id`` chains, stored responses, errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.fake_responses import FakeResponses, RReply, responses_models
from tests.support.fakes import FakeUpstream, Reply

MODELS = ["local-codex", "gpt-5-codex"]


def client(proxy: Any, key: str = "sk-client") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0)


def script(fake_upstream: FakeUpstream, fake_responses: FakeResponses, text: str) -> None:
    fake_upstream.enqueue(Reply(content=text))
    fake_responses.enqueue(RReply(text=text))


def sent_texts(model: str, fake_upstream: FakeUpstream, fake_responses: FakeResponses) -> list[str]:
    """The words of every message the upstream received in its last request."""
    if model == "gpt-5-codex":
        out = []
        for item in fake_responses.last.body["input"]:
            content = item.get("content")
            if isinstance(content, str):
                out.append(content)
            elif isinstance(content, list):
                out.append(" ".join(p.get("text", "") for p in content))
            elif item.get("type") == "function_call_output":
                out.append(str(item["output"]))
        return out
    texts = []
    for message in fake_upstream.last.body["messages"]:
        content = message.get("content")
        texts.append(content if isinstance(content, str) else " ".join(p.get("text", "") for p in content or []))
    return texts


@pytest.mark.parametrize("model", MODELS)
def test_a_text_turn_comes_back_as_a_response(
    responses_proxy: Any, fake_upstream: FakeUpstream, fake_responses: FakeResponses, model: str
) -> None:
    script(fake_upstream, fake_responses, "Bonjour from the fake")
    answer = client(responses_proxy).responses.create(model=model, instructions="be brief", input="say hi")
    assert answer.output_text == "Bonjour from the fake"
    assert answer.status == "completed"
    assert answer.id.startswith("resp_lcm_")
    assert answer.usage is not None and answer.usage.input_tokens > 0
    texts = sent_texts(model, fake_upstream, fake_responses)
    assert texts[-1] == "say hi"
    if model == "gpt-5-codex":
        assert fake_responses.last.body["instructions"] == "be brief"
        assert fake_responses.last.body["store"] is False
        assert "previous_response_id" not in fake_responses.last.body
    else:
        assert fake_upstream.last.body["messages"][0] == {"role": "system", "content": "be brief"}


@pytest.mark.parametrize("model", MODELS)
def test_a_stream_is_numbered_from_zero_and_adds_up_to_the_response(
    responses_proxy: Any, fake_upstream: FakeUpstream, fake_responses: FakeResponses, model: str
) -> None:
    script(fake_upstream, fake_responses, "streamed words here")
    events = list(client(responses_proxy).responses.create(model=model, input="stream please", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [i.item.content[0].text for i in done if i.item.type == "message"] == ["streamed words here"]
    final = events[-1].response
    assert final.output_text == "streamed words here"
    assert final.id == events[0].response.id and final.id.startswith("resp_lcm_")
    assert final.usage is not None and final.usage.output_tokens > 0


@pytest.mark.parametrize("model", MODELS)
def test_a_function_call_round_trip_keeps_its_pairing(
    responses_proxy: Any, fake_upstream: FakeUpstream, fake_responses: FakeResponses, model: str
) -> None:
    tool = {"type": "function", "name": "get_weather", "description": "weather", "parameters": {"type": "object"}}
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    fake_upstream.enqueue(Reply(content=None, tool_calls=[call]))
    fake_responses.enqueue(
        RReply(function_calls=[{"name": "get_weather", "arguments": '{"city": "Oslo"}'}], reasoning="look it up")
    )
    sdk = client(responses_proxy)
    include: Any = ["reasoning.encrypted_content"]
    first = sdk.responses.create(model=model, tools=[tool], input="weather in Oslo?", store=False, include=include)
    calls = [i for i in first.output if i.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].arguments == '{"city": "Oslo"}'
    script(fake_upstream, fake_responses, "It is sunny.")
    history: list[Any] = [{"role": "user", "content": "weather in Oslo?"}]
    history += [i.model_dump(exclude_none=True) for i in first.output]
    history.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21C"})
    second = sdk.responses.create(model=model, tools=[tool], input=history, store=False, include=include)
    assert second.output_text == "It is sunny."
    if model == "gpt-5-codex":
        kinds = [i.get("type") for i in fake_responses.last.body["input"]]
        assert kinds[-2:] == ["function_call", "function_call_output"]
        assert any(i.get("type") == "reasoning" for i in fake_responses.last.body["input"])  # replayed as issued
    else:
        messages = fake_upstream.last.body["messages"]
        assert messages[-2]["tool_calls"][0]["id"] == calls[0].call_id
        assert messages[-1] == {"role": "tool", "tool_call_id": calls[0].call_id, "content": "sunny, 21C"}


@pytest.mark.parametrize("model", MODELS)
def test_previous_response_id_chains_are_kept_by_the_proxy(
    responses_proxy: Any, fake_upstream: FakeUpstream, fake_responses: FakeResponses, model: str
) -> None:
    sdk = client(responses_proxy)
    script(fake_upstream, fake_responses, "The code word is PELICAN.")
    first = sdk.responses.create(model=model, input="Remember: the code word is PELICAN.")
    script(fake_upstream, fake_responses, "noted")
    second = sdk.responses.create(model=model, input="And the colour is teal.", previous_response_id=first.id)
    script(fake_upstream, fake_responses, "PELICAN, teal")
    sdk.responses.create(model=model, input="What were they?", previous_response_id=second.id)
    texts = sent_texts(model, fake_upstream, fake_responses)
    assert texts[-5:] == [
        "Remember: the code word is PELICAN.", "The code word is PELICAN.", "And the colour is teal.", "noted",
        "What were they?",
    ]  # fmt: skip
    assert sdk.responses.retrieve(second.id).output_text == "noted"


def test_unknown_foreign_and_unstored_responses_are_not_found(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str
) -> None:
    keys = [{"key": "sk-proxy-alice-000000", "tenant": "alice"}, {"key": "sk-proxy-bob-1111111", "tenant": "bob"}]
    proxy = proxy_factory(models=responses_models("http://127.0.0.1:9", upstream_url), api_keys=keys)
    alice, bob = client(proxy, "sk-proxy-alice-000000"), client(proxy, "sk-proxy-bob-1111111")
    fake_upstream.enqueue(Reply(content="stored"), Reply(content="unstored"))
    kept = alice.responses.create(model="local-codex", input="hello")
    unkept = alice.responses.create(model="local-codex", input="hello", store=False)
    for sdk, wanted in ((bob, kept.id), (alice, unkept.id), (alice, "resp_never_issued")):
        with pytest.raises(openai.NotFoundError) as missing:
            sdk.responses.create(model="local-codex", input="more", previous_response_id=wanted)
        assert missing.value.body["param"] == "previous_response_id"  # type: ignore[index]
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(wanted)
    assert alice.responses.retrieve(kept.id).output_text == "stored"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi"}, "model"),
        ({"model": "local-codex"}, "input"),
        ({"model": "local-codex", "input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role"),
        ({"model": "local-codex", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"model": "local-codex", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "local-codex", "input": "hi", "tools": {"a": 1}}, "tools"),
    ],
)
def test_malformed_requests_are_a_400_naming_the_parameter(responses_proxy: Any, body: Any, param: str) -> None:
    answer = httpx.post(f"{responses_proxy.url}/v1/responses", json=body, headers={"authorization": "Bearer sk-x"})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_a_websocket_upgrade_is_refused_with_426(responses_proxy: Any) -> None:
    answer = httpx.get(f"{responses_proxy.url}/v1/responses")
    assert answer.status_code == 426
    assert answer.json()["error"]["code"] == "websocket_not_supported"


def test_a_real_websocket_upgrade_is_refused_with_426(responses_proxy: Any) -> None:
    """What Codex does with ``supports_websockets = true``: a 426 sends it to plain HTTP at once."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = responses_proxy.url.replace("http://", "ws://") + "/v1/responses"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, additional_headers={"authorization": "Bearer sk-x"}, open_timeout=10)
    assert refused.value.response.status_code == 426


def test_a_custom_tool_call_round_trips_through_a_chat_upstream(
    responses_proxy: Any, fake_upstream: FakeUpstream
) -> None:
    """Codex's apply_patch is a custom tool (free-form input): a chat upstream sees it as a function taking one
    string, and its call comes back to the client as a ``custom_tool_call`` with that string."""
    tool: Any = {"type": "custom", "name": "apply_patch", "description": "edit files"}
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch"
    fn = {"name": "apply_patch", "arguments": json.dumps({"input": patch})}
    fake_upstream.enqueue(Reply(content=None, tool_calls=[{"id": "call_p1", "type": "function", "function": fn}]))
    sdk = client(responses_proxy)
    first = sdk.responses.create(model="local-codex", tools=[tool], input="add a.txt", store=False)
    calls = [i for i in first.output if i.type == "custom_tool_call"]
    assert len(calls) == 1 and calls[0].input == patch and calls[0].call_id == "call_p1"
    sent_tools = fake_upstream.last.body["tools"]
    assert [t["function"]["name"] for t in sent_tools] == ["apply_patch"]
    fake_upstream.enqueue(Reply(content="Added."))
    history: list[Any] = [{"role": "user", "content": "add a.txt"}, calls[0].model_dump(exclude_none=True)]
    history.append({"type": "custom_tool_call_output", "call_id": "call_p1", "output": "Done!"})
    second = sdk.responses.create(model="local-codex", tools=[tool], input=history, store=False)
    assert second.output_text == "Added."
    messages = fake_upstream.last.body["messages"]
    assert messages[-2]["tool_calls"][0]["id"] == "call_p1"
    assert json.loads(messages[-2]["tool_calls"][0]["function"]["arguments"]) == {"input": patch}
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_p1", "content": "Done!"}
