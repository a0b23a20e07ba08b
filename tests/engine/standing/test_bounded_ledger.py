"""The hostile probe of the standing-instructions ledger, through the real HTTP endpoint: one request of 300
rule-dense messages (4 KB of rules each, 1.2 MB) keeps neither the event loop nor the writer. Far below its
window's threshold, its messages are read when its ledger is first asked for (``proxy.engine.standing.reader``):
the admin API's ledger read here, which catches the reading up.

Measured without a clock: the big request's worker threads are held at the two points where its ledger work
runs (reading its messages, planning its items) until the test has seen ``/healthz`` answer, and another
tenant store a conversation, while they were held. Were that work on the event loop, nothing would answer
meanwhile; were it inside the write transaction, the other tenant could not write. Every extraction and every
reconciliation is also checked to run off the loop. The timings are ``python -m bench ledger``'s.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import orjson

from proxy.app import create_app
from proxy.cli.doctor import run_doctor
from proxy.engine.standing import flow, languages, ledger
from proxy.engine.standing.flow import MAX_NEW_PER_MESSAGE, MAX_OPEN_ITEMS
from proxy.store.records import LedgerItem
from proxy.store.sqlite.store import SQLiteStore
from tests.support.fakes import FakeUpstream
from tests.support.proxies import make_config
from tests.support.rule_dense import rule_dense_request
from tests.support.servers import serve_in_thread

ALICE, BOB = "sk-proxy-alice-5e1f0c2d", "sk-proxy-bob-9a8b7c6d"
KEYS = [{"key": ALICE, "tenant": "alice"}, {"key": BOB, "tenant": "bob"}]
BIG_MODEL = {  # a window the 1.2 MB transcript fits in: nothing is compacted, the ledger is what is measured
    "model_name": "big-model",
    "litellm_params": {"model": "openai/fake-model", "api_base": "", "api_key": "sk-upstream-test"},
    "model_info": {"max_input_tokens": 2_000_000},
}
HANG_GUARD = 300.0  # seconds: how long a held thread waits before giving up (a failure, not a measurement)


def on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Hold:
    """Holds the first worker thread that reaches it until the test releases it."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.released = threading.Event()
        self.gave_up = False
        self.on_loop = False

    def __call__(self) -> None:
        if self.reached.is_set():
            return
        self.on_loop = on_loop()
        self.reached.set()
        self.gave_up = not self.released.wait(HANG_GUARD)


def healthz(url: str, times: int) -> int:
    """``/healthz`` asked ``times`` times, one after the other: how many answered 200."""
    with httpx.Client(timeout=HANG_GUARD) as client:
        return sum(client.get(f"{url}/healthz").status_code == 200 for _ in range(times))


def chat(url: str, key: str, model: str, messages: list[dict[str, Any]] | bytes) -> httpx.Response:
    body = messages if isinstance(messages, bytes) else orjson.dumps({"model": model, "messages": messages})
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return httpx.post(f"{url}/v1/chat/completions", content=body, headers=headers, timeout=HANG_GUARD)


def chat_and_ledger(url: str, key: str, model: str, messages: list[dict[str, Any]] | bytes) -> list[httpx.Response]:
    """The chat request, then its conversation's ledger through the admin API (its messages read first)."""
    answer = chat(url, key, model, messages)
    conversation = answer.headers.get("x-lcm-conversation-id")
    headers = {"authorization": f"Bearer {key}"}
    listed = httpx.get(f"{url}/lcm/conversations/{conversation}/ledger", headers=headers, timeout=HANG_GUARD)
    return [answer, listed]


def test_a_300_message_rule_dense_request_keeps_neither_the_loop_nor_the_writer(
    upstream_url: str, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    transcript = rule_dense_request(300)
    body = orjson.dumps({"model": "big-model", "messages": transcript})
    assert len(body) > 1_200_000
    model = {**BIG_MODEL, "litellm_params": {**BIG_MODEL["litellm_params"], "api_base": f"{upstream_url}/v1"}}
    data_dir = tmp_path / "data"
    app = create_app(make_config(upstream_url, data_dir, models=[model], api_keys=KEYS))

    reading, planning = Hold(), Hold()
    calls_on_loop: list[str] = []
    heard, plan, extract, reconcile = flow.heard, flow.plan, ledger.extract, ledger.reconcile
    detect = languages.detect

    def held_read(message: Any, *args: Any) -> Any:
        if len(str(message.get("content"))) > 3000:  # the big request's messages, not Bob's
            reading()
        return heard(message, *args)

    def held_plan(basis: Any, start: int, new: Any, **kwargs: Any) -> Any:
        if len(new) > 1:  # a chunk of the big request (``proxy.engine.chunks``: planned chunk by chunk), not Bob's
            planning()
            assert not app.state.lcm.store._lock.locked()  # nothing holds the writer while this one plans
        return plan(basis, start, new, **kwargs)

    def watched(name: str, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if on_loop():
                calls_on_loop.append(name)
            return function(*args, **kwargs)

        return call

    with (
        mock.patch.object(flow, "heard", held_read),
        mock.patch.object(flow, "plan", held_plan),
        mock.patch.object(ledger, "extract", watched("extract", extract)),
        mock.patch.object(ledger, "reconcile", watched("reconcile", reconcile)),
        mock.patch.object(languages, "detect", watched("detect", detect)),
        serve_in_thread(app) as url,
    ):
        assert chat(url, ALICE, "test-model", [{"role": "user", "content": "hi"}]).status_code == 200  # warm
        outcome: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: outcome.extend(chat_and_ledger(url, ALICE, "big-model", body)))
        sender.start()
        try:
            assert reading.reached.wait(HANG_GUARD), "the big request never reached its ledger"
            # Its messages are being read: the loop answers meanwhile.
            answered_while_reading = healthz(url, 5)
            reading.released.set()
            assert planning.reached.wait(HANG_GUARD), "the big request was never planned"
            # Its items are being planned: the loop answers, and another tenant stores a conversation.
            answered_while_planning = healthz(url, 5)
            bob, bob_ledger = chat_and_ledger(
                url, BOB, "test-model", [{"role": "user", "content": "Never push to main on Fridays."}]
            )
        finally:
            reading.released.set()
            planning.released.set()
            sender.join()

    assert not reading.gave_up and not planning.gave_up
    assert not reading.on_loop and not planning.on_loop  # held in worker threads
    assert answered_while_reading == 5 and answered_while_planning == 5
    assert bob.status_code == 200 and bob_ledger.status_code == 200, bob.text + bob_ledger.text
    assert len(outcome) == 2 and all(r.status_code == 200 for r in outcome), [r.text[:200] for r in outcome]
    assert calls_on_loop == []  # no extraction, language detection or reconciliation on the loop, for either tenant

    ledgers = asyncio.run(stored_ledgers(data_dir))
    (bob_items,) = [items for tenant, items in ledgers if tenant == "bob"]
    assert [(i.kind, i.value) for i in bob_items] == [("rule", "never")]  # written while Alice's was planned
    (alice_items,) = [items for tenant, items in ledgers if tenant == "alice" and len(items) > 1]
    assert len([i for i in alice_items if i.superseded_seq is None]) <= MAX_OPEN_ITEMS

    def open_after(seq: int) -> int:
        return len([i for i in alice_items if i.seq <= seq and (i.superseded_seq or seq + 1) > seq])

    assert max(open_after(seq) - open_after(seq - 1) for seq in range(len(transcript))) <= MAX_NEW_PER_MESSAGE
    assert asyncio.run(run_doctor(data_dir)) == []


async def stored_ledgers(data_dir: Path) -> list[tuple[str, list[LedgerItem]]]:
    store = SQLiteStore(data_dir)
    await store.open()
    try:
        out = []
        for tenant in ("alice", "bob"):
            for conversation in await store.read.conversations(tenant):
                out.append((tenant, await store.read.ledger(conversation.id, include_superseded=True)))
        return out
    finally:
        await store.close()
