"""Admin API (/lcm/...) and operator commands: tenant-scoped views, doctor on healthy and broken databases.
The proxy and the commands run in this process: the socket and the process prove nothing more here."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.cli.doctor import run_doctor
from proxy.store.location import Location
from tests.support.cli import main
from tests.support.engine import execute, rows
from tests.support.fakes import FakeUpstream
from tests.support.proxies import AppProxy
from tests.support.sim import ScriptedModel
from tests.support.transcripts import long_history

ALICE = {"authorization": "Bearer sk-alice-0000000"}
BOB = {"authorization": "Bearer sk-bob-11111111"}
KEYS = [{"key": "sk-alice-0000000", "tenant": "alice"}, {"key": "sk-bob-11111111", "tenant": "bob"}]


def start(app_factory: Any, upstream_url: str, where: Location) -> Any:
    model = {
        "model_name": "small",
        "litellm_params": {"model": "openai/small", "api_base": f"{upstream_url}/v1", "api_key": "k-12345678"},
        "model_info": {"max_input_tokens": 8000},
    }
    lcm = {
        "fresh_tail_count": 6,
        "leaf_chunk_tokens": 1500,
        "leaf_target_tokens": 150,
        "large_file_token_threshold": 2500,
        "tool_result_token_threshold": 300,
        # The fake upstream is on loopback, which the proxy takes for a one-slot local server and summarises for
        # between turns; these tests read the summaries a first turn makes inline, as for a hosted upstream.
        "background_yields": "never",
    }
    return app_factory(lcm=lcm, models=[model], api_keys=KEYS, where=where)


def test_admin_api_is_tenant_scoped(
    where: Location, app_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.responder = ScriptedModel()
    proxy = start(app_factory, upstream_url, where)
    history = long_history(60)
    history[1] = {"role": "user", "content": "Alice's private note: the vault PIN is 8812. " + history[1]["content"]}
    document = "".join(f"entry {i}: alpha beta gamma\n" for i in range(3000))
    history.append({"role": "assistant", "content": "ok"})
    history.append({"role": "user", "content": f'<file name="big.txt">{document}</file>'})
    client = proxy.client
    alice = client.post(
        "/v1/chat/completions", json={"model": "small", "messages": history, "max_tokens": 400}, headers=ALICE
    )
    assert alice.status_code == 200, alice.text
    conversation = alice.headers["x-lcm-conversation-id"]
    bob = client.post(
        "/v1/chat/completions",
        json={"model": "small", "messages": [{"role": "user", "content": "bob here"}]},
        headers=BOB,
    )
    bob_conversation = bob.headers["x-lcm-conversation-id"]

    listed = client.get("/lcm/conversations", headers=ALICE).json()["data"]
    assert [c["id"] for c in listed] == [conversation]
    assert [c["id"] for c in client.get("/lcm/conversations", headers=BOB).json()["data"]] == [bob_conversation]
    assert client.get("/lcm/conversations").status_code == 401

    detail = client.get(f"/lcm/conversations/{conversation}", headers=ALICE).json()
    # The messages after the system prompt, and the answer relayed for them.
    assert detail["message_count"] == len(history) - 1 + 1 and detail["context_summaries"]
    summary_id = detail["context_summaries"][0]
    context = client.get(f"/lcm/conversations/{conversation}/context", headers=ALICE).json()
    assert context["items"][0] == {
        "kind": "summary",
        "id": summary_id,
        "depth": context["items"][0]["depth"],
        "tokens": context["items"][0]["tokens"],
        "sent": True,
    }
    assert context["tokens"] == sum(i["tokens"] for i in context["items"] if i["sent"]) and context["tokens"] < 8000
    messages = client.get(f"/lcm/conversations/{conversation}/messages", headers=ALICE).json()["data"]
    # The last message the client sent holds the file; the answer relayed for it follows.
    assert len(messages) == len(history) and messages[-2]["files"] and messages[-1]["role"] == "assistant"
    file_id = messages[-2]["files"][0]
    summary = client.get(f"/lcm/summaries/{summary_id}", headers=ALICE).json()
    assert summary["id"] == summary_id and summary["kind"] in ("leaf", "condensed")
    described = client.get(f"/lcm/files/{file_id}?start_line=3&end_line=4", headers=ALICE).json()
    assert (
        described["name"] == "big.txt"
        and "entry 2: alpha beta gamma\nentry 3: alpha beta gamma" in described["described"]
    )
    assert "path" not in described
    grep = client.get(f"/lcm/conversations/{conversation}/grep", params={"pattern": "vault PIN"}, headers=ALICE).json()
    assert "8812" in grep["result"]
    compact = client.post(f"/lcm/conversations/{conversation}/compact", headers=ALICE)
    assert compact.status_code == 200 and "leaf_passes" in compact.json()

    # Bob sees none of it, on every route: not found, never forbidden (ids do not leak existence).
    for path in (
        f"/lcm/conversations/{conversation}",
        f"/lcm/conversations/{conversation}/messages",
        f"/lcm/conversations/{conversation}/context",
        f"/lcm/conversations/{conversation}/grep?pattern=PIN",
        f"/lcm/summaries/{summary_id}",
        f"/lcm/files/{file_id}",
    ):
        response = client.get(path, headers=BOB)
        assert response.status_code == 404, (path, response.text)
        assert "8812" not in response.text
    assert client.post(f"/lcm/conversations/{conversation}/compact", headers=BOB).status_code == 404
    missing = client.get(f"/lcm/conversations/{conversation}/grep", headers=ALICE)
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "missing_required_parameter"
    # A bad pattern or mode is the caller's error, not a 200 carrying the text meant for a model.
    for params, param in (({"pattern": "("}, "pattern"), ({"pattern": "x", "mode": "bogus"}, "mode")):
        bad = client.get(f"/lcm/conversations/{conversation}/grep", params=params, headers=ALICE)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text


def cli(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LCM_")}
    return main(*args, "--config", str(config), env=env)


def test_cli_grep_describe_doctor(
    where: Location, app_factory: Any, upstream_url: str, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.responder = ScriptedModel()
    proxy = start(app_factory, upstream_url, where)
    history = long_history(60)
    history[1] = {"role": "user", "content": "Remember the harbour code NAUTILUS-9. " + history[1]["content"]}
    response = proxy.client.post(
        f"{proxy.base_url}/chat/completions",
        json={"model": "small", "messages": history, "max_tokens": 400},
        headers=ALICE,
        timeout=60,
    )
    conversation = response.headers["x-lcm-conversation-id"]
    location = proxy.config.general_settings.location()
    config = tmp_path / "cli.yaml"
    database = f", database_url: '{location.database_url}'" if location.database_url else ""
    config.write_text(
        "model_list: [{model_name: small, litellm_params: {model: openai/small}}]\n"
        f"general_settings: {{data_dir: '{location.data_dir}'{database}}}\n"
    )

    grep = cli("grep", "NAUTILUS", "--conversation", conversation, config=config)
    assert grep.returncode == 0 and "NAUTILUS-9" in grep.stdout
    broken = cli("grep", "(", "--conversation", conversation, config=config)
    assert broken.returncode == 1 and "invalid regular expression" in broken.stderr and not broken.stdout
    msg_id = next(word for word in grep.stdout.split() if word.startswith("msg_"))
    described = cli("describe", msg_id, config=config)
    assert described.returncode == 0 and "Remember the harbour code NAUTILUS-9." in described.stdout
    summary_id = asyncio.run(_first_summary(location, conversation))
    described = cli("describe", summary_id, config=config)
    assert described.returncode == 0 and f"Summary {summary_id}" in described.stdout
    assert cli("describe", summary_id, "--tenant", "bob", config=config).returncode == 1

    healthy = cli("doctor", config=config)
    assert healthy.returncode == 0 and healthy.stdout.strip().endswith("OK")

    # Break a summary link: doctor must say what is wrong and exit 1.
    unlink = "DELETE FROM summary_sources WHERE summary_id = ? AND ordinal = 0"
    asyncio.run(change(location, [(unlink, (summary_id,))]))
    broken = cli("doctor", config=config)
    assert broken.returncode == 1
    assert f"{summary_id}" in broken.stdout and "problem(s)" in broken.stdout
    problems = asyncio.run(run_doctor(location))
    assert any(summary_id in p for p in problems)
    # Repair the link (the fixture runs doctor on every database at teardown), and doctor is happy again.
    relink = (
        "INSERT INTO summary_sources (summary_id, ordinal, message_id) SELECT s.id, 0, m.id FROM messages m"
        " JOIN summaries s ON s.conversation_id = m.conversation_id AND m.seq = s.start_seq WHERE s.id = ?"
    )
    asyncio.run(change(location, [(relink, (summary_id,))]))
    assert asyncio.run(run_doctor(location)) == []


def test_doctor_reports_a_deleted_file(
    where: Location, app_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.responder = ScriptedModel()
    proxy = start(app_factory, upstream_url, where)
    document = "".join(f"entry {i}: alpha beta gamma\n" for i in range(3000))
    proxy.client.post(
        f"{proxy.base_url}/chat/completions",
        json={"model": "small", "messages": [{"role": "user", "content": f'<file name="d.txt">{document}</file>'}]},
        headers=ALICE,
        timeout=60,
    )
    location = proxy.config.general_settings.location()
    if location.kind == "sqlite":
        stored = [p for p in (location.data_dir / "files").rglob("*") if p.is_file()]
        assert len(stored) == 1
        content = stored[0].read_bytes()
        stored[0].unlink()
    else:  # PostgreSQL keeps the content in lcm.blobs
        ((path, content),) = asyncio.run(change(location, [("DELETE FROM blobs RETURNING path, content", ())]))
    problems = asyncio.run(run_doctor(location))
    assert any("is missing" in p for p in problems)
    # Put it back (0600) so the fixture's doctor check passes.
    if location.kind == "sqlite":
        stored[0].write_bytes(content)
        os.chmod(stored[0], 0o600)
    else:
        asyncio.run(change(location, [("INSERT INTO blobs (path, content) VALUES (?, ?)", (path, content))]))
    assert asyncio.run(run_doctor(location)) == []


async def _first_summary(location: Location, conversation: str) -> str:
    store, _ = location.stores()
    await store.open()
    try:
        found = await rows(
            store,
            "SELECT id FROM summaries WHERE conversation_id = ? AND kind = 'leaf' ORDER BY pk LIMIT 1",
            (conversation,),
        )
        assert found
        return str(found[0][0])
    finally:
        await store.close()


async def change(location: Location, statements: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
    """Run ``statements`` on the database behind the running proxy's back, committed; rows the last returns."""
    store, _ = location.stores()
    await store.open()
    try:
        returned: list[Any] = []
        for sql, args in statements:
            returned = await execute(store, sql, args)
        return returned
    finally:
        await store.close()


@pytest.mark.parametrize("value", ["²", "٣", "-1", "1e3", "0x10", " 5", "99999999999999999999999"])
def test_integer_query_values_are_ascii_digits_in_range(module_app_proxy: AppProxy, value: str) -> None:
    """``str.isdigit`` accepts "²", which ``int`` refuses: every such value is a 400 naming the parameter."""
    proxy = module_app_proxy  # refused: nothing is stored
    response = proxy.client.get(f"{proxy.url}/lcm/conversations", params={"limit": value}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "limit"


def test_a_conversation_is_found_by_its_clients_own_key_within_the_tenant(
    where: Location, app_factory: Any, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    """The key a client sends in X-LCM-Conversation-Id names its conversation wherever an id is accepted,
    within the caller's tenant only."""
    fake_upstream.responder = ScriptedModel()
    proxy = start(app_factory, upstream_url, where)
    document = "".join(f"entry {i}: alpha beta gamma\n" for i in range(3000))
    ids = {}
    client = proxy.client
    for who, headers, text in ((ALICE, ALICE, f'<file name="a.txt">{document}</file>'), (BOB, BOB, "bob here")):
        response = client.post(
            "/v1/chat/completions",
            json={"model": "small", "messages": [{"role": "user", "content": text}]},
            headers={**headers, "x-lcm-conversation-id": "my-chat"},
        )
        assert response.status_code == 200, response.text
        ids[who["authorization"]] = response.headers["x-lcm-conversation-id"]
    alice_id, bob_id = ids[ALICE["authorization"]], ids[BOB["authorization"]]
    assert alice_id != bob_id
    for headers, expected in ((ALICE, alice_id), (BOB, bob_id)):
        detail = client.get("/lcm/conversations/my-chat", headers=headers)
        assert detail.status_code == 200 and detail.json()["id"] == expected, detail.text
        for suffix in ("messages", "context"):
            assert client.get(f"/lcm/conversations/my-chat/{suffix}", headers=headers).status_code == 200
    grep = client.get("/lcm/conversations/my-chat/grep", params={"pattern": "entry 2999"}, headers=ALICE)
    assert grep.status_code == 200 and grep.json()["conversation"] == alice_id
    assert client.get("/lcm/conversations/no-such-key", headers=ALICE).status_code == 404

    # A stored file's lines: an end before the start is the caller's error, naming end_line.
    file_id = client.get("/lcm/conversations/my-chat/messages", headers=ALICE).json()["data"][0]["files"][0]
    backwards = client.get(f"/lcm/files/{file_id}?start_line=10&end_line=5", headers=ALICE)
    assert backwards.status_code == 400 and backwards.json()["error"]["param"] == "end_line", backwards.text
    lines = client.get(f"/lcm/files/{file_id}?start_line=10&end_line=11", headers=ALICE).json()["described"]
    assert "Lines 10-11 of 3000" in lines and "entry 9: alpha" in lines and "entry 11:" not in lines
