"""A Responses stream whose upstream is slow to answer (an inline compaction, a local model reading a long prompt)
starts with the proxy's own ``response.created`` and keeps the connection alive with ``response.in_progress``
events: Codex gives up on a stream with no event for 300 s. The answer is the same as a prompt one's."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest

from proxy.wire.responses import routes, stream
from tests.support.fake_responses import FakeResponses, RReply
from tests.support.fakes import FakeUpstream, Reply


@pytest.fixture
def quick_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "PING_AFTER", 0.05)
    monkeypatch.setattr(stream, "PING_SECONDS", 0.1)


@pytest.mark.parametrize("model", ["gpt-5-codex", "local-codex"])
def test_a_slow_upstream_gets_in_progress_events_and_the_same_answer(
    quick_pings: None, responses_proxy: Any, fake_responses: FakeResponses, fake_upstream: FakeUpstream, model: str
) -> None:
    fake_responses.enqueue(RReply(text="late words", delay=0.8))
    fake_upstream.enqueue(Reply(content="late words", delay=0.8))
    body = {"model": model, "input": "hello", "stream": True}
    with httpx.stream("POST", f"{responses_proxy.url}/v1/responses", json=body, headers={"authorization": "Bearer k"},
                      timeout=30) as response:  # fmt: skip
        assert response.status_code == 200
        events = [orjson.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds.count("response.created") == 1  # the upstream's not relayed
    assert "response.in_progress" in kinds[1 : kinds.index("response.output_item.added")]
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert len({e["response"]["id"] for e in events if "response" in e}) == 1
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "late words"


def test_the_sdk_reads_a_stream_kept_alive(
    quick_pings: None, responses_proxy: Any, fake_responses: FakeResponses
) -> None:
    fake_responses.enqueue(RReply(text="late words", delay=0.8))
    sdk = openai.OpenAI(base_url=f"{responses_proxy.url}/v1", api_key="k", max_retries=0)
    with sdk.responses.stream(model="gpt-5-codex", input="hi") as events:
        final = events.get_final_response()
    assert final.output_text == "late words"
    assert final.usage is not None and final.usage.input_tokens > 0
