"""The memo of transcripts seen before (``proxy.engine.seen``): a re-sent prefix is recognised by its bytes, an
edit anywhere is not, the chain hashes it hands back are the ones hashing from scratch gives, and it stays
bounded."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from proxy.engine.canonical import chain_hashes
from proxy.engine.ingest import export_conversation
from proxy.engine.seen import CHECKPOINTS, Seen, measure
from proxy.store.location import Location
from tests.support.engine import assistant, open_engine, run, user

SYSTEM = {"role": "system", "content": "be brief"}


def transcript(n: int, tag: str = "") -> list[dict[str, Any]]:
    return [SYSTEM, *(user(f"{tag}q{i}") if i % 2 == 0 else assistant(f"a{i}") for i in range(n))]


def chains(seen: Seen, scope: str, messages: list[dict[str, Any]], partition: str = "t") -> tuple[int, list[str]]:
    """(messages known before, chain hashes) of one request, looked at as the chat door does."""
    found = seen.look(partition, "chat", messages, 1)
    assert found is not None
    return found.known, asyncio.run(seen.chains(scope, messages, 1, "chat", found))


def test_a_continuation_matches_what_was_sent_and_hashes_only_the_new_messages() -> None:
    seen = Seen()
    messages = transcript(40)
    assert chains(seen, "s", messages) == (0, chain_hashes("s", messages[1:]))
    messages = [*messages, assistant("reply"), user("more")]
    assert chains(seen, "s", messages) == (40, chain_hashes("s", messages[1:]))
    assert chains(seen, "s", messages) == (42, chain_hashes("s", messages[1:]))  # a re-send: all of it
    assert seen.entries == 1  # a conversation keeps its latest transcript only
    # Claude Code moves its cache breakpoint: the newest message changed, the ones before still match.
    moved = [*messages[:-1], {**messages[-1], "name": "x"}, assistant("r2"), user("q2")]
    assert chains(seen, "s", moved) == (41, chain_hashes("s", moved[1:]))


def test_any_edit_of_the_values_is_not_the_same_prefix() -> None:
    seen = Seen()
    base = transcript(30)
    chains(seen, "s", base)
    for where, value in [(5, "q4!"), (5, 1), (25, "changed"), (30, "changed"), (29, None)]:
        edited = [dict(m) for m in base]
        edited[where]["content"] = value
        request = [*edited, user("n")]
        known, hashes = chains(seen, "s", request)
        assert known <= where - 1, (where, value)  # at most the transcript's messages before the edited one
        assert hashes == chain_hashes("s", request[1:])
    # Values equal in Python but not in JSON are told apart: 1, 1.0 and true.
    for a, b in [(1, 1.0), (1, True), (0, False)]:
        memo = Seen()
        chains(memo, "s", [SYSTEM, {"role": "user", "content": "x", "n": a}])
        found = memo.look("t", "chat", [SYSTEM, {"role": "user", "content": "x", "n": b}, user("y")], 1)
        assert found is not None and found.known == 0, (a, b)


def test_chains_stay_exact_over_random_continuations_edits_and_scopes() -> None:
    rng = random.Random(7)
    seen = Seen(max_entries=8)
    conversations = {f"c{i}": transcript(rng.randrange(1, 30), f"c{i}") for i in range(4)}
    for _ in range(300):
        name = rng.choice(list(conversations))
        messages = conversations[name]
        roll = rng.random()
        if roll < 0.5:
            messages = [*messages, *(user(f"n{rng.random()}") for _ in range(rng.randrange(1, CHECKPOINTS + 4)))]
        elif roll < 0.7 and len(messages) > 2:
            i = rng.randrange(1, len(messages))
            messages = [*messages[:i], {**messages[i], "content": f"edited {rng.random()}"}, *messages[i + 1 :]]
        elif roll < 0.8:
            messages = messages[: rng.randrange(2, len(messages) + 1)]
        conversations[name] = messages
        scope = rng.choice(["s", "s", "other"])
        assert chains(seen, scope, messages, partition=rng.choice(["t", "t", "u"]))[1] == chain_hashes(
            scope, messages[1:]
        )
    assert seen.entries <= 8


def test_the_memo_is_bounded() -> None:
    seen = Seen(max_entries=1000, max_chains=500)
    for i in range(50):
        chains(seen, "s", transcript(100, f"conversation {i}"))
        assert seen.entries <= 5
    seen = Seen(max_entries=3)
    for i in range(20):
        chains(seen, "s", transcript(3, f"conversation {i}"))
    assert seen.entries == 3
    seen = Seen(max_chains=500)
    chains(seen, "s", transcript(100))
    chains(seen, "s", transcript(600, "too long"))  # more than the whole memo may hold: not kept, evicts nothing
    assert seen.entries == 1
    assert chains(seen, "s", transcript(600, "too long")) == (0, chain_hashes("s", transcript(600, "too long")[1:]))


def test_what_orjson_cannot_write_back_is_handled_in_full() -> None:
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    assert measure("t", "chat", [user("a"), {"role": "user", "content": deep}], 0) is None
    assert measure("t", "chat", [user("a"), {"role": "user", "content": "x", "n": 2**70}], 0) is None
    assert measure("t", "chat", "not a list", 0) is None
    assert measure("t", "chat", [SYSTEM], 1) is None  # no transcript


def test_an_edited_old_message_in_a_long_resend_is_still_a_fork(where: Location) -> None:
    """With the memo warm (the same ingestor), an edit deep inside a 5,000-message transcript forks, and both
    versions export exactly as sent."""

    async def scenario() -> None:
        async with open_engine(where) as (ingestor, store, files):
            ingestor.standing = False  # the reader is not what this is about, and is most of a first turn's time
            messages = transcript(5000)
            first = await ingestor.ingest("t", messages)
            longer = [*messages, assistant("reply"), user("next")]
            again = await ingestor.ingest("t", longer)
            assert (again.conversation_id, again.action, again.appended) == (first.conversation_id, "append", 2)
            edited = [dict(m) for m in longer]
            edited[1234]["content"] += " (edited)"
            fork = await ingestor.ingest("t", edited)
            assert fork.action == "fork" and fork.forked_from == first.conversation_id
            assert await export_conversation(store, files, "t", fork.conversation_id) == edited
            assert await export_conversation(store, files, "t", first.conversation_id) == longer
            resent = await ingestor.ingest("t", longer)  # the original, re-sent after the fork: still itself
            assert (resent.conversation_id, resent.action) == (first.conversation_id, "same")

    run(scenario())
