"""The proxy SIGKILLed at random moments during ingest and compaction, 12 times on SQLite and 8 on PostgreSQL:
after every kill doctor finds nothing wrong but the files the killed process left behind (reported, never
silently; PostgreSQL keeps payloads in its transactions, so nothing at all), ``doctor --repair`` removes
those, the database's own checks pass, and no acknowledged message is missing."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from proxy.cli.doctor import run_doctor, run_repair
from proxy.engine.canonical import canonical
from proxy.engine.ingest import export_conversation
from proxy.store.location import Location
from tests.support import REPO
from tests.support.cli import console_script, free_port
from tests.support.engine import row_count
from tests.support.fakes import FakeUpstream
from tests.support.sim import ScriptedModel


def start_server(config: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LCM_")}
    process = subprocess.Popen(
        [console_script(), "serve", "--config", str(config)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("server did not start")


def test_sigkill_during_ingest_and_compaction(
    where: Location, tmp_path: Path, upstream_url: str, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.responder = ScriptedModel()
    port = free_port()
    data_dir = tmp_path / "data"
    where = Location(data_dir, where.database_url)
    database = f", database_url: '{where.database_url}'" if where.database_url else ""
    config = tmp_path / "crash.yaml"
    config.write_text(
        "model_list:\n"
        f"  - {{model_name: small, litellm_params: {{model: openai/small, api_base: '{upstream_url}/v1', api_key: k-12345678}}, model_info: {{max_input_tokens: 3000}}}}\n"
        f"general_settings: {{port: {port}, data_dir: '{data_dir}'{database}}}\n"
        "lcm_settings: {context_threshold: 0.3, fresh_tail_count: 4, leaf_chunk_tokens: 600, leaf_target_tokens: 100, leaf_min_fanout: 3, condensed_min_fanout: 2, large_file_token_threshold: 1500, tool_result_token_threshold: 200}\n"
    )
    rng = random.Random(7)
    acknowledged: dict[int, list[dict[str, Any]]] = {}  # client -> longest transcript answered with 200
    transcripts: dict[int, list[dict[str, Any]]] = {
        c: [{"role": "user", "content": f"client {c} starts"}] for c in range(4)
    }
    for _kill in range(12 if where.kind == "sqlite" else 8):
        server = start_server(config, port)
        stop = threading.Event()
        answered = threading.Event()  # the new process has warmed up (LiteLLM's first call is slow)

        def drive(c: int, stop: threading.Event = stop, answered: threading.Event = answered) -> None:
            with httpx.Client(timeout=10) as client:
                while not stop.is_set():
                    t = transcripts[c]
                    try:
                        response = client.post(
                            f"http://127.0.0.1:{port}/v1/chat/completions",
                            json={"model": "small", "messages": t, "max_tokens": 300},
                        )
                    except httpx.TransportError:
                        return
                    if response.status_code == 200:
                        answered.set()
                        acknowledged[c] = t
                        transcripts[c] = [
                            *t,
                            {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]},
                            {"role": "user", "content": f"c{c} " + "more words about the plan " * rng.randint(5, 40)},
                        ]

        threads = [threading.Thread(target=drive, args=(c,)) for c in range(4)]
        for t in threads:
            t.start()
        answered.wait(timeout=20)
        time.sleep(rng.uniform(0.1, 1.2))
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        stop.set()
        for t in threads:
            t.join(timeout=20)
        problems = asyncio.run(run_doctor(where))
        assert [p for p in problems if not p.startswith("files: ")] == [], problems
        if where.kind == "postgresql":
            assert problems == []  # payloads are written inside their rows' transaction: nothing is left over
        repaired = asyncio.run(run_repair(where))
        assert len(repaired) == len(problems), (problems, repaired)  # each kind reported is a kind removed
        assert asyncio.run(run_doctor(where)) == []
    assert len(acknowledged) == 4 and all(len(t) > 3 for t in acknowledged.values())
    asyncio.run(_check_acknowledged(where, acknowledged))


async def _check_acknowledged(where: Location, acknowledged: dict[int, list[dict[str, Any]]]) -> None:
    store, files = where.stores()
    await store.open()
    try:
        assert await store.integrity() == []  # SQLite: integrity_check, foreign keys, full-text indexes
        assert await row_count(store, "summaries") > 0  # compaction did run between the kills
        exports = [await export_conversation(store, files, None, c.id) for c in await store.read.conversations(None)]
        for transcript in acknowledged.values():
            wanted = [canonical(m) for m in transcript]
            assert any([canonical(m) for m in e[: len(wanted)]] == wanted for e in exports), (
                "an acknowledged transcript is missing"
            )
    finally:
        await store.close()
