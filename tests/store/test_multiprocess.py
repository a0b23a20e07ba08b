"""Several processes on one database file (uvicorn --workers): nothing lost, nothing duplicated."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from proxy.engine.ingest import export_conversation
from tests.support import REPO
from tests.support.cli import console_script, free_port
from tests.support.engine import assistant, open_engine, run, user


def test_two_processes_writing_the_same_conversations(tmp_path: Path) -> None:
    clients, turns = 6, 15
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.multiprocess_writer", str(tmp_path), str(clients), str(turns)],
            cwd=REPO,
            env=env,
        )
        for _ in range(3)
    ]
    assert [p.wait(timeout=300) for p in processes] == [0, 0, 0]

    async def check() -> None:
        async with open_engine(tmp_path) as (_ingestor, store, files):
            conversations = await store.read.conversations("t")
            assert len(conversations) == clients
            for conversation in conversations:
                exported = await export_conversation(store, files, "t", conversation.id)
                assert len(exported) == 1 + 2 * turns
                opener = exported[0]["content"]
                c = int(opener.split()[1])
                expected = [user(f"client {c} opens")]
                for turn in range(turns):
                    expected += [assistant(f"answer {turn} to {c}"), user(f"question {turn + 1} from {c}")]
                assert exported == expected

    run(check())


def test_serve_with_two_workers(tmp_path: Path, upstream_url: str) -> None:
    port = free_port()
    config = tmp_path / "workers.yaml"
    config.write_text(
        "model_list:\n"
        f"  - {{model_name: m, litellm_params: {{model: openai/fake-model, api_base: '{upstream_url}/v1', api_key: k-12345678}}}}\n"
        f"general_settings: {{port: {port}, data_dir: '{tmp_path / 'data'}'}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LCM_")}
    server = subprocess.Popen([console_script(), "serve", "--config", str(config), "--workers", "2"], env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        results: dict[int, list[dict[str, Any]]] = {}
        errors: list[str] = []

        def client(c: int) -> None:
            transcript = [user(f"worker client {c}")]
            last: dict[str, Any] = {}
            with httpx.Client(timeout=30) as http:
                for turn in range(8):
                    for _ in range(2):  # every request is sent twice, like a retrying client
                        response = http.post(url, json={"model": "m", "messages": transcript})
                        if response.status_code != 200:
                            errors.append(response.text)
                        last = response.json()["choices"][0]["message"]
                    # The client keeps its own version of each answer: it replaces the one the proxy stored.
                    transcript = [*transcript, assistant(f"a{turn}"), user(f"q{turn} from {c}")]
            # The last transcript sent, and the answer the proxy relayed (and stored) for it.
            results[c] = [*transcript[:-2], assistant(last["content"])]

        threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert errors == []
    finally:
        server.terminate()
        server.wait(timeout=30)

    async def check() -> None:
        async with open_engine(tmp_path / "data") as (_i, store, files):
            conversations = await store.read.conversations("default")
            assert len(conversations) == 8
            exported = sorted(
                [await export_conversation(store, files, "default", c.id) for c in conversations],
                key=lambda t: t[0]["content"],
            )
            assert exported == [results[c] for c in sorted(results, key=lambda c: f"worker client {c}")]

    run(check())


def test_connections_opening_a_new_store_at_once_all_start(tmp_path: Path) -> None:
    """Worker processes (``--workers``) open the same fresh database file at the same moment: each connection
    switches it to WAL, the ones that find it locked wait, none fails with "database is locked" (which used to
    stop the whole server at startup). Threads race here as processes do: each store has its own connections."""
    from proxy.store.sqlite.store import SQLiteStore

    errors: list[str] = []
    for attempt in range(60):
        data_dir = tmp_path / f"data{attempt}"
        data_dir.mkdir()
        (data_dir / "lcm.sqlite3").touch()  # as open() creates it, before any connection
        barrier = threading.Barrier(6)

        def open_and_close(data_dir: Path = data_dir, barrier: threading.Barrier = barrier) -> None:
            async def main() -> None:
                store = SQLiteStore(data_dir)
                barrier.wait(timeout=60)
                await store.open()
                await store.close()

            try:
                asyncio.run(main())
            except Exception as error:  # reported by the test
                errors.append(f"{type(error).__name__}: {error}")

        threads = [threading.Thread(target=open_and_close) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert errors == []
