"""Property test: clients that continue, re-send, regenerate, edit and run in parallel never make the store
duplicate or lose a message, and every conversation exports to what its client last sent."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.engine.canonical import canonical
from proxy.engine.ingest import export_conversation
from tests.support.engine import assistant, open_engine, user

# An operation: (client index, kind, small integer used as payload/position).
operations = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.sampled_from(["continue", "continue", "continue", "resend", "regenerate", "edit", "parallel"]),
        st.integers(0, 1000),
    ),
    min_size=1,
    max_size=25,
)


def next_turn(transcript: list[dict[str, Any]], client: int, n: int) -> list[dict[str, Any]]:
    # Opening messages are shared between clients on purpose: conversations must still never mix.
    if not transcript:
        return [user("hello")]
    return [*transcript, assistant(f"reply {n % 3}"), user(f"c{client} says {n % 5}")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_random_client_behaviour_is_lossless(ops: list[tuple[int, str, int]]) -> None:
    assert asyncio.run(_scenario(ops)) == len(ops)  # the checks run inside, after every request


async def _scenario(ops: list[tuple[int, str, int]]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        async with open_engine(Path(tmp)) as (ingestor, store, files):
            transcripts: dict[int, list[dict[str, Any]]] = {}
            last_conversation: dict[int, str] = {}
            processed = 0
            for client, kind, n in ops:
                t = transcripts.get(client, [])
                if kind == "continue" or not t:
                    t = next_turn(t, client, n)
                elif kind == "regenerate":
                    t = t[: max(1, len(t) - 1)] if t[-1]["role"] == "assistant" else t
                elif kind == "edit":
                    cut = n % len(t)
                    t = [*t[:cut], user(f"edited by c{client} #{n}")]
                elif kind == "parallel":
                    t2 = next_turn(t, client, n)
                    results = await asyncio.gather(
                        ingestor.ingest("tenant", t2), ingestor.ingest("tenant", t2), ingestor.ingest("tenant", t)
                    )
                    assert results[0].conversation_id == results[1].conversation_id
                    t = t2
                result = await ingestor.ingest("tenant", t)
                processed += 1
                transcripts[client] = t
                assert result.conversation_id is not None
                last_conversation[client] = result.conversation_id
                exported = await export_conversation(store, files, "tenant", result.conversation_id)
                # The conversation holds exactly what this client sent (a longer stored branch is fine only
                # for an "earlier" re-send, which serves the prefix).
                assert [canonical(m) for m in exported[: len(t)]] == [canonical(m) for m in t]
                if result.action != "earlier":
                    assert len(exported) == len(t)
            # No duplicates or gaps: every conversation's seqs are exactly 0..count-1.
            for conversation in await store.read.conversations("tenant"):
                seqs = [m.seq for m in await store.read.messages(conversation.id)]
                assert seqs == list(range(conversation.message_count))
            return processed
