"""A stream whose upstream is slow to answer (an inline compaction, a local model reading a long prompt) starts
with the proxy's own ``message_start`` and keeps the connection alive with ``ping`` events: Claude Code gives up
on a stream silent for 300 s. The answer is the same as a prompt one's, with the upstream's usage in the end."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import orjson
import pytest

from proxy.wire.messages import routes, stream
from tests.support.fake_anthropic import AReply, FakeAnthropic
from tests.support.fakes import FakeUpstream, Reply


@pytest.fixture
def quick_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "PING_AFTER", 0.05)
    monkeypatch.setattr(stream, "PING_SECONDS", 0.1)


def _events(url: str, model: str) -> list[dict[str, Any]]:
    body = {"model": model, "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", f"{url}/v1/messages", json=body, headers=headers, timeout=30) as response:
        assert response.status_code == 200
        return [orjson.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "local-claude"])
def test_a_slow_upstream_gets_pings_and_the_same_answer(
    quick_pings: None, claude_proxy: Any, fake_anthropic: FakeAnthropic, fake_upstream: FakeUpstream, model: str
) -> None:
    fake_anthropic.enqueue(AReply(text="late words", delay=0.8))
    fake_upstream.enqueue(Reply(content="late words", delay=0.8))
    events = _events(claude_proxy.url, model)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start"
    assert kinds.count("message_start") == 1  # the upstream's own is not relayed after the proxy's
    assert "ping" in kinds[1 : kinds.index("content_block_start")]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text == "late words"
    assert events[-2]["usage"]["input_tokens"] > 0  # the upstream's usage, in the final message_delta


def test_the_sdk_reads_a_pinged_stream(quick_pings: None, claude_proxy: Any, fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.enqueue(AReply(text="late words", delay=0.8))
    sdk = anthropic.Anthropic(base_url=claude_proxy.url, api_key="k", max_retries=0)
    with sdk.messages.stream(
        model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    ) as s:
        final = s.get_final_message()
    assert final.content[0].text == "late words"
    assert final.usage.input_tokens > 0
