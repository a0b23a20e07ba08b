"""Security review as tests: tenant isolation on every route and recall tool, private file modes, path
validation, no key in any log or error, and request size limits.

Two tenants share one proxy. Alice has a compacted conversation with a summary, a stored file and a secret in
her messages; Bob holds a valid key of his own and tries to reach her data by every door there is. Routes are
enumerated from the application itself, so a new route without a probe here fails the test suite.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sqlite3
import stat
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from proxy.app import create_app
from proxy.cli.doctor import run_doctor
from proxy.relay.toolloop import MAX_CALLS_PER_ROUND
from proxy.store.files import FileStore
from proxy.store.location import Location
from proxy.store.records import LedgerItem
from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import UPSTREAM_KEY, RunningProxy, make_config
from tests.support.servers import serve_in_thread
from tests.support.tool_model import ToolModel, is_summary_request

REPO = Path(__file__).resolve().parent.parent
ALICE_KEY = "sk-proxy-alice-5e1f0c2d"
BOB_KEY = "sk-proxy-bob-9a8b7c6d"
KEYS = [{"key": ALICE_KEY, "tenant": "alice"}, {"key": BOB_KEY, "tenant": "bob"}]
ALICE = {"authorization": f"Bearer {ALICE_KEY}"}
BOB = {"authorization": f"Bearer {BOB_KEY}"}
ALICE_CONVERSATION_KEY = "project-heron"  # Alice names her conversation with X-LCM-Conversation-Id

SECRET = "alice_secret_7f3a91"  # in Alice's messages and (through the summarizer) in her summary
FILE_SECRET = "alice_file_secret_c4e2"  # in Alice's stored file (and its exploration summary)
LEDGER_ITEM = "led_a11ce0000000beef"  # Alice's standing instruction, which holds SECRET
OUTSIDE_SECRET = "OUTSIDE-THE-DATA-DIR-0d9e8f"  # planted next to the data dir; must never be served

LCM = {
    "retrieval_tools": "always",  # the recall tools are offered on every request, so Bob can call them too
    "fresh_tail_count": 2,
    "large_file_token_threshold": 100,
    "tool_result_token_threshold": 50,
}


# --- a scripted model: summaries, and recall calls chosen by the test ------------------------------------


def chat_bodies(fake: FakeUpstream) -> list[dict[str, Any]]:
    return [r.body for r in fake.requests if not is_summary_request(r.body)]


def post_chat(url: str, messages: list[dict[str, Any]], headers: dict[str, str], **extra: Any) -> httpx.Response:
    body = {"model": "test-model", "messages": messages, **extra}
    if extra.get("stream"):
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30) as response:
            response.read()
            return response
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def assert_openai_error(response: httpx.Response, status: int | None = None) -> dict[str, Any]:
    if status is not None:
        assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error  # type: ignore[no-any-return]


# --- Alice's data ------------------------------------------------------------------------------------------


def alice_history() -> list[dict[str, Any]]:
    document = "".join(f"line {i}: {FILE_SECRET} opens the north vault door\n" for i in range(40))
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": f"{SECRET} is the vault code. Keep it between us, it is private."},
        {"role": "assistant", "content": "Understood, I will keep it private."},
    ]
    for i in range(4):
        out.append({"role": "user", "content": f"Question {i}: " + "tell me about the vault design. " * 6})
        out.append({"role": "assistant", "content": f"Answer {i}: " + "the vault has layers of doors. " * 6})
    out.append({"role": "user", "content": f'<file name="vault.txt">{document}</file>'})
    out.append({"role": "assistant", "content": "I have read the file."})
    out.append({"role": "user", "content": "Thanks."})
    return out


@dataclass
class Seeded:
    conversation: str
    summary: str
    message: str  # msg_… of the message that holds SECRET
    file: str
    history: list[dict[str, Any]]

    def leaks(self) -> list[str]:
        """Strings that may appear in no answer given to another tenant."""
        return [SECRET, FILE_SECRET, self.conversation, self.summary, self.message, self.file]


def seed_alice(url: str, fake: FakeUpstream, model: ToolModel) -> Seeded:
    fake.responder = model
    history = alice_history()
    with httpx.Client(base_url=url, headers=ALICE, timeout=30) as client:
        response = client.post(
            "/v1/chat/completions",
            json={"model": "test-model", "messages": history},
            headers={"x-lcm-conversation-id": ALICE_CONVERSATION_KEY},
        )
        assert response.status_code == 200, response.text
        conversation = response.headers["x-lcm-conversation-id"]
        compacted = client.post(f"/lcm/conversations/{conversation}/compact")
        assert compacted.status_code == 200 and compacted.json()["leaf_passes"] >= 1, compacted.text
        summary = client.get(f"/lcm/conversations/{conversation}").json()["context_summaries"][0]
        messages = client.get(f"/lcm/conversations/{conversation}/messages").json()["data"]
    message = next(m["id"] for m in messages if SECRET in json.dumps(m["message"]))
    file_id = next(f for m in messages for f in m["files"])
    return Seeded(conversation, summary, message, file_id, history)


async def plant_ledger(location: Location, alice: Seeded) -> None:
    """A standing instruction of Alice's that holds SECRET, stored as ingest stores one."""
    store, _ = location.stores()
    await store.open()
    try:
        source = (await store.read.messages_by_id([int(alice.message.removeprefix("msg_"))]))[0]
        item = LedgerItem(LEDGER_ITEM, alice.conversation, "rule", "vault code", SECRET, f"{SECRET} is the vault code.",
                          source.seq, source.id, "user", 1.0)  # fmt: skip
        async with store.write() as tx:
            await tx.add_ledger_items([item])
    finally:
        await store.close()


@dataclass
class World:
    proxy: RunningProxy
    alice: Seeded
    model: ToolModel
    data_dir: Path
    outside_secret: Path


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(
    request: pytest.FixtureRequest,
    fake_upstream_server: tuple[FakeUpstream, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    """One proxy with two tenants, shared by the isolation tests (Bob's requests never change Alice's data), on
    each store."""
    fake, upstream_url = fake_upstream_server
    base = tmp_path_factory.mktemp("world")
    secret = base / "secret.txt"
    secret.write_text(OUTSIDE_SECRET)
    general: dict[str, Any] = {"api_keys": KEYS}
    if request.param == "postgresql":
        general["database_url"] = request.getfixturevalue("pg_cluster").create_database(f"world_{base.name}")
    location = Location(base / "data", general.get("database_url"))
    config = make_config(upstream_url, base / "data", LCM, **general)
    app = create_app(config)
    with serve_in_thread(app) as url:
        model = ToolModel()
        fake.script.clear()
        alice = seed_alice(url, fake, model)
        asyncio.run(plant_ledger(location, alice))
        fake.responder = None
        yield World(RunningProxy(url, config, app), alice, model, base / "data", secret)
    assert asyncio.run(run_doctor(location)) == []


def use_model(world: World, fake: FakeUpstream, plan: list[tuple[str, dict[str, Any]]] | None = None) -> ToolModel:
    world.model.plan = plan or []
    world.model.results.clear()
    fake.responder = world.model
    return world.model


def run_plan(
    world: World,
    fake: FakeUpstream,
    plan: list[tuple[str, dict[str, Any]]],
    messages: list[dict[str, Any]],
    headers: dict[str, str],
) -> list[str]:
    """The plan's recall calls, in turns of at most MAX_CALLS_PER_ROUND (calls past it are not run); their results."""
    results: list[str] = []
    for start in range(0, len(plan), MAX_CALLS_PER_ROUND):
        model = use_model(world, fake, plan[start : start + MAX_CALLS_PER_ROUND])
        response = post_chat(world.proxy.url, messages, headers)
        assert response.status_code == 200, response.text
        for leak in world.alice.leaks() if headers.get("authorization") != ALICE["authorization"] else []:
            assert leak not in response.text
        results += [model.result(i) for i in range(len(model.plan))]
    return results


def as_alice(world: World, path: str) -> dict[str, Any]:
    response = httpx.get(f"{world.proxy.url}{path}", headers=ALICE, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


# --- 1. tenant isolation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("foreign", ["conversation-id", "conversation-key"])
def test_chat_with_another_tenants_conversation_id_does_not_attach(
    world: World, fake_upstream: FakeUpstream, foreign: str, stream: bool
) -> None:
    use_model(world, fake_upstream)
    alice_before = as_alice(world, f"/lcm/conversations/{world.alice.conversation}")
    header = world.alice.conversation if foreign == "conversation-id" else ALICE_CONVERSATION_KEY
    messages = [{"role": "user", "content": "Continue our conversation: what is the vault code?"}]
    response = post_chat(world.proxy.url, messages, {**BOB, "x-lcm-conversation-id": header}, stream=stream)
    assert response.status_code == 200, response.text
    bob_conversation = response.headers["x-lcm-conversation-id"]
    assert bob_conversation != world.alice.conversation
    # Upstream got exactly Bob's message: no summary, stub or message of Alice's was assembled into it.
    forwarded = chat_bodies(fake_upstream)
    assert [body["messages"] for body in forwarded] == [messages]
    for leak in world.alice.leaks():
        assert leak not in json.dumps(forwarded) and leak not in response.text
    assert as_alice(world, f"/lcm/conversations/{world.alice.conversation}") == alice_before
    bob_view = httpx.get(f"{world.proxy.url}/lcm/conversations/{bob_conversation}", headers=BOB, timeout=30).json()
    # A conversation of his own: not a fork of Alice's (a parent link would put hers in his lineage).
    # His message and the answer relayed for it.
    assert bob_view["message_count"] == 2 and bob_view["context_summaries"] == []
    assert bob_view["parent_id"] is None and bob_view["fork_seq"] is None


def test_replaying_another_tenants_transcript_starts_a_separate_conversation(
    world: World, fake_upstream: FakeUpstream
) -> None:
    # Bob knows Alice's transcript word for word: identity is tenant-seeded, so he gets his own conversation
    # and none of her summaries or stored files.
    use_model(world, fake_upstream)
    alice_before = as_alice(world, f"/lcm/conversations/{world.alice.conversation}")
    response = post_chat(world.proxy.url, world.alice.history, BOB)
    assert response.status_code == 200, response.text
    assert response.headers["x-lcm-conversation-id"] != world.alice.conversation
    forwarded = json.dumps([body["messages"] for body in chat_bodies(fake_upstream)])
    assert "<summary" not in forwarded and "[LCM File: file_" in forwarded  # Bob's own stub, not Alice's
    for alice_id in (world.alice.summary, world.alice.file, world.alice.message):
        assert alice_id not in forwarded and alice_id not in response.text
    assert as_alice(world, f"/lcm/conversations/{world.alice.conversation}") == alice_before


def app_routes(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every route the application serves (HEAD is implied by GET)."""
    return sorted(
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route)
        for method in (route.methods or set()) - {"HEAD"}
    )


def admin_probes(alice: Seeded) -> dict[tuple[str, str], tuple[str, str]]:
    """Every /lcm/ route -> (a request for Alice's data, something Alice herself finds in the answer)."""
    c = alice.conversation
    return {
        ("GET", "/lcm/conversations"): ("/lcm/conversations", c),
        ("GET", "/lcm/conversations/{id}"): (f"/lcm/conversations/{c}", alice.summary),
        ("GET", "/lcm/conversations/{id}/messages"): (f"/lcm/conversations/{c}/messages", SECRET),
        ("GET", "/lcm/conversations/{id}/context"): (f"/lcm/conversations/{c}/context", alice.summary),
        ("GET", "/lcm/conversations/{id}/grep"): (f"/lcm/conversations/{c}/grep?pattern=secret_%5Cw%2B", SECRET),
        ("POST", "/lcm/conversations/{id}/compact"): (f"/lcm/conversations/{c}/compact", c),
        ("GET", "/lcm/conversations/{id}/ledger"): (f"/lcm/conversations/{c}/ledger?all=true", SECRET),
        ("POST", "/lcm/conversations/{id}/ledger/{item}"): (f"/lcm/conversations/{c}/ledger/{LEDGER_ITEM}", SECRET),
        ("GET", "/lcm/summaries/{id}"): (f"/lcm/summaries/{alice.summary}", SECRET),
        ("GET", "/lcm/files/{id}"): (f"/lcm/files/{alice.file}", FILE_SECRET),
        ("DELETE", "/lcm/conversations/{id}"): (f"/lcm/conversations/{c}", alice.summary),
        ("GET", "/lcm/scrub"): ("/lcm/scrub", "done"),  # the caller's own deletions only
    }


PROBE_BODIES = {("POST", "/lcm/conversations/{id}/ledger/{item}"): {"state": "active"}}  # as Alice set it
CONFIGURATION_VIEWS = {("GET", "/lcm/models")}  # the proxy's models and their windows: no tenant's data


def test_the_models_view_needs_a_key_and_names_no_upstream_credential(world: World) -> None:
    assert assert_openai_error(httpx.get(f"{world.proxy.url}/lcm/models", timeout=30), 401)
    view = httpx.get(f"{world.proxy.url}/lcm/models", headers=BOB, timeout=30)
    assert view.status_code == 200 and view.json()["data"]
    assert UPSTREAM_KEY not in view.text and "api_base" not in view.text


def test_every_admin_route_hides_other_tenants_data(world: World, fake_upstream: FakeUpstream) -> None:
    use_model(world, fake_upstream)
    probes = admin_probes(world.alice)
    served = {(m, p) for m, p in app_routes(world.proxy.app) if p.startswith("/lcm/")} - CONFIGURATION_VIEWS
    assert served == set(probes), f"admin routes without an isolation probe: {served - set(probes)}"
    with httpx.Client(base_url=world.proxy.url, timeout=30) as client:
        for (method, template), (path, alice_sees) in sorted(probes.items()):
            body = PROBE_BODIES.get((method, template))
            bob = client.request(method, path, headers=BOB, json=body)
            if template == "/lcm/conversations":
                assert bob.status_code == 200, bob.text  # Bob's own (possibly empty) list
                assert world.alice.conversation not in [c["id"] for c in bob.json()["data"]]
            elif template == "/lcm/scrub":
                assert bob.json() == {"scrub": "done"}, bob.text  # Bob's own deletions: none
            else:
                # Not found, never forbidden: another tenant's id is indistinguishable from an unknown one.
                assert assert_openai_error(bob, 404)["code"] == "not_found", (template, bob.text)
            for leak in world.alice.leaks():
                # Ids Bob sent may be named back: in a 404's message, or as the conversation key he once used.
                sent_by_bob = leak in path or (template == "/lcm/conversations" and leak == world.alice.conversation)
                if not sent_by_bob:
                    assert leak not in bob.text, (template, leak, bob.text)
            if method == "DELETE":
                # Bob's attempt changed nothing (Alice deleting her own: test_deletion.py; here it would take
                # her data from the other probes).
                assert alice_sees in client.get(path, headers=ALICE).text
                continue
            # The same request with Alice's key does reach her data: the probe above was not vacuous.
            alice = client.request(method, path, headers=ALICE, json=body)
            assert alice.status_code == 200 and alice_sees in alice.text, (template, alice.text)


BAD_CREDENTIALS = {
    "missing": ({}, "missing_api_key"),
    "wrong-bearer": ({"authorization": "Bearer sk-proxy-guess-00000000"}, "invalid_api_key"),
    "near-miss": ({"authorization": f"Bearer {ALICE_KEY}x"}, "invalid_api_key"),
    "prefix": ({"authorization": f"Bearer {ALICE_KEY[:-1]}"}, "invalid_api_key"),
    "wrong-x-api-key": ({"x-api-key": "sk-proxy-guess-00000000"}, "invalid_api_key"),
    "basic": ({"authorization": "Basic " + BOB_KEY}, "missing_api_key"),
    "empty-bearer": ({"authorization": "Bearer"}, "missing_api_key"),
}


@pytest.mark.parametrize("credentials", list(BAD_CREDENTIALS))
def test_every_route_but_healthz_requires_a_valid_key(
    world: World, fake_upstream: FakeUpstream, credentials: str
) -> None:
    headers, code = BAD_CREDENTIALS[credentials]
    routes = app_routes(world.proxy.app)
    assert ("GET", "/healthz") in routes and len(routes) > 1
    with httpx.Client(base_url=world.proxy.url, timeout=30) as client:
        for method, template in routes:
            if template == "/healthz":
                continue
            path = template.replace("{id}", world.alice.conversation)
            body = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
            response = client.request(method, path, headers=headers, json=body if method == "POST" else None)
            if template.startswith("/v1/messages") or template == "/api/hello":  # Anthropic's error shape
                assert response.status_code == 401, template
                if method != "HEAD":
                    error = response.json()["error"]
                    assert response.json()["type"] == "error" and error["type"] == "authentication_error", error
            else:
                error = assert_openai_error(response, 401)
                assert error["type"] == "authentication_error" and error["code"] == code, (template, error)
            assert response.headers["x-should-retry"] == "false"
            presented = headers.get("authorization", headers.get("x-api-key", "")).partition(" ")[2] or "-"
            for secret in (presented, ALICE_KEY, BOB_KEY, *world.alice.leaks()):
                assert secret not in response.text, (template, secret)
    assert fake_upstream.requests == []


def test_recall_tools_cannot_reach_another_tenants_ids(world: World, fake_upstream: FakeUpstream) -> None:
    alice = world.alice
    plan: list[tuple[str, dict[str, Any]]] = [
        ("lcm_describe", {"id": alice.summary}),
        ("lcm_describe", {"id": alice.file}),
        ("lcm_describe", {"id": alice.message}),
        ("lcm_expand", {"id": alice.summary}),
        ("lcm_expand_query", {"prompt": "What is the vault code?", "ids": [alice.summary]}),
        ("lcm_expand_query", {"prompt": "What is the vault code?", "query": "vault code private"}),
        ("lcm_grep", {"pattern": r"secret_\w+"}),
        ("lcm_grep", {"pattern": "vault code", "mode": "full_text", "scope": "all"}),
        ("lcm_grep", {"pattern": "north vault door", "scope": "files"}),
    ]
    # Alice, in her own conversation, gets her data back with these very calls (the probes are real).
    alice_headers = {**ALICE, "x-lcm-conversation-id": ALICE_CONVERSATION_KEY}
    found_by_alice = run_plan(world, fake_upstream, plan, alice.history, alice_headers)
    expected = [SECRET, FILE_SECRET, SECRET, SECRET, SECRET, SECRET, SECRET, SECRET, FILE_SECRET]
    for index, found in enumerate(expected):
        assert found in found_by_alice[index], (plan[index], found_by_alice[index])

    # Bob, in a conversation of his own, gets an error or nothing for every one of them.
    found_by_bob = run_plan(world, fake_upstream, plan, [{"role": "user", "content": "Do you remember anything?"}], BOB)
    assert len(found_by_bob) == len(plan)
    for (name, args), result in zip(plan, found_by_bob, strict=True):
        assert re.match(r"Error: |No matches|No summaries match", result), (name, args, result)
        asked = json.dumps(args)
        for leak in alice.leaks():
            if leak not in asked:
                assert leak not in result, (name, args, result)


# --- 2. file permissions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("existing_dir", [False, True], ids=["new-dir", "existing-0777-dir"])
@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_data_is_private_under_a_permissive_umask(
    proxy_factory: Any, fake_upstream: FakeUpstream, tmp_path: Path, umask: int, existing_dir: bool
) -> None:
    fake_upstream.responder = ToolModel()
    data_dir = tmp_path / "data0"  # where proxy_factory puts its first proxy's data
    previous = os.umask(umask)
    try:
        if existing_dir:
            data_dir.mkdir()
            data_dir.chmod(0o777)
        proxy = proxy_factory(lcm=LCM)
        history = alice_history()
        assert post_chat(proxy.url, history, {}).status_code == 200  # a file is stored while the server runs
        assert post_chat(proxy.url, [*history, {"role": "user", "content": "more"}], {}).status_code == 200
    finally:
        os.umask(previous)
    modes = {
        path.relative_to(data_dir).as_posix(): stat.S_IMODE(path.lstat().st_mode)
        for path in [data_dir, *data_dir.rglob("*")]
    }
    assert {"lcm.sqlite3", "lcm.sqlite3-wal", "lcm.sqlite3-shm"} <= set(modes), modes
    stored = [p for p in modes if p.startswith("files/") and (data_dir / p).is_file()]
    assert stored and not [p for p in stored if ".tmp-" in p], modes
    for relative, mode in modes.items():
        expected = 0o700 if (data_dir / relative).is_dir() else 0o600
        assert mode == expected, f"{relative}: {oct(mode)}, expected {oct(expected)}"


# --- 3. path validation ------------------------------------------------------------------------------------


def raw_request(url: str, method: str, target: str, headers: dict[str, str], timeout: float = 30) -> tuple[int, bytes]:
    """Send ``target`` byte for byte (httpx and http.client normalise or refuse dot segments)."""
    parsed = urllib.parse.urlsplit(url)
    assert parsed.hostname is not None and parsed.port is not None
    lines = [f"{method} {target} HTTP/1.1", f"host: {parsed.netloc}", "connection: close"]
    lines += [f"{k}: {v}" for k, v in {"content-length": "0", **headers}.items()]
    with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def traversal_ids(secret: Path, data_dir: Path) -> dict[str, str]:
    """Hostile ids as they appear in a request target (already URL-encoded where a client would encode)."""
    relative = os.path.relpath(secret, data_dir / "files")
    quoted = urllib.parse.quote
    return {
        "dot-segments": "../../" + relative,
        "encoded-slashes": quoted(relative, safe=""),
        "encoded-dots": relative.replace(".", "%2e").replace("/", "%2f"),
        "double-encoded": quoted(quoted(relative, safe=""), safe=""),
        "absolute": quoted(str(secret), safe=""),
        "nul-byte": "file_0123456789abcdef%00" + quoted(relative, safe=""),
        "nul-only": "file_0123456789abcdef%00",
        "dot-dot": "..",
        "encoded-dot-dot": "%2e%2e",
        "backslashes": quoted(relative.replace("/", "\\"), safe=""),
        "id-prefixed": "file_" + quoted(relative, safe=""),
        "sum-prefixed": "sum_..%2f..%2f" + quoted(relative, safe=""),
    }


TRAVERSAL_NAMES = list(traversal_ids(Path("/tmp/x/secret.txt"), Path("/tmp/x/data")))


@pytest.mark.parametrize("name", TRAVERSAL_NAMES)
def test_admin_routes_refuse_traversal_ids(world: World, fake_upstream: FakeUpstream, name: str) -> None:
    evil = traversal_ids(world.outside_secret, world.data_dir)[name]
    templates = [(m, p) for m, p in app_routes(world.proxy.app) if "{id}" in p]
    assert len(templates) >= 7
    for method, template in templates:
        target = template.replace("{id}", evil) + "?pattern=vault&start_line=1"
        status, body = raw_request(world.proxy.url, method, target, ALICE)
        assert 400 <= status < 500, (target, status, body)
        error = json.loads(body)["error"]
        assert error["type"] == "invalid_request_error" and error["message"], (target, body)
        assert OUTSIDE_SECRET.encode() not in body and b"Traceback" not in body
    assert fake_upstream.requests == []


@pytest.mark.parametrize(
    "query",
    ["start_line=..%2F..%2Fsecret.txt", "end_line=%2Fetc%2Fpasswd", "start_line=1%00", "start_line=-1", "end_line=1e9"],
)
def test_admin_file_route_refuses_bad_line_parameters(world: World, query: str) -> None:
    status, body = raw_request(world.proxy.url, "GET", f"/lcm/files/{world.alice.file}?{query}", ALICE)
    assert status == 400, body
    assert json.loads(body)["error"]["param"] in ("start_line", "end_line")
    assert OUTSIDE_SECRET.encode() not in body


def test_recall_tools_refuse_traversal_ids(world: World, fake_upstream: FakeUpstream) -> None:
    secret = str(world.outside_secret)
    relative = os.path.relpath(secret, world.data_dir / "files")
    hostile = [
        "../../" + relative,
        relative,
        secret,
        "file:" + secret,
        "file_0123456789abcdef/../../" + relative,
        "file_0123456789abcdef\x00../" + relative,
        "file_" + urllib.parse.quote("../../" + relative, safe=""),
        "sum_../../" + relative,
        "msg_1/../../" + relative,
        " file_0123456789abcdef\n" + secret,
    ]
    plan: list[tuple[str, dict[str, Any]]] = [("lcm_describe", {"id": h}) for h in hostile]
    plan += [("lcm_expand", {"id": h}) for h in hostile]
    plan += [("lcm_expand_query", {"prompt": "read it", "ids": hostile})]
    plan += [("lcm_grep", {"pattern": OUTSIDE_SECRET, "scope": scope}) for scope in ("all", "files")]
    plan += [("lcm_grep", {"pattern": secret, "scope": "files"})]
    headers = {**ALICE, "x-lcm-conversation-id": ALICE_CONVERSATION_KEY}
    results = run_plan(world, fake_upstream, plan, world.alice.history, headers)
    assert len(results) == len(plan)
    for (name, args), result in zip(plan, results, strict=True):
        assert re.match(r"Error: |No matches", result), (name, args, result)
        if name != "lcm_grep":  # grep repeats its pattern; the others must say the id is refused
            assert "'id' must be" in result or "no summary" in result, (name, args, result)
        if OUTSIDE_SECRET in result:  # only where the model typed it: grep repeats its pattern
            assert name == "lcm_grep" and result.startswith("No matches"), result


TAMPERED = [
    "parent-of-data-dir",
    "absolute",
    "dot-dot-from-files",
    "database-file",
    "nul-byte",
    "symlink",
    "linked-dir",
]


def tamper_with(tamper: str, db: Path, file_id: str, outside: Path) -> Callable[[], None]:
    """Point Alice's stored file somewhere else; return the function that undoes it."""
    original = _file_path(db, file_id)
    stored = db.parent / original
    paths = {
        "parent-of-data-dir": "../secret.txt",
        "absolute": str(outside),
        "dot-dot-from-files": "files/../../secret.txt",
        "database-file": "files/../lcm.sqlite3",
        "nul-byte": original + "\x00../../secret.txt",
    }
    if tamper in paths:
        _set_file_path(db, file_id, paths[tamper])
        return lambda: _set_file_path(db, file_id, original)
    if tamper == "symlink":
        content = stored.read_bytes()
        stored.unlink()
        stored.symlink_to(outside)

        def restore_file() -> None:
            stored.unlink()
            stored.write_bytes(content)
            stored.chmod(0o600)

        return restore_file
    # The file's folder becomes a symlink to a folder outside the data dir that holds a same-named file.
    elsewhere = outside.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / stored.name).write_text(OUTSIDE_SECRET)
    real = stored.parent.with_name(stored.parent.name + ".real")
    stored.parent.rename(real)
    stored.parent.symlink_to(elsewhere, target_is_directory=True)

    def restore_folder() -> None:
        stored.parent.unlink()
        real.rename(stored.parent)

    return restore_folder


@pytest.mark.parametrize("tamper", TAMPERED)
def test_tampered_file_paths_never_leave_the_files_root(
    proxy_factory: Any, fake_upstream: FakeUpstream, tmp_path: Path, tamper: str
) -> None:
    """A database is not trusted to be untampered: a stored path that points elsewhere is refused."""
    model = ToolModel()
    fake_upstream.responder = model
    outside = tmp_path / "secret.txt"
    outside.write_text(OUTSIDE_SECRET + "\n")
    proxy = proxy_factory(lcm=LCM)
    history = alice_history()
    assert post_chat(proxy.url, history, {}).status_code == 200
    conversation = httpx.get(f"{proxy.url}/lcm/conversations", timeout=30).json()["data"][0]["id"]
    messages = httpx.get(f"{proxy.url}/lcm/conversations/{conversation}/messages", timeout=30).json()["data"]
    file_id = next(f for m in messages for f in m["files"])
    data_dir = tmp_path / "data0"
    db = data_dir / "lcm.sqlite3"
    store = FileStore(data_dir)
    undo = tamper_with(tamper, db, file_id, outside)
    try:
        assert store.exists(_file_path(db, file_id)) is False
        admin = httpx.get(f"{proxy.url}/lcm/files/{file_id}", timeout=30)
        assert admin.status_code < 500 and OUTSIDE_SECRET not in admin.text, admin.text
        assert "SQLite format" not in admin.text
        assert "cannot be read" in admin.json()["described"], admin.text
        model.plan = [("lcm_describe", {"id": file_id}), ("lcm_grep", {"pattern": "vault|OUTSIDE", "scope": "files"})]
        response = post_chat(proxy.url, history, {})
        assert response.status_code == 200, response.text
        for index in range(2):
            assert model.result(index).startswith("Error: the content of"), model.result(index)
            assert OUTSIDE_SECRET not in model.result(index) and "SQLite format" not in model.result(index)
    finally:
        undo()
    assert store.read(_file_path(db, file_id)).count(FILE_SECRET.encode()) == 40  # restored for doctor


def _file_path(db: Path, file_id: str) -> str:
    with closing(sqlite3.connect(db)) as conn:
        return str(conn.execute("SELECT path FROM files WHERE id = ?", (file_id,)).fetchone()[0])


def _set_file_path(db: Path, file_id: str, path: str) -> None:
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE files SET path = ? WHERE id = ?", (path, file_id))


# --- 4. no key in logs or error messages -------------------------------------------------------------------

ECHO = f"Incorrect API key provided: {UPSTREAM_KEY}. You can find your API key at https://example.invalid."
ALL_KEYS = (UPSTREAM_KEY, ALICE_KEY, BOB_KEY)


def _failures(url: str, fake: FakeUpstream, model: ToolModel) -> list[tuple[str, httpx.Response, int | None]]:
    """Requests that fail in many ways: (what, response, expected status or None for any)."""
    hi = [{"role": "user", "content": "hi"}]
    out: list[tuple[str, httpx.Response, int | None]] = []
    fake.enqueue(Reply(status=401, error_message=ECHO, error_code="invalid_api_key"))
    out.append(("upstream 401 echoing the key", post_chat(url, hi, ALICE), 401))
    fake.enqueue(Reply(status=401, error_message=ECHO, error_code="invalid_api_key"))
    out.append(("streamed upstream 401 echoing the key", post_chat(url, hi, ALICE, stream=True), 401))
    fake.enqueue(Reply(status=500, raw_body=f"proxy_error: bad key {UPSTREAM_KEY}".encode()))
    out.append(("upstream 500 with a raw body echoing the key", post_chat(url, hi, ALICE), 500))
    fake.enqueue(Reply(status=429, error_message=f"rate limited for key {UPSTREAM_KEY}"))
    out.append(("upstream 429 echoing the key", post_chat(url, hi, ALICE), 429))
    chat = f"{url}/v1/chat/completions"
    out.append(
        ("connection refused", httpx.post(chat, json={"model": "unreachable", "messages": hi}, headers=ALICE), 502)
    )
    out.append(("bad JSON", httpx.post(chat, content=b"{nope", headers=ALICE), 400))
    out.append(("unknown model", httpx.post(chat, json={"model": "nope", "messages": hi}, headers=ALICE), 404))
    for name, (headers, _) in BAD_CREDENTIALS.items():
        out.append((f"bad proxy key ({name})", post_chat(url, hi, headers), 401))
    # The summary model echoes the key: a compaction and a recall-tool answer both fail through it.
    seeded = seed_alice(url, fake, model)
    model.fail_summaries = Reply(status=401, error_message=ECHO)
    longer = [*seeded.history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more. " * 20}]
    longer += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    assert post_chat(url, longer, ALICE).status_code == 200
    compacted = httpx.post(f"{url}/lcm/conversations/{seeded.conversation}/compact", headers=ALICE, timeout=30)
    assert compacted.json()["unavailable"] is True, compacted.text  # the summary model was asked, and refused
    out.append(("summarizer 401 echoing the key", compacted, 200))
    model.plan = [("lcm_expand_query", {"prompt": "vault code?", "ids": [seeded.summary]})]
    model.fail_answers = Reply(status=401, error_message=ECHO)
    # How a failed recall tool surfaces is not this test's business (None: any status); that it names no key is.
    out.append(("recall summarizer 401 echoing the key", post_chat(url, longer, ALICE), None))
    answer_calls = [r for r in fake.requests if str(r.body["messages"][0].get("content")).startswith("Answer the")]
    assert answer_calls, "lcm_expand_query never asked the summary model"
    return out


def test_failures_never_reveal_keys(
    proxy_factory: Any, fake_upstream: FakeUpstream, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level("DEBUG")
    model = ToolModel()
    fake_upstream.responder = model
    proxy = proxy_factory(lcm=LCM, api_keys=KEYS)
    failures = _failures(proxy.url, fake_upstream, model)
    assert fake_upstream.requests[0].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"  # the key is in use
    for what, response, status in failures:
        assert response.status_code == (status or response.status_code), (what, response.text)
        if response.status_code != 200:
            assert_openai_error(response)
        shown = response.text + json.dumps(dict(response.headers))
        for key in ALL_KEYS:
            assert key not in shown, (what, key, response.text)
    out, err = capfd.readouterr()
    assert "upstream error 401" in caplog.text  # the failures were logged, just without the key
    for key in ALL_KEYS:
        assert key not in caplog.text, key
        assert key not in out and key not in err, key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_served_process_never_prints_keys(fake_upstream: FakeUpstream, upstream_url: str, tmp_path: Path) -> None:
    """``python -m proxy serve`` at debug level with the access log on: stdout and stderr hold no key."""
    port = free_port()
    config = tmp_path / "proxy.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: test-model\n"
        f"    litellm_params: {{model: openai/fake-model, api_base: '{upstream_url}/v1', api_key: os.environ/UP_KEY}}\n"
        "  - model_name: unreachable\n"
        "    litellm_params: {model: openai/x, api_base: 'http://127.0.0.1:9/v1', api_key: os.environ/UP_KEY}\n"
        "general_settings:\n"
        f"  host: 127.0.0.1\n  port: {port}\n  data_dir: '{tmp_path / 'data'}'\n"
        "  log_level: debug\n  access_log: true\n  request_timeout: 10\n"
        "  api_keys: [{key: os.environ/ALICE_KEY, tenant: alice}, {key: os.environ/BOB_KEY, tenant: bob}]\n"
        f"lcm_settings: {json.dumps(LCM)}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "LCM_"))}
    env.update(UP_KEY=UPSTREAM_KEY, ALICE_KEY=ALICE_KEY, BOB_KEY=BOB_KEY)
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    model = ToolModel()
    fake_upstream.responder = model
    with stdout.open("w") as out, stderr.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--config", str(config)],
            cwd=REPO, env=env, stdout=out, stderr=err, text=True,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                assert process.poll() is None and time.monotonic() < deadline, stderr.read_text()
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            failures = _failures(url, fake_upstream, model)
        finally:
            process.terminate()
            process.wait(timeout=20)
    for what, response, status in failures:
        assert response.status_code == (status or response.status_code), (what, response.text)
        for key in ALL_KEYS:
            assert key not in response.text, (what, key)
    printed = stdout.read_text() + stderr.read_text()
    assert "POST /v1/chat/completions" in printed and "upstream error 401" in printed  # debug output was captured
    for key in ALL_KEYS:
        assert key not in printed, key


# --- 5. request size limits --------------------------------------------------------------------------------

LIMIT = 4096


def body_of_size(size: int, **extra: Any) -> bytes:
    template = {"model": "test-model", "messages": [{"role": "user", "content": ""}], **extra}
    pad = size - len(json.dumps(template, separators=(",", ":")))
    template["messages"][0]["content"] = "a" * pad
    raw = json.dumps(template, separators=(",", ":")).encode()
    assert len(raw) == size
    return raw


def chunked(data: bytes, size: int = 1000) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
@pytest.mark.parametrize(
    ("size", "stream", "status"),
    [(LIMIT, False, 200), (LIMIT + 1, False, 413), (LIMIT + 1, True, 413), (LIMIT * 64, False, 413)],
    ids=["at-limit", "one-over", "one-over-stream", "far-over"],
)
def test_request_size_limit(
    proxy_factory: Any, fake_upstream: FakeUpstream, framing: str, size: int, stream: bool, status: int
) -> None:
    proxy = proxy_factory(max_body_bytes=LIMIT, api_keys=KEYS)
    raw = body_of_size(size, stream=True) if stream else body_of_size(size)
    content: bytes | Iterator[bytes] = raw if framing == "content-length" else chunked(raw)
    headers = {**ALICE, "content-type": "application/json"}
    request = httpx.Request("POST", f"{proxy.base_url}/chat/completions", content=content, headers=headers)
    assert ("content-length" in request.headers) == (framing == "content-length")
    with httpx.Client(timeout=30) as client:
        response = client.send(request)
        response.read()
    conversations = httpx.get(f"{proxy.url}/lcm/conversations", headers=ALICE, timeout=30).json()["data"]
    if status == 200:
        assert response.status_code == 200, response.text
        assert len(fake_upstream.requests) == 1 and len(conversations) == 1
        return
    error = assert_openai_error(response, 413)
    assert error["code"] == "request_too_large" and str(LIMIT) in error["message"]
    assert response.headers["x-should-retry"] == "false"
    assert fake_upstream.requests == [] and conversations == []


def test_declared_oversized_body_is_refused_before_it_is_sent(proxy_factory: Any, fake_upstream: FakeUpstream) -> None:
    # Content-Length says 1 GB and no byte of the body follows: the answer must come from the header alone,
    # not after waiting for (or buffering) the body.
    proxy = proxy_factory(max_body_bytes=LIMIT, api_keys=KEYS)
    headers = {**ALICE, "content-type": "application/json", "content-length": str(10**9)}
    status, body = raw_request(proxy.url, "POST", "/v1/chat/completions", headers, timeout=5)
    assert status == 413, body
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert fake_upstream.requests == []


def test_bare_keys_keep_their_tenant_when_the_list_changes(
    upstream_url: str, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A bare-string key's tenant comes from the key, not its place in the list: revoking Alice by deleting
    her line must not hand her history to Bob, who moves up to her place."""
    alice, bob = "alice-key-1111", "bob-key-2222"
    data = tmp_path / "shared"
    body = {"model": "test-model", "messages": [{"role": "user", "content": "alice's secret plan"}]}
    with serve_in_thread(create_app(make_config(upstream_url, data, api_keys=[alice, bob]))) as url:
        response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=_bearer(alice), timeout=30)
        conversation = response.headers["x-lcm-conversation-id"]
    with serve_in_thread(create_app(make_config(upstream_url, data, api_keys=[bob]))) as url:
        as_bob = httpx.get(f"{url}/lcm/conversations/{conversation}/messages", headers=_bearer(bob), timeout=30)
        assert as_bob.status_code == 404 and "secret" not in as_bob.text
        listed = httpx.get(f"{url}/lcm/conversations", headers=_bearer(bob), timeout=30).json()
        assert listed["data"] == []
    with serve_in_thread(create_app(make_config(upstream_url, data, api_keys=[bob, alice]))) as url:
        as_alice = httpx.get(f"{url}/lcm/conversations/{conversation}/messages", headers=_bearer(alice), timeout=30)
        assert as_alice.status_code == 200 and "alice's secret plan" in as_alice.text
    # The tenant name is derived from the key but does not contain it.
    tenants = {k.tenant for k in make_config(upstream_url, data, api_keys=[alice, bob]).general_settings.api_keys}
    assert len(tenants) == 2 and not any(alice in t or bob in t for t in tenants)


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}
