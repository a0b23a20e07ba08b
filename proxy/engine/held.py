"""Recalled excerpts stay where they were forwarded (docs/context.md, "Cache-stable").

Auto-recall (``proxy.engine.auto_recall``) puts its block into the newest user message (or a tool round's last
result). Were the next request to carry that message without it, its prefix would differ from the one the model
just read from that message on: a provider bills it again uncached, and llama.cpp's one slot evaluates it all
again, the previous exchange and the new block included, on every turn of a compacted conversation. So each
block stays in its message on the following requests, as long as what comes before the raw messages (the ledger,
the summaries) and the first raw message forwarded are those it was placed after: until the next compaction or
eviction moves the cut, when the context is read again from there anyway and the blocks are let go. The newest
question's block comes first (it leaves out what the held ones already show: auto-recall's "adds nothing"); the
blocks held get the room left in the request's limit, oldest first, so they never push a request over it, and
one that no longer fits gives way with those after it (the next request is read again from there).

Per process and bounded: a request another replica answers, or the first after a restart, lets the blocks go
(one prefix read again, nothing else lost: the excerpts come back when asked for).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from proxy.dialects import Dialect
from proxy.types import Message

MAX_CONVERSATIONS = 10_000


@dataclass(frozen=True)
class Block:
    """One recall block as forwarded: into message ``seq`` (whose digest without it was ``anchor``), after its
    content or before it."""

    seq: int
    text: str
    tokens: int
    ids: tuple[int, ...]
    anchor: str
    after: bool = False


def digest(message: Message) -> str:
    """What a block's message was: a block goes back only into the very same message (a deletion that kept a
    prefix, and new messages after it, may put another message at its place)."""
    try:
        data = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # (a value orjson cannot write: the block is not held)
        return ""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass(frozen=True)
class Held:
    """The blocks forwarded after one prefix (``key``), each in its message."""

    first_raw: int
    summaries: tuple[str, ...]
    key: str
    blocks: tuple[Block, ...]


def prefix_key(prefix: str | None, first_raw: int) -> str:
    """What the blocks were placed after: the text before the raw messages, and the first raw message."""
    return hashlib.sha256(f"{first_raw}\0{prefix or ''}".encode()).hexdigest()


def apply(
    dialect: Dialect, raw: Sequence[Message], first_raw: int, blocks: Sequence[Block]
) -> tuple[list[Message], tuple[Block, ...]]:
    """``raw`` (from seq ``first_raw``) with each block back in its message, as it was forwarded, and the
    blocks that went back (a block whose message is no longer the one it went into does not)."""
    out, placed = list(raw), []
    for block in blocks:
        i = block.seq - first_raw
        if 0 <= i < len(out) and block.anchor and digest(out[i]) == block.anchor:
            out[i] = dialect.append(out[i], block.text) if block.after else dialect.prepend(out[i], block.text)
            placed.append(block)
    return out, tuple(placed)


class HeldRecall:
    """The blocks each conversation's last assembled request forwarded (this process's)."""

    def __init__(self) -> None:
        self._held: dict[str, Held] = {}

    def get(self, conversation_id: str, count: int) -> Held | None:
        """The blocks held for the conversation, when every one is in a message the request still carries."""
        held = self._held.get(conversation_id)
        if held is None or any(b.seq >= count for b in held.blocks):
            return None
        return held

    def keep(self, conversation_id: str, held: Held) -> None:
        if not held.blocks:
            self._held.pop(conversation_id, None)
            return
        if len(self._held) >= MAX_CONVERSATIONS and conversation_id not in self._held:
            self._held.pop(next(iter(self._held)))  # the oldest kept
        self._held[conversation_id] = held

    def drop(self, conversation_id: str) -> None:
        self._held.pop(conversation_id, None)
