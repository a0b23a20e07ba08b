"""Anthropic's official TypeScript SDK (``@anthropic-ai/sdk``, pinned, run by Node) through the Messages door, on
the native model (the strict fake Anthropic API) and the translated one (the fake OpenAI-compatible upstream): a
text turn, a stream added up by ``messages.stream().finalMessage()``, a tool-use round trip, ``countTokens``, and
an upstream overload the SDK raises as its own ``APIError`` (status 529, ``overloaded_error``). The script prints
one JSON line; the test reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.anthropic_js import ANTHROPIC_JS_VERSION, run_node
from tests.support.fake_anthropic import AReply, FakeAnthropic
from tests.support.fakes import FakeUpstream, Reply

pytestmark = pytest.mark.slow

SCRIPT = r"""
const { Anthropic } = require("@anthropic-ai/sdk");
const client = new Anthropic({ baseURL: process.env.PROXY_URL, apiKey: "sk-js-client", maxRetries: 0 });
const model = process.env.MODEL;
const tool = { name: "get_weather", description: "weather", input_schema: { type: "object" } };
const texts = (message) => message.content.filter((b) => b.type === "text").map((b) => b.text).join("");

(async () => {
  const out = { version: require("@anthropic-ai/sdk/version").VERSION };
  const text = await client.messages.create({
    model, max_tokens: 100, system: "be brief", messages: [{ role: "user", content: "say hi" }],
  });
  out.text = { text: texts(text), stop_reason: text.stop_reason, input_tokens: text.usage.input_tokens,
               role: text.role, type: text.type };

  const stream = client.messages.stream({
    model, max_tokens: 100, messages: [{ role: "user", content: "stream please" }],
  });
  let deltas = 0;
  stream.on("text", () => { deltas += 1; });
  const streamed = await stream.finalMessage();
  out.stream = { text: texts(streamed), stop_reason: streamed.stop_reason, deltas,
                 input_tokens: streamed.usage.input_tokens, blocks: streamed.content.map((b) => b.type) };

  const question = { role: "user", content: "weather in Oslo?" };
  const first = await client.messages.create({ model, max_tokens: 100, tools: [tool], messages: [question] });
  const use = first.content.find((b) => b.type === "tool_use");
  const second = await client.messages.create({
    model, max_tokens: 100, tools: [tool],
    messages: [
      question,
      { role: "assistant", content: first.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "sunny" }] },
    ],
  });
  out.tools = { stop_reason: first.stop_reason, name: use.name, input: use.input, id: use.id,
                answer: texts(second), final_stop: second.stop_reason };

  const counted = await client.messages.countTokens({
    model, messages: [{ role: "user", content: "hello ".repeat(200) }],
  });
  out.count = counted.input_tokens;

  try {
    await client.messages.create({ model, max_tokens: 10, messages: [{ role: "user", content: "hi" }] });
    out.error = null;
  } catch (error) {
    out.error = { api_error: error instanceof Anthropic.APIError, overloaded: error instanceof Anthropic.InternalServerError,
                  status: error.status, type: error.type, body_type: error.error && error.error.error && error.error.error.type,
                  message: String(error.message) };
  }
  console.log(JSON.stringify(out));
})().catch((error) => { console.error(error); process.exit(1); });
"""


def _script_native(fake: FakeAnthropic) -> None:
    fake.enqueue(
        AReply(text="Hello from the fake"),
        AReply(text="streamed words here"),
        AReply(tool_uses=[{"id": "toolu_js1", "name": "get_weather", "input": {"city": "Oslo"}}]),
        AReply(text="It is sunny."),
        AReply(status=529, error_message="Overloaded, try later"),
    )


def _script_translated(fake: FakeUpstream) -> None:
    call = {"id": "call_js1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    for reply in (
        Reply(content="Hello from the fake"),
        Reply(content="streamed words here"),
        Reply(content=None, tool_calls=[call]),
        Reply(content="It is sunny."),
        Reply(status=529, error_type="server_error", error_message="Overloaded, try later"),  # OpenAI's 5xx type
    ):
        fake.enqueue(reply)


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "local-claude"])
def test_the_typescript_sdk_drives_the_messages_door(
    claude_proxy: Any, fake_anthropic: FakeAnthropic, fake_upstream: FakeUpstream, model: str
) -> None:
    native = model == "claude-sonnet-4-5"
    if native:
        _script_native(fake_anthropic)
    else:
        _script_translated(fake_upstream)
    code, stdout, stderr = run_node(SCRIPT, {"PROXY_URL": claude_proxy.url, "MODEL": model})
    assert code == 0, stderr[-3000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["version"] == ANTHROPIC_JS_VERSION

    assert out["text"] == {
        "text": "Hello from the fake", "stop_reason": "end_turn", "input_tokens": out["text"]["input_tokens"],
        "role": "assistant", "type": "message",
    }  # fmt: skip
    assert out["text"]["input_tokens"] > 0

    assert out["stream"]["text"] == "streamed words here" and out["stream"]["blocks"] == ["text"]
    assert out["stream"]["stop_reason"] == "end_turn" and out["stream"]["input_tokens"] > 0
    assert out["stream"]["deltas"] >= 1

    tools = out["tools"]
    assert tools["stop_reason"] == "tool_use" and tools["name"] == "get_weather"
    assert tools["input"] == {"city": "Oslo"}
    assert tools["answer"] == "It is sunny." and tools["final_stop"] == "end_turn"

    assert 150 < out["count"] < 400

    error = out["error"]
    assert error is not None, "the overload was not raised"
    assert error["api_error"] and error["overloaded"]  # InternalServerError: the SDK's class for any 5xx
    assert error["status"] == 529
    assert error["type"] == "overloaded_error" and error["body_type"] == "overloaded_error"
    assert "Overloaded, try later" in error["message"]

    if native:
        answered = [r for r in fake_anthropic.requests if r.path.startswith("/v1/messages")]
        assert len(answered) == 5  # countTokens is answered by the proxy
        assert answered[0].body["system"] == "be brief"
        assert answered[1].body["stream"] is True
        replayed = answered[3].body["messages"]
        assert replayed[-1]["content"] == [{"type": "tool_result", "tool_use_id": tools["id"], "content": "sunny"}]
        assert all(r.headers["x-api-key"] != "sk-js-client" for r in answered)
    else:
        assert len(fake_upstream.requests) == 5
        assert fake_upstream.requests[1].body["stream"] is True
        sent = fake_upstream.requests[3].body["messages"]
        assert sent[-1] == {"role": "tool", "tool_call_id": tools["id"], "content": "sunny"}
