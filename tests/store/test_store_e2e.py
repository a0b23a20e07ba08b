"""The store through the real proxy: a client that re-sends everything, retries, edits; the operator CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.support import REPO
from tests.support.cli import main
from tests.support.fakes import FakeUpstream
from tests.support.proxies import RunningProxy


def chat(proxy: RunningProxy, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    headers = extra.pop("headers", {})
    body = {"model": "test-model", "messages": messages, **extra}
    return httpx.post(f"{proxy.base_url}/chat/completions", json=body, headers=headers, timeout=30)


def test_conversation_header_and_continuation(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    sdk = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    raw = sdk.chat.completions.with_raw_response.create(model="test-model", messages=messages)  # type: ignore[arg-type]
    conversation = raw.headers["x-lcm-conversation-id"]
    assert conversation.startswith("conv_")
    assert int(raw.headers["x-lcm-tokens-sent"]) == int(raw.headers["x-lcm-tokens-forwarded"]) > 0
    messages += [
        {"role": "assistant", "content": raw.parse().choices[0].message.content},
        {"role": "user", "content": "more"},
    ]
    raw2 = sdk.chat.completions.with_raw_response.create(model="test-model", messages=messages)  # type: ignore[arg-type]
    assert raw2.headers["x-lcm-conversation-id"] == conversation
    # Zero-cost continuity: what the upstream received is exactly what the client sent, and no summarizer
    # call was made.
    assert fake_upstream.last.body["messages"] == messages
    assert len(fake_upstream.requests) == 2
    assert raw2.headers["x-lcm-compaction"] == "none"


def test_streaming_response_carries_conversation_header(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    with httpx.stream(
        "POST",
        f"{proxy.base_url}/chat/completions",
        json={"model": "test-model", "messages": [{"role": "user", "content": "stream me"}], "stream": True},
        timeout=30,
    ) as response:
        assert response.headers["x-lcm-conversation-id"].startswith("conv_")
        lines = list(response.iter_lines())
    assert lines[-2:] == ["data: [DONE]", ""]
    events = [json.loads(line[len("data: ") :]) for line in lines[:-2] if line]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == "echo: stream me"


def test_big_file_is_stubbed_upstream_and_export_restores_it(
    proxy: RunningProxy, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    document = "".join(f"Row {i}: the quick brown fox jumps over the lazy dog {i * 7}\n" for i in range(40000))
    message = {"role": "user", "content": f'Summarise <file name="data.txt" mime="text/plain">{document}</file> please'}
    first = chat(proxy, [message])
    assert first.status_code == 200, first.text
    conversation = first.headers["x-lcm-conversation-id"]
    # Two upstream calls: the exploration summary (summary model = request model), then the chat itself.
    forwarded = fake_upstream.last.body["messages"][0]["content"]
    assert forwarded.startswith("Summarise [LCM File: file_") and forwarded.endswith(" please")
    assert document not in forwarded
    assert "Exploration Summary:" in forwarded
    assert int(first.headers["x-lcm-tokens-forwarded"]) < int(first.headers["x-lcm-tokens-sent"]) // 10
    calls = len(fake_upstream.requests)
    second = chat(proxy, [message, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "thanks"}])
    assert second.headers["x-lcm-conversation-id"] == conversation
    assert len(fake_upstream.requests) == calls + 1  # no second exploration call for the same file

    config = tmp_path / "cli.yaml"
    config.write_text(
        "model_list: [{model_name: m, litellm_params: {model: openai/m}}]\n"
        f"general_settings: {{data_dir: '{proxy.config.general_settings.data_dir}'}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LCM_")}
    exported = main("export", conversation, "--config", str(config), env=env)
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout) == [
        message,
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": second.json()["choices"][0]["message"]["content"]},  # relayed, stored
    ]
    listing = main("conversations", "--config", str(config), env=env)
    assert conversation in listing.stdout and "default" in listing.stdout
    shown = main("show", conversation, "--config", str(config), env=env)
    assert shown.returncode == 0 and "stub" in shown.stdout and "[LCM File: file_" in shown.stdout
    missing = main("show", "conv_nope", "--config", str(config), env=env)
    assert missing.returncode == 1 and "no conversation conv_nope" in missing.stderr


def test_bad_conversation_header_is_400(proxy: RunningProxy) -> None:
    response = chat(proxy, [{"role": "user", "content": "x"}], headers={"x-lcm-conversation-id": "a" * 300})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "x-lcm-conversation-id"


def test_disabled_lcm_is_a_plain_proxy(proxy_factory: Any, fake_upstream: FakeUpstream) -> None:
    from proxy.config.lcm import LcmSettings

    proxy = proxy_factory()
    proxy.app.state.lcm.config = proxy.config.model_copy(update={"lcm_settings": LcmSettings(enabled=False)})
    response = chat(proxy, [{"role": "user", "content": "x"}])
    assert response.status_code == 200 and "x-lcm-conversation-id" not in response.headers


LEFT_OPEN = """
import asyncio, sys
from pathlib import Path
from proxy.store.sqlite.store import SQLiteStore
kept = []
async def main():
    store = SQLiteStore(Path(sys.argv[1]))
    await store.open()
    kept.append(store)  # still referenced at exit, as a failed test's traceback or a crashed lifespan keeps it
asyncio.run(main())
print("returned")
"""


def test_a_store_left_open_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """aiosqlite's worker threads are not daemons by default: a store never closed kept the interpreter
    waiting forever at exit (a failing test hung the whole suite)."""
    done = subprocess.run(
        [sys.executable, "-c", LEFT_OPEN, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0 and done.stdout.strip() == "returned", done.stderr


def test_a_write_cancelled_while_it_begins_does_not_break_the_next(tmp_path: Path) -> None:
    """Cancelling a unit while its BEGIN is still queued in the writer's thread (a request hung up, shutdown)
    must not leave a transaction open under the next unit: its BEGIN would fail, a 500 for someone else."""
    import asyncio
    import threading

    from proxy.store.sqlite.store import SQLiteStore

    async def scenario() -> tuple[bool, int]:
        store = SQLiteStore(tmp_path / "data")
        await store.open()
        try:
            writer = store._writer
            assert writer is not None
            entered, gate = threading.Event(), threading.Event()

            def hold() -> None:  # the writer's thread is busy until the test opens the gate
                entered.set()
                gate.wait(30)

            busy = asyncio.ensure_future(writer._execute(hold))
            assert await asyncio.to_thread(entered.wait, 30)

            async def unit() -> None:
                async with store.write() as tx:
                    await tx.conn.execute("SELECT 1")

            abandoned = asyncio.ensure_future(unit())
            for _ in range(10_000):  # until its BEGIN is queued behind the held thread (a bounded wait)
                if writer._tx.qsize() > 0:
                    break
                await asyncio.sleep(0)
            assert writer._tx.qsize() == 1, "the unit's BEGIN never reached the writer's queue"
            abandoned.cancel()  # while its BEGIN waits in the queue
            gate.set()
            await asyncio.gather(abandoned, busy, return_exceptions=True)
            async with store.write() as tx:  # must work
                cursor = await tx.conn.execute("SELECT count(*) FROM conversations")
                row = await cursor.fetchone()
                await cursor.close()
            return abandoned.cancelled(), int(row[0]) if row else -1
        finally:
            await store.close()

    assert asyncio.run(scenario()) == (True, 0)


def test_a_write_cancelled_again_and_again_while_it_begins_does_not_break_the_next(tmp_path: Path) -> None:
    """Starlette cancels a hung-up request through an anyio cancel scope, which cancels every await inside it
    again, the unit's cleanup included. Its BEGIN IMMEDIATE, waiting for another worker's write lock, must still
    be undone before the lock is released: the next unit's BEGIN failed with "cannot start a transaction within
    a transaction" (a 500 for another client)."""
    import asyncio
    import sqlite3
    import threading

    import anyio

    from proxy.store.sqlite.store import SQLiteStore

    async def scenario() -> int:
        this, other = SQLiteStore(tmp_path / "data"), SQLiteStore(tmp_path / "data")  # two workers, one file
        await this.open()
        await other.open()
        holder = sqlite3.connect(this.path, isolation_level=None, check_same_thread=False)
        try:
            holder.execute("BEGIN IMMEDIATE")  # the other worker is writing
            writer = this._writer
            assert writer is not None
            async with anyio.create_task_group() as group:

                async def unit() -> None:
                    async with this.write():
                        pass

                group.start_soon(unit)
                for _ in range(10_000):  # until its BEGIN IMMEDIATE is in the writer's thread (a bounded wait)
                    if this._lock.locked() and writer._tx.qsize() == 0:
                        break
                    await asyncio.sleep(0)
                assert this._lock.locked(), "the unit never began"
                group.cancel_scope.cancel()  # the client went away
                # The other worker commits (from its own thread: every await here is cancelled too), and the
                # unit's BEGIN gets the lock: it must be undone before this worker's next unit begins.
                committer = threading.Thread(target=holder.execute, args=("COMMIT",))
                committer.start()
            committer.join(30)
            async with other.write():
                pass
            async with this.write() as tx:  # this worker's next request
                cursor = await tx.conn.execute("SELECT count(*) FROM conversations")
                row = await cursor.fetchone()
                await cursor.close()
            return int(row[0]) if row else -1
        finally:
            holder.close()
            await this.close()
            await other.close()

    assert asyncio.run(scenario()) == 0


def test_a_database_locked_by_another_process_is_a_retryable_503(proxy_factory: Any, monkeypatch: Any) -> None:
    """SQLite's "database is locked" (another worker, the operator's CLI holding the write lock past the busy
    timeout) was an internal 500 marked x-should-retry: false; it is a 503 the SDKs retry."""
    import sqlite3

    from proxy.store.sqlite import store as store_module

    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 100)
    proxy = proxy_factory()
    messages = [{"role": "user", "content": "hello while the database is locked"}]
    other = sqlite3.connect(Path(proxy.config.general_settings.resolved_data_dir()) / store_module.DB_NAME)
    other.isolation_level = None
    other.execute("BEGIN IMMEDIATE")  # another process's write transaction, held
    try:
        refused = chat(proxy, messages)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "store_busy" and refused.json()["error"]["type"] == "server_error"
    assert refused.headers.get("x-should-retry") != "false" and refused.headers["retry-after"] == "1"
    assert chat(proxy, messages).status_code == 200  # the retry, once the lock is gone
