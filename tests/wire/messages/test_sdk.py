"""The official ``anthropic`` SDK through the Messages door, against the strict fake Anthropic API (native) and
the fake OpenAI-compatible upstream (translated): text, streams, tool use, thinking, count_tokens, errors."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.support.fake_anthropic import ANTHROPIC_KEY, AReply, FakeAnthropic
from tests.support.fakes import FakeUpstream, Reply


def client(proxy: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="sk-client", max_retries=0)


def test_a_text_turn_reaches_anthropic_natively_and_comes_back(
    claude_proxy: Any, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.enqueue(AReply(text="Bonjour from the fake"))
    answer = client(claude_proxy).messages.create(
        model="claude-sonnet-4-5",
        max_tokens=100,
        system=[{"type": "text", "text": "billing line"}, {"type": "text", "text": "be brief"}],
        messages=[{"role": "user", "content": "say hi"}],
    )
    assert answer.content[0].text == "Bonjour from the fake"
    assert answer.stop_sequence is None
    sent = fake_anthropic.last
    assert sent.path.startswith("/v1/messages")
    assert sent.headers["x-api-key"] == ANTHROPIC_KEY  # the deployment's key, never the client's
    assert sent.body["system"] == [{"type": "text", "text": "billing line"}, {"type": "text", "text": "be brief"}]
    assert sent.body["model"] == "claude-sonnet-4-5"


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "local-claude"])
def test_a_stream_adds_up_to_the_same_message_on_both_upstreams(
    claude_proxy: Any, fake_anthropic: FakeAnthropic, fake_upstream: FakeUpstream, model: str
) -> None:
    fake_anthropic.enqueue(AReply(text="streamed words here"))
    fake_upstream.enqueue(Reply(content="streamed words here"))
    with client(claude_proxy).messages.stream(
        model=model, max_tokens=100, messages=[{"role": "user", "content": "stream please"}]
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].text == "streamed words here"
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens > 0


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "local-claude"])
def test_a_tool_use_round_trip_keeps_the_pairing(
    claude_proxy: Any, fake_anthropic: FakeAnthropic, fake_upstream: FakeUpstream, model: str
) -> None:
    tool = {"name": "get_weather", "description": "weather", "input_schema": {"type": "object"}}
    fake_anthropic.enqueue(AReply(tool_uses=[{"id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]))
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    fake_upstream.enqueue(Reply(content=None, tool_calls=[call]))
    sdk = client(claude_proxy)
    first = sdk.messages.create(
        model=model, max_tokens=100, tools=[tool], messages=[{"role": "user", "content": "weather in Oslo?"}]
    )
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input == {"city": "Oslo"}
    fake_anthropic.enqueue(AReply(text="It is sunny."))
    fake_upstream.enqueue(Reply(content="It is sunny."))
    second = sdk.messages.create(
        model=model,
        max_tokens=100,
        tools=[tool],
        messages=[
            {"role": "user", "content": "weather in Oslo?"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]},
        ],
    )
    assert second.content[0].text == "It is sunny."
    if model == "local-claude":
        sent = fake_upstream.last.body["messages"]
        assert sent[-1] == {"role": "tool", "tool_call_id": use.id, "content": "sunny"}


def test_thinking_with_its_signature_survives_the_next_turn(claude_proxy: Any, fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.enqueue(AReply(thinking="Let me think about Oslo.", text="Probably rain."))
    sdk = client(claude_proxy)
    question = {"role": "user", "content": "weather in Oslo?"}
    thinking = {"type": "enabled", "budget_tokens": 1024}
    first = sdk.messages.create(model="claude-sonnet-4-5", max_tokens=2000, thinking=thinking, messages=[question])
    assert first.content[0].type == "thinking"
    fake_anthropic.enqueue(AReply(text="Still rain."))
    second = sdk.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=2000,
        thinking=thinking,
        messages=[
            question,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": "and tomorrow?"},
        ],
    )
    assert second.content[0].text == "Still rain."  # the fake checked the replayed signature
    replayed = fake_anthropic.last.body["messages"][1]["content"][0]
    assert replayed["signature"] == first.content[0].signature


def test_count_tokens_answers_without_an_upstream_call(claude_proxy: Any, fake_anthropic: FakeAnthropic) -> None:
    counted = client(claude_proxy).messages.count_tokens(
        model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hello " * 200}]
    )
    assert 150 < counted.input_tokens < 400
    assert fake_anthropic.requests == []


def test_an_upstream_overload_reaches_the_client_as_it_was(claude_proxy: Any, fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.enqueue(AReply(status=529, error_message="Overloaded, try later"))
    with pytest.raises(anthropic.APIStatusError) as caught:
        client(claude_proxy).messages.create(
            model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 529
    assert caught.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert "Overloaded, try later" in caught.value.body["error"]["message"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": []}, "messages"),
        (
            {"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]},
            "messages.0.role",
        ),
        (
            {"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "x"}]}]},
            "messages.0.content.0.type",
        ),
    ],
)
def test_a_malformed_request_is_a_400_in_anthropic_shape_naming_the_parameter(
    claude_proxy: Any, fake_anthropic: FakeAnthropic, body: dict[str, Any], param: str
) -> None:
    import httpx

    response = httpx.post(
        f"{claude_proxy.url}/v1/messages", json=body, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}
    )
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(param)
    assert fake_anthropic.requests == []


def test_the_model_list_speaks_anthropic_to_an_anthropic_client(claude_proxy: Any) -> None:
    names = [m.id for m in client(claude_proxy).models.list()]
    assert "claude-sonnet-4-5" in names and "local-claude" in names
    page = client(claude_proxy).models.list()
    assert all(m.display_name for m in page.data)


def test_the_warm_up_probe_is_answered(claude_proxy: Any) -> None:
    import httpx

    assert httpx.head(f"{claude_proxy.url}/api/hello").status_code == 200


def test_client_usage_reports_what_the_client_sent(
    proxy_factory: Any,
    fake_anthropic_server: tuple[FakeAnthropic, str],
    fake_anthropic: FakeAnthropic,
    upstream_url: str,
) -> None:
    import httpx

    from tests.support.fake_anthropic import claude_models

    proxy = proxy_factory(
        lcm={"client_usage": "client", "fresh_tail_count": 2, "leaf_chunk_tokens": 400},
        models=claude_models(fake_anthropic_server[1], upstream_url, window=2_000),
    )
    fixed = {"input_tokens": 1000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    fake_anthropic.responder = lambda body: AReply(text="ok", usage=fixed)
    messages: list[dict[str, Any]] = []
    shifted = []
    for i in range(16):
        messages.append({"role": "user", "content": f"Turn {i}: " + "words about caching " * 40})
        response = httpx.post(
            f"{proxy.url}/v1/messages",
            json={"model": "claude-sonnet-4-5", "max_tokens": 300, "messages": messages},
            headers={"x-api-key": "k", "anthropic-version": "2023-06-01", "x-claude-code-session-id": "u"},
        )
        assert response.status_code == 200, response.text
        sent, forwarded = (int(response.headers[f"x-lcm-tokens-{k}"]) for k in ("sent", "forwarded"))
        shifted.append(sent - forwarded)
        # What the proxy left out is added (never taken: recalled excerpts can make the forwarded context larger).
        assert response.json()["usage"]["input_tokens"] == 1000 + max(0, sent - forwarded)
        messages.append({"role": "assistant", "content": response.json()["content"]})
    assert max(shifted) > 0  # the proxy compacted, and the client was told what it sent, not what was forwarded


def test_a_sub_agent_is_a_conversation_of_its_own_linked_to_the_session(
    claude_proxy: Any, fake_anthropic: FakeAnthropic
) -> None:
    import httpx

    fake_anthropic.responder = lambda body: AReply(text="ok")
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", "x-claude-code-session-id": "sess-77"}

    def ask(extra: dict[str, str], text: str) -> str:
        body = {"model": "claude-sonnet-4-5", "max_tokens": 20, "messages": [{"role": "user", "content": text}]}
        response = httpx.post(f"{claude_proxy.url}/v1/messages", json=body, headers={**headers, **extra})
        assert response.status_code == 200, response.text
        return response.headers["x-lcm-conversation-id"]

    main = ask({}, "plan the refactor")
    agent = ask({"x-claude-code-agent-id": "a1"}, "search the code base for callers")
    nested = ask({"x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1"}, "read one file")
    assert len({main, agent, nested}) == 3
    seen = httpx.get(f"{claude_proxy.url}/lcm/conversations/{agent}").json()
    assert seen["linked_to"] == main
    assert httpx.get(f"{claude_proxy.url}/lcm/conversations/{nested}").json()["linked_to"] == agent
    assert httpx.get(f"{claude_proxy.url}/lcm/conversations/{main}").json()["linked_to"] is None
