"""Several proxy replicas (separate ``python -m proxy serve`` processes) on one PostgreSQL database.

Every write decision a replica makes (which conversation a transcript continues, append or fork) is taken
inside one transaction holding the store's locks (``lock_identity``, ``lock_conversation``); replicas share
nothing else. Identical first requests that reach different replicas at the same moment must create one
conversation; a replica's decision about a conversation waits for another replica's transaction on it (here
made to stand still at a known point, so the order is not left to chance); and the load run of bench/load.py,
its requests dealt round-robin over three replicas and one of them SIGKILLed mid-run, must lose and duplicate
nothing that was acknowledged.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

from bench.load import free_port, processes, run_load
from proxy.cli.doctor import run_doctor
from proxy.cli.operator import Operator
from proxy.engine.answers import record_answer
from proxy.engine.doctor import check_database
from proxy.engine.ingest import Ingestor, Thresholds, export_conversation
from proxy.store.location import Location

OPENINGS = 8  # distinct first transcripts, raced at once
COPIES = 9  # identical copies of each, three per replica


def write_config(path: Path, upstream_url: str, data_dir: Path, database_url: str) -> None:
    model = {"model": "openai/fake-model", "api_base": f"{upstream_url}/v1", "api_key": "k-12345678"}
    config = {
        "model_list": [{"model_name": "m", "litellm_params": model}],
        "general_settings": {"data_dir": str(data_dir), "database_url": database_url, "log_level": "warning"},
    }
    path.write_bytes(orjson.dumps(config))  # JSON is YAML


def opening(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": f"You help with project {i}."},
        {"role": "user", "content": f"Project {i}: where do we start?"},
    ]


async def race(urls: list[str]) -> dict[int, list[httpx.Response]]:
    """Every copy of every opening at once; copy ``c`` of opening ``i`` goes to replica ``(i + c) % 3``."""
    limits = httpx.Limits(max_connections=OPENINGS * COPIES)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:

        async def ask(i: int, c: int) -> tuple[int, httpx.Response]:
            url = f"{urls[(i + c) % len(urls)]}/v1/chat/completions"
            return i, await http.post(url, json={"model": "m", "messages": opening(i)})

        answers = await asyncio.gather(*(ask(i, c) for i in range(OPENINGS) for c in range(COPIES)))
    out: dict[int, list[httpx.Response]] = {}
    for i, response in answers:
        out.setdefault(i, []).append(response)
    return out


def test_identical_first_requests_on_three_replicas_create_one_conversation(
    tmp_path: Path, upstream_url: str, pg_dsn: str
) -> None:
    config = tmp_path / "replicas.yaml"
    write_config(config, upstream_url, tmp_path / "data", pg_dsn)
    ports = [free_port() for _ in range(3)]
    serve = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port"]
    logs = [tmp_path / f"replica{n}.log" for n in range(3)]
    with processes([([*serve, str(port)], port, log) for port, log in zip(ports, logs, strict=True)]):
        answers = asyncio.run(race([f"http://127.0.0.1:{port}" for port in ports]))

    reported: dict[int, set[str | None]] = {}
    for i, responses in answers.items():
        assert [r.status_code for r in responses] == [200] * COPIES, [r.text for r in responses]
        reported[i] = {r.headers.get("x-lcm-conversation-id") for r in responses}
    # Every copy of an opening was told the same conversation, and each opening has its own.
    assert all(len(ids) == 1 and None not in ids for ids in reported.values()), reported
    ids = {i: str(next(iter(found))) for i, found in reported.items()}
    assert len(set(ids.values())) == OPENINGS

    location = Location(tmp_path / "data", pg_dsn)

    async def stored() -> tuple[list[Any], dict[str, list[Any]]]:
        async with Operator(location) as op:
            conversations = await op.store.read.conversations(None, limit=1000)
            return conversations, {c.id: await op.export(c.id, None) for c in conversations}

    conversations, exports = asyncio.run(stored())
    # Exactly one conversation per opening, none forked, each holding its opening once (and then the answer
    # the proxy relayed and stored).
    assert sorted(c.id for c in conversations) == sorted(ids.values())
    assert all(c.parent_id is None for c in conversations)
    for i, conversation_id in ids.items():
        exported = exports[conversation_id]
        assert exported[:2] == opening(i) and len(exported) <= 3, exported
    assert asyncio.run(run_doctor(location)) == []
    assert all("ERROR" not in log.read_text(errors="replace") for log in logs)


async def waiting_for_locks(watch: psycopg.AsyncConnection[Any], task: asyncio.Task[Any], count: int) -> list[str]:
    """The kinds of lock the backends of this database wait for, once ``count`` of them wait (or ``task``
    ended: then whatever waits at that moment)."""
    deadline = time.monotonic() + 60
    while True:
        cursor = await watch.execute(
            "SELECT l.locktype FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE NOT l.granted AND a.datname = current_database()"
        )
        kinds = sorted(str(row[0]) for row in await cursor.fetchall())
        if len(kinds) >= count or task.done() or time.monotonic() > deadline:
            return kinds
        await asyncio.sleep(0.01)


def test_a_decision_waits_for_another_replicas_transaction_on_the_conversation(tmp_path: Path, pg_dsn: str) -> None:
    """Replica A stores the answer it relayed while replica B stores the client's next request, which carries
    its own version of that answer. A's transaction is held still (the test locks the conversation's row, so
    A stops at its last statement, its message inserted and its lock held): B must wait for A's lock, not
    decide on what it read before A's commit; once A commits, B replaces the relayed answer with the
    client's version, in place. Without the conversation lock, B would append at the same place and wait
    for A's row instead (then fail on the unique key)."""
    tenant = "t"
    opening = [{"role": "user", "content": "What is a fork?"}]  # no instructions: every message is stored
    relayed = {"role": "assistant", "content": "A fork is a branch."}
    following = [*opening, {"role": "assistant", "content": "A fork: a branch."}, {"role": "user", "content": "And?"}]

    async def scenario() -> None:
        location = Location(tmp_path, pg_dsn)
        (store_a, files_a), (store_b, files_b) = location.stores(), location.stores()
        await store_a.open()
        await store_b.open()
        replica_a = Ingestor(store_a, files_a, Thresholds(25000, 2000))
        replica_b = Ingestor(store_b, files_b, Thresholds(25000, 2000))
        gate = await psycopg.AsyncConnection.connect(pg_dsn)
        watch = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
        try:
            first = await replica_a.ingest(tenant, opening)
            cid = first.conversation_id
            assert cid is not None
            await gate.execute("SELECT 1 FROM lcm.conversations WHERE id = %s FOR NO KEY UPDATE", (cid,))
            storing = asyncio.create_task(
                record_answer(replica_a, tenant, cid, len(opening), first.tip_chain, relayed, time.time())
            )
            assert await waiting_for_locks(watch, storing, 1) and not storing.done()  # A waits for the gate
            ingesting = asyncio.create_task(replica_b.ingest(tenant, following))
            kinds = await waiting_for_locks(watch, ingesting, 2)
            assert not ingesting.done() and "advisory" in kinds, kinds  # B waits for A's conversation lock
            await gate.commit()
            assert await storing is True
            result = await ingesting
            assert (result.conversation_id, result.action) == (cid, "append")
            assert [c.id for c in await store_a.read.conversations(tenant)] == [cid]  # no fork
            assert await export_conversation(store_a, files_a, tenant, cid) == following
            assert await check_database(store_a, files_a) == []
        finally:
            await gate.close()
            await watch.close()
            await store_a.close()
            await store_b.close()

    asyncio.run(scenario())


def test_replicas_load_run_with_one_killed_loses_nothing(tmp_path: Path, pg_cluster: Any) -> None:
    """bench/load.py on three replicas (a database of its own on the session's cluster), requests dealt
    round-robin over them, the last one SIGKILLed once half of them are sent."""
    result = run_load(
        clients=48,
        conversations=16,
        requests=1200,
        replicas=3,
        database=pg_cluster.dsn("postgres"),
        kill_one=True,
        workdir=tmp_path,
    )
    assert result.errors == []
    assert result.log_errors == []  # no ERROR in the surviving replicas' logs
    assert result.requests >= 1200
    assert result.cut > 0  # requests were in flight on the killed replica, and were sent again elsewhere
    assert (result.lost, result.duplicated, result.mismatched) == (0, 0, [])
    assert result.roots == 16  # the racing first requests of each opening created one conversation
    assert result.forks == result.forks_expected > 16
    assert result.doctor == [] and result.integrity == "ok"
    assert result.upstream.get("over_window", 0) == 0
    assert result.upstream.get("unpaired_tool_calls", 0) == 0
    assert result.compaction_headers["scheduled"] > 0 and result.summaries["leaf"] > 0
    assert all(result.actions[a] > 0 for a in ("continue", "retry", "regenerate", "edit", "double", "tools"))
    assert result.ok
