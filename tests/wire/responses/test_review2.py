"""A second review of the Responses door: each test failed against the door as reviewed (commit 791b870); its
docstring says what was wrong and what the right behaviour is."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import anyio
import orjson
import pytest

from proxy.wire.responses import routes
from proxy.wire.responses.turn import Turn
from tests.support.fake_responses import FakeResponses
from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import IN_PROCESS_URL
from tests.support.responses_review import AGENTS, BASE, CODEX, HEADERS, history, msg, post, start


def test_deleting_the_abandoned_branch_keeps_the_checkpoint_its_fork_still_replays(
    app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str, fake_upstream: FakeUpstream,
) -> None:  # fmt: skip
    """A remote compaction's checkpoint stands for the first p messages of conversation A (no output of its own).
    Two continuations of the compacted session that differ in their first new prompt (an edited prompt, a
    resumed session taking another way) fork A at exactly p. Deleting A keeps its first ``keep`` = p messages for
    the fork, but store/*/delete.py deletes ``responses`` rows with ``position >= keep``: the checkpoint (position
    p == keep) goes although everything it stands for is kept. The fork replays Codex's compaction item on every
    request; ``expand`` no longer resolves it and refuses it as foreign (400 invalid_encrypted_content): the
    surviving branch's session is dead. Right: a checkpoint is kept while its position <= keep (only a response,
    whose output follows its position, needs position < keep)."""
    proxy = start(app_factory, fake_responses_server, upstream_url)
    fake_upstream.enqueue(Reply(content="done"))
    assert post(proxy, {"model": "local-codex", "input": history()[:5]}, CODEX).status_code == 200
    trigger = post(proxy, {"model": "local-codex", "input": [*history(), {"type": "compaction_trigger"}]}, CODEX)
    assert trigger.status_code == 200, trigger.text
    item = trigger.json()["output"][0]
    kept = [BASE, msg("user", "USER-1: hello"), msg("user", "USER-2: go on"), AGENTS, item]
    fake_upstream.enqueue(Reply(content="A-answer"))
    a = post(proxy, {"model": "local-codex", "input": [*kept, msg("user", "USER-3: by train")]})
    assert a.status_code == 200, a.text
    fake_upstream.enqueue(Reply(content="F-answer"))
    f = post(proxy, {"model": "local-codex", "input": [*kept, msg("user", "USER-3: by car")]})
    assert f.status_code == 200, f.text
    assert a.headers["x-lcm-conversation-id"] != f.headers["x-lcm-conversation-id"]
    deleted = proxy.client.delete(f"/lcm/conversations/{a.headers['x-lcm-conversation-id']}", headers=HEADERS)
    assert deleted.status_code == 200, deleted.text
    fake_upstream.enqueue(Reply(content="more"))
    more = post(
        proxy,
        {
            "model": "local-codex",
            "input": [*kept, msg("user", "USER-3: by car"), *f.json()["output"], msg("user", "USER-4: and back?")],
        },
    )
    assert more.status_code == 200, more.text
    assert "ZEBRA-9" in str(fake_upstream.requests[-1]), "the fork lost the history its checkpoint stands for"


def _asgi_post(proxy: Any, body: dict[str, Any], fail_start: bool) -> list[dict[str, Any]]:
    """``POST /v1/responses`` straight into the app, with a server whose ``send`` of the response's start raises
    ``OSError`` (what ``ClosingStream`` itself expects of an ASGI 2.4 server once the client is gone)."""
    raw = orjson.dumps(body)
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/responses", "raw_path": b"/v1/responses", "query_string": b"", "root_path": "",
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 4000),
        "headers": [(b"host", urlsplit(IN_PROCESS_URL).netloc.encode()), (b"content-type", b"application/json"),
                    (b"content-length", str(len(raw)).encode()), (b"authorization", b"Bearer sk-x")],
    }  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        given = False

        async def receive() -> dict[str, Any]:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await anyio.sleep_forever()
            raise AssertionError

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if fail_start and message["type"] == "http.response.start":
                raise OSError("the client is gone")

        await proxy.app(scope, receive, send)
        await anyio.sleep(0.5)  # anything left to finish in the background

    proxy.client.portal.call(run)
    return sent


@pytest.mark.parametrize("ping_after", [5.0, 0.0])
def test_a_stream_whose_start_cannot_be_sent_leaves_its_priority_slot_and_closes_its_upstream(
    app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str, fake_upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch, ping_after: float,
) -> None:  # fmt: skip
    """routes.py:126 enters the upstream's priority slot and :134 opens the upstream's stream before the response
    exists; only the ``finally`` of ``stream.relay`` (stream.py:440-444) or ``stream.late`` (:466-469) gives them
    back. Those are async generators: when the server's ``send`` of ``http.response.start`` raises (ClosingStream
    catches the OSError an ASGI 2.4 server raises once the client is gone, streaming.py:49) or a cancellation
    lands there, the generator was never started, ``ClosingStream._close_body``'s ``aclose()`` does not run its
    ``finally``, and nothing else does. The upstream's stream stays open (its connection and, for a local
    llama.cpp, its generation), and ``Priority._busy`` for that local upstream stays at 1 for the life of the
    process: every later background compaction there gives way at once, for ever (priority.py:74-80). With
    ``late`` the opening task also runs on and its ``Opened`` is never closed. The chat door's streams have the
    same shape (same result with ``/v1/chat/completions``). Right: the slot is left and the upstream closed
    however the response ends, started or not (e.g. a body iterator object whose ``aclose`` releases them,
    or ClosingStream calling a cleanup callback in its ``finally``)."""
    monkeypatch.setattr(routes, "PING_AFTER", ping_after)
    proxy = start(app_factory, fake_responses_server, upstream_url)
    fake_upstream.enqueue(Reply(content="hello there"))
    sent = _asgi_post(proxy, {"model": "local-codex", "input": "hi", "stream": True}, fail_start=True)
    assert sent and sent[0]["type"] == "http.response.start"
    busy = proxy.app.state.lcm.priority._busy
    assert not any(busy.values()), f"a priority slot was never left: {busy}"


def test_a_late_stream_whose_upstream_fails_unexpectedly_still_ends_in_response_failed(
    app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str, fake_upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """stream.py:452-469 ``late`` catches only ``REPORTED`` around ``opening.result()``, where ``relay`` also turns
    any other exception into ``response.failed`` (stream.py:437-439). An unexpected error while the upstream is
    opened (a translation bug, an ``httpx`` error that is not mapped, anything the engine's compacted retry
    raises outside ``EngineError``) after the proxy's ``response.created`` went out propagates out of the body
    iterator: the stream stops with no ``response.completed``/``failed`` (Codex: "stream closed before
    response.completed", and it retries the same doomed request). Right: as in ``relay``, log it and end the
    stream with ``response.failed`` (server_error)."""
    monkeypatch.setattr(routes, "PING_AFTER", 0.0)

    async def broken(self: Turn, prepared: Any) -> Any:
        await asyncio.sleep(0.05)
        raise RuntimeError("a bug while opening the upstream")

    monkeypatch.setattr(Turn, "open", broken)
    proxy = start(app_factory, fake_responses_server, upstream_url)
    answer = post(proxy, {"model": "local-codex", "input": "hi", "stream": True})
    assert answer.status_code == 200
    assert "event: response.created" in answer.text
    assert "event: response.failed" in answer.text, answer.text
