"""A hostile review of the Responses door: each test failed against the door as first written, and its docstring
says what was wrong and what the right behaviour is (the line numbers are those of the reviewed code)."""

from __future__ import annotations

import base64
import sqlite3
from typing import Any

import pytest

from proxy.store.location import Location
from proxy.store.sqlite.store import DB_NAME
from tests.support.fake_responses import FakeResponses, RReply
from tests.support.fakes import FakeUpstream, Reply
from tests.support.responses_review import AGENTS, BASE, CODEX, FACT, HEADERS, history, msg, post, start

# --- 1. isolation: the body's `user` is ignored --------------------------------------------------------------


def test_the_body_user_field_scopes_responses_like_the_chat_door(
    app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    """routes.py:159 (and :382) call ``request_user(request)`` without the body's ``user``, where the chat door
    passes ``body.get("user")``. docs/clients.md: an app serving many end users through one key names them
    with OpenAI's ``user`` field, and conversations, stored responses and deletion are then scoped to that user.
    Through the Responses door every end user lands in the tenant's own scope: Bob can chain to Alice's stored
    response (``previous_response_id``) and her words are forwarded in his request, and Alice's conversation
    is not listed under ``?user=alice``. Right: the body's ``user`` scopes the request (the header still wins),
    Bob's chain to Alice's id is a 404, and Alice's conversation is hers."""
    proxy = start(app_factory, fake_responses_server, upstream_url)
    fake_upstream.enqueue(Reply(content="noted"))
    alice = post(proxy, {"model": "local-codex", "input": "My locker code is OKAPI-5.", "user": "alice"})
    assert alice.status_code == 200, alice.text
    seen = len(fake_upstream.requests)
    fake_upstream.enqueue(Reply(content="?"))
    bob = post(proxy, {"model": "local-codex", "input": "What did I say?", "user": "bob",
                       "previous_response_id": alice.json()["id"]})  # fmt: skip
    assert "OKAPI-5" not in str(fake_upstream.requests[seen:]), "Alice's words reached Bob's request"
    assert bob.status_code == 404, bob.text
    listed = proxy.client.get("/lcm/conversations", params={"user": "alice"}, headers=HEADERS)
    assert listed.status_code == 200 and len(listed.json()["data"]) == 1, listed.text


# --- 2. a checkpoint handle reaches the upstream ------------------------------------------------------------


def test_a_marker_lookalike_typed_after_a_compaction_item_does_not_leak_the_handle_upstream(
    app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str,
    fake_responses: FakeResponses,
) -> None:  # fmt: skip
    """codex.py:113-126 ``checkpoint_at`` returns the NEWEST candidate, and a user message holding anything
    shaped like a marker (``lcm_ckpt_`` + 43 characters) counts; routes.py:64-80 ``expand`` then finds it is not
    a handle and returns the items unchanged ("an unknown marker is only text"): the real compaction item
    before it, with the proxy's handle, is never expanded and goes upstream as it is. After a remote
    compaction, a user who pastes text with such a string (a log line, the marker itself) sends the
    proxy's handle to OpenAI, which refuses it (the turn fails with 400) - every later turn of the session
    fails the same way. Right: a marker that does not resolve is skipped and the search goes on to older
    items, so the compaction item is still expanded; a proxy handle never reaches the upstream."""
    proxy = start(app_factory, fake_responses_server, upstream_url)
    fake_responses.enqueue(RReply(text="done"))
    assert post(proxy, {"model": "gpt-5-codex", "input": history()[:5]}, CODEX).status_code == 200
    trigger = post(proxy, {"model": "gpt-5-codex", "input": [*history(), {"type": "compaction_trigger"}]}, CODEX)
    item = trigger.json()["output"][0]
    assert item["type"] == "compaction"
    pasted = msg("user", "USER-3: the log says token=lcm_ckpt_" + "Q" * 43 + " - what is it?")
    after = [BASE, msg("user", "USER-1: hello"), msg("user", "USER-2: go on"), AGENTS, item, pasted]
    fake_responses.enqueue(RReply(text="no idea"))
    answer = post(proxy, {"model": "gpt-5-codex", "input": after}, CODEX)
    assert item["encrypted_content"] not in str(fake_responses.last.body), "the proxy's handle went upstream"
    assert answer.status_code == 200, answer.text


# --- 3. deletion leaves content behind ----------------------------------------------------------------------


def test_deleting_a_conversation_deletes_the_stored_answer_to_its_compaction(
    where: Location, app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str,
    fake_upstream: FakeUpstream,
) -> None:  # fmt: skip
    """routes.py:361 saves the answer to Codex's (or any client's) compaction with ``conversation=None``
    although ``prepared.conversation_id`` is known, so ``remove_conversation`` (``DELETE FROM responses WHERE
    conversation_id = ?``) never deletes it. Its row keeps the request's whole input (the conversation's content)
    after ``DELETE /lcm/conversations/{id}`` answered that everything went: ``GET /v1/responses/{id}`` still
    answers, and a ``previous_response_id`` to it puts the deleted conversation back and forwards it
    upstream. (The same holds for every response stored with ``lcm_settings.enabled: false``: no delete,
    purge or retention pass ever removes those rows.) Right: the answer is stored with its conversation and
    deleted with it: both are 404 afterwards."""
    proxy = start(app_factory, fake_responses_server, upstream_url, where=where)
    fake_upstream.enqueue(Reply(content="done"))
    turn = post(proxy, {"model": "local-codex", "input": history()[:5]}, CODEX)  # store defaults to true
    assert turn.status_code == 200, turn.text
    conversation = turn.headers["x-lcm-conversation-id"]
    compaction = post(proxy, {"model": "local-codex", "input": [*history(), {"type": "compaction_trigger"}]}, CODEX)
    assert compaction.status_code == 200, compaction.text
    deleted = proxy.client.delete(f"/lcm/conversations/{conversation}", headers=HEADERS)
    assert deleted.status_code == 200, deleted.text
    assert proxy.client.get(f"/v1/responses/{turn.json()['id']}", headers=HEADERS).status_code == 404
    assert proxy.client.get(f"/v1/responses/{compaction.json()['id']}", headers=HEADERS).status_code == 404
    if where.database_url is None:  # the row itself, with the conversation's words in its input
        data_dir = proxy.config.general_settings.data_dir
        with sqlite3.connect(f"file:{data_dir / DB_NAME}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT count(*) FROM responses WHERE input_json LIKE '%ZEBRA-9%'").fetchone()[0]
        assert rows == 0, "the deleted conversation's words are still in the responses table"
    seen = len(fake_upstream.requests)
    fake_upstream.enqueue(Reply(content="ZEBRA-9"))
    chained = post(proxy, {"model": "local-codex", "input": "what was the vault code?",
                           "previous_response_id": compaction.json()["id"]})  # fmt: skip
    assert FACT not in str(fake_upstream.requests[seen:]), "the deleted conversation was forwarded upstream"
    assert chained.status_code == 404, chained.text


def test_deleting_one_branch_keeps_the_other_branchs_previous_response_id_chain(
    where: Location, app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str,
    fake_upstream: FakeUpstream,
) -> None:  # fmt: skip
    """Two answers chained to the same response (``previous_response_id`` = A, twice, with different input) are
    two conversations: the first continues A's, the second forks it. Deleting the first deletes every response
    row of that conversation (delete.py: ``DELETE FROM responses WHERE conversation_id = ?``), A included, although
    the fork is kept (its shared prefix is kept for it, docs/operations.md "kept_for_forks"). The fork's own
    chain walks through A (issued.py:46-61), so continuing the fork is now a 404 "Previous response ... not
    found": deleting one branch silently breaks the other. Right: responses a kept fork's chain passes through
    stay with the fork (or the chain is stored per conversation), and the fork continues."""
    proxy = start(app_factory, fake_responses_server, upstream_url, where=where)
    fake_upstream.enqueue(Reply(content="A1"))
    first = post(proxy, {"model": "local-codex", "input": "Q1: plan the trip"})
    assert first.status_code == 200, first.text
    fake_upstream.enqueue(Reply(content="B"))
    left = post(proxy, {"model": "local-codex", "input": "Q2: by train", "previous_response_id": first.json()["id"]})
    fake_upstream.enqueue(Reply(content="C"))
    right = post(proxy, {"model": "local-codex", "input": "Q2: by car", "previous_response_id": first.json()["id"]})
    assert left.status_code == right.status_code == 200
    assert left.headers["x-lcm-conversation-id"] != right.headers["x-lcm-conversation-id"]
    deleted = proxy.client.delete(f"/lcm/conversations/{left.headers['x-lcm-conversation-id']}", headers=HEADERS)
    assert deleted.status_code == 200, deleted.text
    fake_upstream.enqueue(Reply(content="D"))
    more = post(proxy, {"model": "local-codex", "input": "Q3: and back?", "previous_response_id": right.json()["id"]})
    assert more.status_code == 200, more.text


# --- 4. lcm off: the upstream's own compaction items are refused --------------------------------------------


def test_with_lcm_off_an_upstream_compaction_item_is_forwarded_not_refused(
    app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str,
    fake_responses: FakeResponses,
) -> None:  # fmt: skip
    """With ``lcm_settings.enabled: false`` the door does not answer compactions (routes.py:177-180): Codex's
    ``compaction_trigger`` goes to the Responses upstream, which answers with its own ``compaction`` item.
    But ``expand`` still runs (routes.py:173, before the ``lcm`` check) and refuses every compaction item the
    proxy did not issue (400 ``invalid_encrypted_content``): the very next request of that Codex session, and
    every one after, fails. Right: with LCM off nothing of the door's compaction machinery applies; a
    compaction item the proxy did not issue goes to the upstream, which is the one to judge it."""
    proxy = start(app_factory, fake_responses_server, upstream_url, lcm={"enabled": False})
    theirs = {"type": "compaction", "id": "cmp_upstream1", "encrypted_content": "gAAAA-issued-by-openai"}
    fake_responses.enqueue(RReply(text="ok"))
    answer = post(
        proxy, {"model": "gpt-5-codex", "input": [BASE, msg("user", "USER-1"), theirs, msg("user", "USER-2")]}
    )
    assert fake_responses.requests, f"the proxy refused the upstream's own compaction item: {answer.text}"
    assert "gAAAA-issued-by-openai" in str(fake_responses.last.body)


# --- 5. base64 stored inline, again and again ---------------------------------------------------------------


def test_a_stored_response_keeps_base64_images_by_reference(
    app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    """DESIGN.md: base64 payloads (``image_url`` data URLs, ``file_data``) are stored once by content hash, "the
    database keeps a reference, not megabytes of base64". The door's ``Issued.save`` (issued.py:63-71) writes
    the request's whole ``input`` verbatim into ``responses.input_json`` for every request with ``store`` not
    false: a client that re-sends its transcript (the common way, without ``previous_response_id``) stores
    every earlier turn again on every request - quadratic growth - and a pasted screenshot once per turn.
    Right: a stored response's input refers to the stored messages / payload files; the image is in the
    database at most once however many requests carry it."""
    proxy = start(app_factory, fake_responses_server, upstream_url)
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 1024).decode()  # ~350 kB of base64
    image = {"type": "input_image", "image_url": f"data:image/png;base64,{png}"}
    items: list[dict[str, Any]] = [{"type": "message", "role": "user",
                                    "content": [{"type": "input_text", "text": "what is this?"}, image]}]  # fmt: skip
    for turn in range(4):
        fake_upstream.enqueue(Reply(content=f"answer {turn}"))
        answer = post(proxy, {"model": "local-codex", "input": items})
        assert answer.status_code == 200, answer.text
        items += [*answer.json()["output"], msg("user", f"and now {turn}?")]
    data_dir = proxy.config.general_settings.data_dir
    with sqlite3.connect(f"file:{data_dir / DB_NAME}?mode=ro", uri=True) as db:
        (stored,) = db.execute("SELECT coalesce(sum(length(input_json)), 0) FROM responses").fetchone()
    assert stored < len(png), f"the responses table holds {stored} bytes: the image {stored // len(png)} times"


# --- 6. a previous_response_id chain is walked one row at a time -------------------------------------------


def test_a_long_previous_response_id_chain_is_not_walked_row_by_row_on_every_request(
    app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str, fake_upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """issued.py:46-61 ``Issued.chain`` reads the chain one ``responses`` row per query, back to its first
    response, on every request, then decodes every stored input and output: turn n costs n round trips (on
    PostgreSQL, n network round trips before anything is sent) and n decodes, a session O(n^2); at
    ``MAX_CHAIN`` (10,000) responses a long-running agent's chain ends in a misleading 404 "Previous response
    ... not found". Right: the chain's items are reachable in a bounded number of reads (a response records
    its conversation and position: the stored conversation already holds the chain's items in order)."""
    proxy = start(app_factory, fake_responses_server, upstream_url)
    reads = type(proxy.app.state.lcm.engine.store.read)  # a new reader object per access: count on its class
    original = reads.response
    calls: list[str] = []

    async def counted(self: Any, scope: str, response_id: str) -> Any:
        calls.append(response_id)
        return await original(self, scope, response_id)

    monkeypatch.setattr(reads, "response", counted)
    previous: str | None = None
    for turn in range(25):
        fake_upstream.enqueue(Reply(content=f"answer {turn}"))
        body: dict[str, Any] = {"model": "local-codex", "input": f"question {turn}"}
        if previous:
            body["previous_response_id"] = previous
        calls.clear()
        answer = post(proxy, body)
        assert answer.status_code == 200, answer.text
        previous = answer.json()["id"]
    assert len(calls) <= 3, f"the 25th turn read {len(calls)} responses rows one at a time"


# --- 7. previous_response_id "" -------------------------------------------------------------------------------


def test_an_empty_previous_response_id_is_a_400(
    app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str, fake_upstream: FakeUpstream,
) -> None:  # fmt: skip
    """routes.py:164 ``if previous`` treats ``previous_response_id: ""`` as absent: the request is silently a
    new conversation (the client believes it continued one; the stored response echoes
    ``previous_response_id: ""``). OpenAI answers 400 for an empty id. Right: validation refuses an empty
    ``previous_response_id`` with a 400 naming it (minor)."""
    proxy = start(app_factory, fake_responses_server, upstream_url)
    fake_upstream.enqueue(Reply(content="hi"))
    answer = post(proxy, {"model": "local-codex", "input": "hi", "previous_response_id": ""})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "previous_response_id"
