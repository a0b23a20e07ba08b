"""Isolated, within one tenant: a conversation sees of another only the prefix they share.

Identity is by longest common prefix, so conversations that merely open alike ("Hello!") become forks of one
another, and an app that serves many end users through one key puts them all in one tenant. Alice's
conversation opens with a greeting and then holds a private fact, a stored file and a summary of both. Bob's
conversations reach it in the three ways a real client can: the same opening line, a copy of Alice's first
reply too, and Alice's conversation id in ``X-LCM-Conversation-Id`` with a transcript of his own. In each,
Bob's model calls every recall tool with every id of Alice's it could know, and the admin API and the CLI
are asked for Bob's conversation: none of it may carry Alice's words.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.cli import main
from tests.support.fakes import FakeUpstream
from tests.support.proxies import RunningProxy
from tests.support.tool_model import ToolModel, is_summary_request

PRIVATE = "LANTERNFISH4471"  # Alice's private fact, in a message and (through the summarizer) in a summary
FILE_PRIVATE = "KESTREL9150"  # in Alice's stored file
GREETING = {"role": "user", "content": "Hello!"}
ALICE_REPLY = {"role": "assistant", "content": "Hi! How can I help you today?"}
LCM = {
    "retrieval_tools": "always",
    "fresh_tail_count": 2,
    "large_file_token_threshold": 100,
    "tool_result_token_threshold": 50,
}


def alice_history() -> list[dict[str, Any]]:
    document = "".join(f"row {i}: {FILE_PRIVATE} is stored in cabinet {i}\n" for i in range(40))
    return [
        GREETING,
        ALICE_REPLY,
        {"role": "user", "content": f"Keep this private: my diagnosis code is {PRIVATE}."},
        {"role": "assistant", "content": "Understood, it stays between us."},
        {"role": "user", "content": f'<file name="records.txt">{document}</file>'},
        {"role": "assistant", "content": "I have read your records."},
        {"role": "user", "content": "Thanks, that is all for today."},
    ]


@dataclass
class Alice:
    conversation: str
    summary: str
    message: str  # msg_… holding PRIVATE
    file: str


def post(proxy: RunningProxy, messages: list[dict[str, Any]], **headers: str) -> httpx.Response:
    response = httpx.post(
        f"{proxy.base_url}/chat/completions",
        json={"model": "test-model", "messages": messages},
        headers=headers,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response


def seed_alice(proxy: RunningProxy) -> Alice:
    conversation = post(proxy, alice_history()).headers["x-lcm-conversation-id"]
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        assert client.post(f"/lcm/conversations/{conversation}/compact").json()["leaf_passes"] >= 1
        summary = client.get(f"/lcm/conversations/{conversation}").json()["context_summaries"][0]
        messages = client.get(f"/lcm/conversations/{conversation}/messages").json()["data"]
        assert PRIVATE in client.get(f"/lcm/summaries/{summary}").json()["content"]  # the summary holds it too
    message = next(m["id"] for m in messages if PRIVATE in json.dumps(m["message"]))
    file_id = next(f for m in messages for f in m["files"])
    return Alice(conversation, summary, message, file_id)


def every_tool_call(alice: Alice) -> list[tuple[str, dict[str, Any]]]:
    return [
        # Queries never spell the private strings out: a tool echoes its query, and that is no leak.
        ("lcm_grep", {"pattern": r"lantern\w+|kestrel\d+|diagnosis"}),
        ("lcm_grep", {"pattern": "diagnosis code private cabinet records", "mode": "full_text"}),
        ("lcm_describe", {"id": alice.message}),
        ("lcm_describe", {"id": alice.summary}),
        ("lcm_describe", {"id": alice.file}),
        ("lcm_expand", {"id": alice.summary}),
        ("lcm_expand_query", {"prompt": "What is the diagnosis code?", "query": "diagnosis code private"}),
        ("lcm_expand_query", {"prompt": "What is the diagnosis code?", "ids": [alice.summary]}),
    ]


@pytest.fixture
def world(proxy_factory: Any, fake_upstream: FakeUpstream) -> Iterator[tuple[RunningProxy, Alice, ToolModel]]:
    proxy = proxy_factory(LCM)
    model = ToolModel()
    fake_upstream.responder = model
    yield proxy, seed_alice(proxy), model


def bob_turn(
    proxy: RunningProxy,
    fake: FakeUpstream,
    model: ToolModel,
    alice: Alice,
    messages: list[dict[str, Any]],
    **headers: str,
) -> tuple[str, str]:
    """Bob's model calls every recall tool on Alice's ids; returns (Bob's conversation id, all the proxy showed)."""
    model.plan = every_tool_call(alice)
    model.results.clear()
    before = len(fake.requests)
    response = post(proxy, messages, **headers)
    shown = [response.text, *model.results.values()]
    shown += [json.dumps(r.body) for r in fake.requests[before:] if not is_summary_request(r.body)]
    assert len(model.results) == len(model.plan), "every planned recall call ran"
    return response.headers["x-lcm-conversation-id"], "\n".join(shown)


def assert_private(text: str) -> None:
    assert PRIVATE not in text and PRIVATE.lower() not in text.lower()
    assert FILE_PRIVATE not in text


def admin_and_cli_views(proxy: RunningProxy, conversation: str, tmp_path: Path) -> str:
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        views = [
            client.get(f"/lcm/conversations/{conversation}{suffix}").text
            for suffix in ("", "/messages", "/context", "/grep?pattern=lantern%7Ckestrel%7Cdiagnosis")
        ]
        views.append(
            client.get(f"/lcm/conversations/{conversation}/grep?pattern=diagnosis+cabinet&mode=full_text").text
        )
    config = tmp_path / "proxy.yaml"
    config.write_text(yaml.safe_dump(proxy.config.model_dump(mode="json")))
    for args in (
        ["grep", "lantern|kestrel|diagnosis", "--conversation", conversation],
        ["grep", "diagnosis cabinet", "--conversation", conversation, "--mode", "full_text"],
        ["show", conversation],
    ):
        done = main(*args, "--config", str(config))
        assert done.returncode == 0, done.stderr
        views.append(done.stdout)
    return "\n".join(views)


def assert_alice_still_sees_her_own(proxy: RunningProxy, alice: Alice) -> None:
    # The probes above can find the fact where it is visible: Alice's own conversation still answers them.
    grep = httpx.get(f"{proxy.url}/lcm/conversations/{alice.conversation}/grep?pattern=lanternfish", timeout=30)
    assert PRIVATE in grep.json()["result"]


def test_a_conversation_that_opens_alike_sees_only_the_greeting(
    world: tuple[RunningProxy, Alice, ToolModel], fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    proxy, alice, model = world
    # Bob's first request is only the greeting: a prefix of Alice's conversation, served as a re-send of it.
    first_id, shown = bob_turn(proxy, fake_upstream, model, alice, [GREETING])
    assert_private(shown)
    bob_reply = {"role": "assistant", "content": "Hey there, what's up?"}
    bob_id, shown = bob_turn(
        proxy, fake_upstream, model, alice, [GREETING, bob_reply, {"role": "user", "content": "What did I tell you?"}]
    )
    assert_private(shown)
    assert bob_id != alice.conversation
    assert_private(admin_and_cli_views(proxy, bob_id, tmp_path))
    assert_alice_still_sees_her_own(proxy, alice)
    assert first_id == alice.conversation  # the greeting alone is Alice's prefix, yet showed nothing beyond it


def test_a_conversation_that_copies_the_first_reply_too_sees_no_more(
    world: tuple[RunningProxy, Alice, ToolModel], fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    proxy, alice, model = world
    messages = [GREETING, ALICE_REPLY, {"role": "user", "content": "Remind me what I said."}]
    bob_id, shown = bob_turn(proxy, fake_upstream, model, alice, messages)
    assert_private(shown)
    view = httpx.get(f"{proxy.url}/lcm/conversations/{bob_id}", timeout=30).json()
    assert (view["parent_id"], view["fork_seq"]) == (alice.conversation, 2)  # a fork, sharing two messages
    assert_private(admin_and_cli_views(proxy, bob_id, tmp_path))
    assert_alice_still_sees_her_own(proxy, alice)


def test_another_conversations_id_with_a_different_transcript_sees_nothing_of_it(
    world: tuple[RunningProxy, Alice, ToolModel], fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    proxy, alice, model = world
    messages = [{"role": "user", "content": "Good morning, what is on my list?"}]
    bob_id, shown = bob_turn(
        proxy, fake_upstream, model, alice, messages, **{"x-lcm-conversation-id": alice.conversation}
    )
    assert_private(shown)
    view = httpx.get(f"{proxy.url}/lcm/conversations/{bob_id}", timeout=30).json()
    assert bob_id != alice.conversation and view["parent_id"] is None  # nothing shared: no lineage at all
    assert_private(admin_and_cli_views(proxy, bob_id, tmp_path))
    assert_alice_still_sees_her_own(proxy, alice)


def test_an_issued_id_always_names_its_conversation(
    world: tuple[RunningProxy, Alice, ToolModel], fake_upstream: FakeUpstream
) -> None:
    proxy, alice, model = world
    model.plan = []
    header = {"x-lcm-conversation-id": alice.conversation}
    # Someone sends Alice's id with an unrelated transcript: that makes a conversation of its own ...
    other = post(proxy, [{"role": "user", "content": "Unrelated chat"}], **header).headers["x-lcm-conversation-id"]
    assert other != alice.conversation
    # ... and the id still names Alice's: her next turn continues her conversation, not a fork of the other.
    history = [
        *alice_history(),
        {"role": "assistant", "content": "You're welcome."},
        {"role": "user", "content": "One more thing."},
    ]
    response = post(proxy, history, **header)
    assert response.headers["x-lcm-conversation-id"] == alice.conversation
    view = httpx.get(f"{proxy.url}/lcm/conversations/{alice.conversation}", timeout=30).json()
    # Her history and the answer the proxy relayed for it (her own version of the previous answer replaced
    # the one relayed before, in place).
    assert view["message_count"] == len(history) + 1 and view["parent_id"] is None
    # A client that keeps echoing the id it first got after editing history continues its one fork.
    edited = [GREETING, {"role": "assistant", "content": "Hello, edited."}, {"role": "user", "content": "Go on."}]
    fork = post(proxy, edited, **header).headers["x-lcm-conversation-id"]
    assert fork not in (alice.conversation, other)
    longer = [*edited, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "And then?"}]
    assert post(proxy, longer, **header).headers["x-lcm-conversation-id"] == fork
    listed = httpx.get(f"{proxy.url}/lcm/conversations", timeout=30).json()["data"]
    assert sorted(c["id"] for c in listed) == sorted({alice.conversation, other, fork})


def test_the_same_document_under_another_name_shows_none_of_the_first_upload(
    proxy_factory: Any, fake_upstream: FakeUpstream
) -> None:
    # Stored bytes are shared within a tenant, but a file's name and exploration summary belong to the upload:
    # Bob's copy of the same rows must not show him the name Alice gave them.
    proxy = proxy_factory(LCM)
    model = ToolModel()
    fake_upstream.responder = model
    document = "".join(f"row {i}: quarterly figures line {i} cabinet\n" for i in range(40))
    alice_name = "alice_smith_test_results.txt"
    post(proxy, [{"role": "user", "content": f'<file name="{alice_name}">{document}</file>'}])
    model.plan = [("lcm_grep", {"pattern": "cabinet", "scope": "files"})]
    before = len(fake_upstream.requests)
    bob = [
        {"role": "user", "content": "Bob here, my notes:"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": f'<file name="bob_notes.txt">{document}</file>'},
    ]
    bob_id = post(proxy, bob).headers["x-lcm-conversation-id"]
    shown = [*model.results.values(), *(json.dumps(r.body) for r in fake_upstream.requests[before:])]
    assert "bob_notes.txt" in "\n".join(model.results.values())  # the grep found Bob's own file ...
    assert alice_name not in "\n".join(shown)  # ... under his name, and nothing forwarded names hers
    messages = httpx.get(f"{proxy.url}/lcm/conversations/{bob_id}/messages", timeout=30).json()["data"]
    (file_id,) = {f for m in messages for f in m["files"]}
    record = httpx.get(f"{proxy.url}/lcm/files/{file_id}", timeout=30).json()
    assert (record["name"], record["conversation_id"]) == ("bob_notes.txt", bob_id)
