"""A request never waits on inline compaction past its deadline, and a streamed one gets its headers at once.

The upstream below answers chat requests at once and holds every summary request until the test lets it go,
like a slow local model summarising a long history.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import openai

from tests.support.fakes import wait_for
from tests.support.held_summaries import HeldSummaries, history, start
from tests.support.servers import serve_in_thread


def test_a_streamed_request_gets_its_headers_while_compaction_runs(proxy_factory: Any) -> None:
    upstream = HeldSummaries()
    with serve_in_thread(upstream.app) as url:
        proxy = start(proxy_factory, url, deadline=120)
        client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0, timeout=10)
        # The history is over this 2k window: the request must compact first, and the summary is held.
        with client.chat.completions.with_streaming_response.create(
            model="local", messages=history(30), stream=True, max_tokens=64
        ) as response:  # type: ignore[call-overload]
            # Headers while the compaction cannot have finished: its summary is held until we let it go.
            assert response.headers["x-lcm-compaction"] == "inline" and not upstream.release.is_set()
            assert upstream.summary_requested.wait(10)
            upstream.let_go()
            chunks = list(response.parse())
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "Pump 3."  # the keep-alive comments in between are invisible to the SDK


def test_a_request_is_answered_from_what_fits_when_compaction_overruns_its_deadline(proxy_factory: Any) -> None:
    upstream = HeldSummaries()
    with serve_in_thread(upstream.app) as url:
        proxy = start(proxy_factory, url, deadline=0.2)
        messages = history(30)
        first = httpx.post(
            f"{proxy.base_url}/chat/completions", json={"model": "local", "messages": messages, "max_tokens": 64}
        )
        assert first.status_code == 200 and first.headers["x-lcm-compaction"] == "deferred"
        assert first.json()["choices"][0]["message"]["content"] == "Pump 3."
        assert int(first.headers["x-lcm-evicted"]) > 0  # answered from what fits
        upstream.let_go()  # the compaction goes on in the background and lands
        conversation = first.headers["x-lcm-conversation-id"]
        follow = [*messages, {"role": "assistant", "content": "Pump 3."}, {"role": "user", "content": "Why?"}]

        def compacted() -> bool:
            return bool(httpx.get(f"{proxy.url}/lcm/conversations/{conversation}").json()["context_summaries"])

        assert wait_for(compacted, timeout=30)
        second = httpx.post(
            f"{proxy.base_url}/chat/completions", json={"model": "local", "messages": follow, "max_tokens": 64}
        )
        assert second.status_code == 200 and int(second.headers["x-lcm-summaries"]) > 0


def test_a_conversation_deleted_while_its_request_waits_is_a_retryable_409(proxy_factory: Any) -> None:
    """The admin deletes a conversation while a request of it waits on its inline compaction: the request
    gets a 409 the client may retry (which starts afresh), never a 500; the store stays consistent (doctor
    runs on it after the test)."""
    upstream = HeldSummaries()
    with serve_in_thread(upstream.app) as url:
        proxy = start(proxy_factory, url, deadline=120)
        answers: list[httpx.Response] = []
        body = {"model": "local", "messages": history(30), "max_tokens": 64}
        waiting = threading.Thread(
            target=lambda: answers.append(httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=60))
        )
        waiting.start()
        assert upstream.summary_requested.wait(10)
        [conversation] = [c["id"] for c in httpx.get(f"{proxy.url}/lcm/conversations").json()["data"]]
        deleted = httpx.delete(f"{proxy.url}/lcm/conversations/{conversation}", timeout=30)
        assert deleted.status_code == 200, deleted.text
        upstream.let_go()
        waiting.join(60)
        [answer] = answers
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"]["type"] != "server_error" and "deleted" in answer.json()["error"]["message"]
        assert httpx.get(f"{proxy.url}/lcm/conversations/{conversation}").status_code == 404
