"""A 300-turn conversation through the real proxy against a small-window fake model.

Every forwarded chat request is checked: within budget, tool pairing valid, the newest user message
verbatim, summaries present once compaction started; every stored message stays reachable from the
active context through summary links.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from proxy.engine.canonical import split_instructions
from proxy.engine.ingest import export_conversation
from proxy.store.location import Location
from proxy.store.migrate import Migration
from proxy.store.sqlite.store import SQLiteStore
from tests.support.engine import unreachable_messages
from tests.support.fakes import FakeUpstream
from tests.support.sim import (
    MAX_TOKENS,
    TOOLS,
    WINDOW,
    ScriptedModel,
    Stats,
    check_tool_pairing,
    forwarded_tokens,
    is_summary_request,
    start_sim_proxy,
    tool_result,
    user_turn,
    without_recall,
)


def test_three_hundred_turns_stay_bounded_and_lossless(
    proxy_factory: Any, upstream_url: str, fake_upstream: FakeUpstream, pg_dsn: str
) -> None:
    model = ScriptedModel()
    fake_upstream.responder = model
    proxy = start_sim_proxy(proxy_factory, upstream_url)
    store_dir = Path(str(proxy.config.general_settings.data_dir))
    transcript: list[dict[str, Any]] = [{"role": "system", "content": "You are a project assistant."}]
    stats = Stats()
    conversation_id = None
    summaries_seen = False
    checked = 0
    with httpx.Client(base_url=proxy.base_url, timeout=60) as client:
        for turn in range(300):
            transcript.append(user_turn(turn))
            for _round in range(3):  # answer tool calls until the model replies with text
                before = len(fake_upstream.requests)
                response = client.post(
                    "/chat/completions",
                    json={"model": "small", "messages": transcript, "tools": TOOLS, "max_tokens": MAX_TOKENS},
                )
                assert response.status_code == 200, response.text
                conversation_id = conversation_id or response.headers["x-lcm-conversation-id"]
                assert response.headers["x-lcm-conversation-id"] == conversation_id
                chats = [r.body for r in fake_upstream.requests[before:] if not is_summary_request(r.body)]
                assert len(chats) == 1
                sent = chats[0]
                checked += 1
                # Bounded.
                assert forwarded_tokens(sent) + MAX_TOKENS <= WINDOW, (turn, forwarded_tokens(sent))
                # Tool pairing.
                check_tool_pairing(sent["messages"])
                # Instructions verbatim and first; newest message verbatim (huge pastes stubbed).
                assert sent["messages"][0] == transcript[0]
                newest = transcript[-1]
                if "<file " in str(newest.get("content")):
                    assert without_recall(sent["messages"][-1])["content"].startswith(
                        "Look at this file [LCM File: file_"
                    )
                else:
                    assert without_recall(sent["messages"][-1]) == newest
                has_summary = any(str(m.get("content", "")).startswith('<summary id="sum_') for m in sent["messages"])
                summaries_seen = summaries_seen or has_summary
                if summaries_seen:
                    assert has_summary, f"turn {turn}: summaries vanished from the context"
                stats.forwarded.append(sent["messages"])
                stats.headers.append(
                    response.headers["x-lcm-compaction"] + "/" + response.headers["x-lcm-tokens-forwarded"]
                )
                message = response.json()["choices"][0]["message"]
                transcript.append({k: v for k, v in message.items() if v is not None})
                if not message.get("tool_calls"):
                    break
                transcript += [tool_result(call, turn) for call in message["tool_calls"]]
                # Traceable: every stored message is reachable from the active context, after every request.
                asyncio.run(_check_reachability(store_dir, conversation_id))
    asyncio.run(_check_reachability(store_dir, conversation_id))
    assert summaries_seen and model.summary_calls > 0
    stability = stats.prefix_stability()
    print(f"\nprefix stability {stability:.3f} over {checked} requests, {model.summary_calls} summarizer calls")
    if stability < 0.9:
        print(stats.breaks()[:40])
        print(stats.headers[:120])
    assert stability >= 0.9
    _, client_messages = split_instructions(transcript)
    assert len(client_messages) > 600
    # Moving up: the session's store, migrated into PostgreSQL, exports the same transcripts.
    outcome = asyncio.run(Migration(store_dir, pg_dsn).run())
    assert outcome.problems == [] and outcome.mismatches() == []
    before = asyncio.run(_exports(Location(store_dir)))
    assert before and before == asyncio.run(_exports(Location(store_dir, pg_dsn)))


async def _exports(where: Location) -> dict[str, list[dict[str, Any]]]:
    store, files = where.stores()
    await store.open()
    try:
        return {c.id: await export_conversation(store, files, None, c.id) for c in await store.read.conversations()}
    finally:
        await store.close()


async def _check_reachability(data_dir: Path, conversation_id: str | None) -> None:
    assert conversation_id is not None
    store = SQLiteStore(data_dir)
    await store.open()
    try:
        assert await unreachable_messages(store, conversation_id) == set()
    finally:
        await store.close()
