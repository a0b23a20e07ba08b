"""Long conversations (issue 22, "Hardening"): a conversation of 100,000+ stored messages is compacted and
listed in bounded pages, so neither a compaction sweep nor the admin listing stalls the event loop; /healthz
answers within 100 ms while each is handled, on both stores.

The history is written straight into the store (one INSERT ... SELECT over a generated series: seconds, not
100,000 requests)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.app import create_app
from proxy.cli.doctor import run_doctor
from proxy.engine.admin import MESSAGES_PAGE, MESSAGES_PAGE_MAX
from proxy.store.base import Store
from proxy.store.location import Location
from tests.support.proxies import make_config
from tests.support.servers import probe_healthz_while, serve_in_thread

HEALTHZ_BOUND = 0.100  # seconds: the acceptance bound
HISTORY = 120_000  # messages

_COLUMNS = (
    "conversation_id, seq, role, original_json, payload_paths, forward_json, compact_json, text, token_count,"
    " sent_token_count, chain_hash, created_at, compact_token_count"
)
_SQLITE = (
    "WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n + 1 < ?)"
    f" INSERT INTO messages ({_COLUMNS})"
    " SELECT ?, n, CASE n % 2 WHEN 0 THEN 'user' ELSE 'assistant' END,"
    " json_object('role', CASE n % 2 WHEN 0 THEN 'user' ELSE 'assistant' END,"
    " 'content', 'Message ' || n || ' of a very long history about ledgers and harbours.'),"
    " NULL, NULL, NULL, 'Message ' || n || ' of a very long history about ledgers and harbours.', 16, 16,"
    " 'bulk-' || ? || '-' || n, ?, NULL FROM s"
)
_POSTGRES = (
    f"INSERT INTO lcm.messages ({_COLUMNS}, words)"
    " SELECT %s, n, CASE n %% 2 WHEN 0 THEN 'user' ELSE 'assistant' END,"
    " json_build_object('role', CASE n %% 2 WHEN 0 THEN 'user' ELSE 'assistant' END,"
    " 'content', 'Message ' || n || ' of a very long history about ledgers and harbours.')::text,"
    " NULL, NULL, NULL, 'Message ' || n || ' of a very long history about ledgers and harbours.', 16, 16,"
    " 'bulk-' || %s || '-' || n, %s, NULL, to_tsvector('simple', 'message ' || n || ' ledgers harbours')"
    " FROM generate_series(0, %s - 1) AS n"
)


async def bulk_history(store: Store, tenant: str, conversation_id: str, count: int) -> None:
    """A conversation of ``count`` alternating user/assistant messages, written in one statement."""
    async with store.write() as tx:
        await tx.create_conversation(conversation_id, tenant)
        now = time.time()
        if store.kind == "sqlite":
            await tx.conn.execute(_SQLITE, (count, conversation_id, conversation_id, now))  # type: ignore[attr-defined]
        else:
            await tx._run(_POSTGRES, (conversation_id, conversation_id, now, count))  # type: ignore[attr-defined]
        await tx._refresh_counts(conversation_id)  # type: ignore[attr-defined]


def with_history(location: Location, conversation_id: str, count: int = HISTORY) -> None:
    async def run() -> None:
        store, _ = location.stores()
        await store.open()
        try:
            await bulk_history(store, "default", conversation_id, count)
        finally:
            await store.close()

    asyncio.run(run())


def assert_responsive(latencies: list[float], what: str) -> None:
    assert len(latencies) >= 5, "the probes must overlap the handling of the request"
    slow = [round(s, 3) for s in latencies if s > HEALTHZ_BOUND]
    assert not slow, f"/healthz took {slow} s (of {len(latencies)} probes) while {what}"


@pytest.fixture
def long_proxy(upstream_url: str, tmp_path: Path, where: Location) -> Iterator[str]:
    """A proxy serving a conversation of ``HISTORY`` messages, served as ``lcm-proxy serve`` serves it (LiteLLM
    and the tokenizer warmed up, the startup heap frozen), so what is measured is the request under test."""
    general = {"database_url": where.database_url} if where.database_url else {}
    # No summary model: the sweep writes extractive summaries, so it is the store's reads that are measured.
    config = make_config(upstream_url, tmp_path / "data", {"max_sweep_iterations": 3}, **general)
    with_history(config.general_settings.location(), "conv_00000000000000aa")
    with serve_in_thread(create_app(config, serving=True)) as url:
        yield url
    assert asyncio.run(run_doctor(config.general_settings.location())) == []


def test_healthz_answers_within_100ms_while_a_long_conversation_is_compacted(long_proxy: str) -> None:
    url = long_proxy
    with httpx.Client(timeout=300) as client:
        probes, response = probe_healthz_while(
            url, lambda: client.post(f"{url}/lcm/conversations/conv_00000000000000aa/compact")
        )
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["leaf_passes"] >= 1 and report["tokens_after"] < report["tokens_before"]
    assert_responsive(probes.latencies, "a 120,000-message conversation was compacted")
    summaries = client_get(url, "/lcm/conversations/conv_00000000000000aa")["context_summaries"]
    assert len(summaries) >= 1


def client_get(url: str, path: str) -> Any:
    response = httpx.get(f"{url}{path}", timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_healthz_answers_within_100ms_while_a_long_conversation_is_listed(long_proxy: str) -> None:
    url = long_proxy
    path = "/lcm/conversations/conv_00000000000000aa/messages"
    seqs: list[int] = []

    def walk() -> httpx.Response:
        """Page through the whole conversation, as a client exporting it would."""
        with httpx.Client(timeout=300) as client:
            cursor = ""
            while True:
                response = client.get(f"{url}{path}?limit={MESSAGES_PAGE}{cursor}")
                if response.status_code != 200:
                    return response
                page = orjson.loads(response.content)  # (json.loads would hold this process's GIL for longer)
                seqs.extend(m["seq"] for m in page["data"])
                if page["next"] is None or len(seqs) > HISTORY:
                    return response
                cursor = f"&after={page['next']}"

    probes, response = probe_healthz_while(url, walk)
    assert response.status_code == 200, response.text
    assert_responsive(probes.latencies, "a 120,000-message conversation was listed")
    assert seqs == list(range(HISTORY))

    page = client_get(url, f"{path}?limit=1000&after=59000")
    assert [m["seq"] for m in page["data"]] == list(range(59001, 60001)) and page["next"] == 60000
    assert page["data"][0]["message"] == {
        "role": "assistant",
        "content": "Message 59001 of a very long history about ledgers and harbours.",
    }
    # Without a cursor: the first page, of the default size, and where the next one starts.
    page = client_get(url, path)
    assert [m["seq"] for m in page["data"]] == list(range(MESSAGES_PAGE)) and page["next"] == MESSAGES_PAGE - 1
    last = client_get(url, f"{path}?after={HISTORY - 3}&limit=10")
    assert [m["seq"] for m in last["data"]] == [HISTORY - 2, HISTORY - 1] and last["next"] is None
    assert client_get(url, f"{path}?after={HISTORY + 5}") == {"data": [], "next": None}
    for bad in ("limit=0", f"limit={MESSAGES_PAGE_MAX + 1}", "after=-1", "after=x"):
        refused = httpx.get(f"{url}{path}?{bad}")
        assert refused.status_code == 400 and refused.json()["error"]["param"] == bad.split("=")[0]
