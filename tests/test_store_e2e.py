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

from tests.conftest import RunningProxy
from tests.fakes import FakeUpstream

REPO = Path(__file__).resolve().parent.parent


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
        assert list(response.iter_lines())[-2:] == ["data: [DONE]", ""] or "data: [DONE]" in response.read().decode()


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
    exported = subprocess.run(
        [sys.executable, "-m", "proxy", "export", conversation, "--config", str(config)],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout) == [
        message,
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "thanks"},
    ]
    listing = subprocess.run(
        [sys.executable, "-m", "proxy", "conversations", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert conversation in listing.stdout and "default" in listing.stdout
    shown = subprocess.run(
        [sys.executable, "-m", "proxy", "show", conversation, "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert shown.returncode == 0 and "stub" in shown.stdout and "[LCM File: file_" in shown.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "proxy", "show", "conv_nope", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert missing.returncode == 1 and "no conversation conv_nope" in missing.stderr


def test_bad_conversation_header_is_400(proxy: RunningProxy) -> None:
    response = chat(proxy, [{"role": "user", "content": "x"}], headers={"x-lcm-conversation-id": "a" * 300})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "x-lcm-conversation-id"


def test_disabled_lcm_is_a_plain_proxy(proxy_factory: Any, fake_upstream: FakeUpstream) -> None:
    from proxy.config import LcmSettings

    proxy = proxy_factory()
    proxy.app.state.lcm.config = proxy.config.model_copy(update={"lcm_settings": LcmSettings(enabled=False)})
    response = chat(proxy, [{"role": "user", "content": "x"}])
    assert response.status_code == 200 and "x-lcm-conversation-id" not in response.headers


LEFT_OPEN = """
import asyncio, sys
from pathlib import Path
from proxy.store.sqlite import SQLiteStore
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
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert done.returncode == 0 and done.stdout.strip() == "returned", done.stderr


def test_a_write_cancelled_while_it_begins_does_not_break_the_next(tmp_path: Path) -> None:
    """Cancelling a unit while its BEGIN is still queued in the writer's thread (a request hung up, shutdown)
    must not leave a transaction open under the next unit: its BEGIN would fail, a 500 for someone else."""
    import asyncio

    from proxy.store.sqlite import SQLiteStore

    slow = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000) SELECT count(*) FROM n"

    async def scenario() -> int:
        store = SQLiteStore(tmp_path / "data")
        await store.open()
        try:
            writer = store._writer
            assert writer is not None
            busy = asyncio.ensure_future(writer.execute(slow))  # the writer's thread is busy for a while

            async def unit() -> None:
                async with store.write() as tx:
                    await tx.conn.execute("SELECT 1")

            abandoned = asyncio.ensure_future(unit())
            await asyncio.sleep(0.05)  # its BEGIN is queued behind the slow query
            abandoned.cancel()
            await asyncio.gather(abandoned, return_exceptions=True)
            async with store.write() as tx:  # must work
                cursor = await tx.conn.execute("SELECT count(*) FROM conversations")
                row = await cursor.fetchone()
                await cursor.close()
            await busy
            return int(row[0]) if row else -1
        finally:
            await store.close()

    assert asyncio.run(scenario()) == 0
