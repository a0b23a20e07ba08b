"""Transcripts seen before: what this process already worked out about the prefix of a re-sent transcript.

Every request re-sends the whole transcript, and almost all of it is what an earlier request of the same
caller sent. Validating every message again (the chat door) and hashing every message's canonical form for
identity (``proxy.engine.canonical``) cost a few microseconds a message: at 5,000 messages, most of what the
proxy adds to a request. Both are functions of the messages' values alone (and of the scope and the wire
format, for the chain hashes), so what they gave for a transcript holds again for the same values.

A transcript's *fingerprint* is the SHA-256 of its messages serialised by orjson with sorted keys (one C call
for the whole list and one hash: about 1.5 ms for 5,000 messages, 1.5 MB), taken over the open array
``[m0,m1,…`` with a digest at each of its last ``CHECKPOINTS`` prefixes. A request *matches* a remembered
transcript when one of its own prefixes and one of that transcript's serialise to the same number of bytes with
the same digest (a continuation adds messages; Claude Code also moves its cache breakpoint off the newest one).
Equal bytes mean equal values (orjson writes each value one way, and distinct values differently: ``1`` and
``1.0``, ``true`` and ``1``), so the remembered facts hold for that prefix:

* ``chains``: the chain hashes of those messages within one scope and wire format: identity hashes only the
  messages after them;
* ``validated``: the chat door's validation accepted every one of those messages (``check_message`` and the
  body's bounds depend on a message's value only, the index only names it in an error); the door then checks
  only the others.

Nothing here reads the store: the facts are functions of the request's content, so no write (another replica's,
a deletion, a fork) can make them stale; identity still asks the store every time. A message edited anywhere
changes the bytes, so the edited transcript matches no longer prefix than the messages before the edit, and
everything from there on is validated and hashed in full. Memory is bounded (entries, chain hashes; least
recently used out); a transcript that matches nothing (a first turn, a body orjson cannot write back) is handled
in full, as before.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.engine.canonical import chain_hashes
from proxy.engine.rows import OFF_LOOP_CHARS, weight
from proxy.types import Messages

MAX_ENTRIES = 4096  # remembered transcripts
MAX_CHAINS = 400_000  # chain hashes held by all of them together (about 90 bytes each: ~36 MB at most)
CHECKPOINTS = 16  # a transcript's last prefixes whose digests are taken: a request may add up to this many
MAX_CANDIDATES = 8  # remembered transcripts of one bucket a request is compared with (most recent first)
_SORTED = orjson.OPT_SORT_KEYS

Key = tuple[str, str, bytes]  # (partition, wire format, digest of the first message): a bucket of transcripts
Checkpoint = tuple[int, int, bytes]  # (messages, bytes of their open array, digest of those bytes)


@dataclass(eq=False)
class _Entry:
    key: Key
    checkpoints: tuple[Checkpoint, ...]  # its last prefixes, the whole transcript's last
    scope: str | None  # whose chain hashes ``chains`` are (None: none known)
    chains: list[str] | None
    validated: bool


@dataclass(eq=False)
class Fingerprint:
    """One request's transcript as ``Seen`` knows it: how much of it was seen before, and what was learnt."""

    messages: list[Any]  # the request's own list (instructions included): the engine checks it is handed the same
    length: int  # of ``messages`` when it was looked at
    start: int  # leading instructions, outside the transcript
    dialect: str
    key: Key
    checkpoints: tuple[Checkpoint, ...]
    known: int = 0  # leading transcript messages that match a remembered transcript (0: none)
    entry: _Entry | None = None  # the remembered transcript they match
    validated: bool = False  # set by the chat door once this request passed its validation in full

    @property
    def valid_span(self) -> range:
        """Indexes of ``messages`` that the chat door validated before, with the same values."""
        validated = self.entry is not None and self.entry.validated
        return range(self.start, self.start + (self.known if validated else 0))

    def fits(self, messages: Any, start: int, dialect: str) -> bool:
        """Whether this fingerprint describes ``messages`` (the same list, unchanged in length and split)."""
        same = messages is self.messages and len(messages) == self.length
        return same and start == self.start and dialect == self.dialect

    def known_chains(self, scope: str) -> list[str]:
        """Chain hashes of the known prefix within ``scope`` (empty when none are remembered for it)."""
        entry = self.entry
        if entry is None or entry.scope != scope or entry.chains is None:
            return []
        return entry.chains[: self.known]


class Seen:
    """The bounded memo of transcripts this process has handled (see the module's docstring)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_chains: int = MAX_CHAINS) -> None:
        self.max_entries = max_entries
        self.max_chains = max_chains
        self._buckets: dict[Key, list[_Entry]] = {}
        self._lru: OrderedDict[int, _Entry] = OrderedDict()
        self._chains = 0

    @property
    def entries(self) -> int:
        return len(self._lru)

    def look(self, partition: str, dialect: str, messages: Any, start: int) -> Fingerprint | None:
        """``match(measure(...))``: the fingerprint of ``messages[start:]`` (``start`` leading instructions),
        matched against what ``partition`` (a tenant, or a scope) sent before in ``dialect``."""
        fingerprint = measure(partition, dialect, messages, start)
        return self.match(fingerprint) if fingerprint is not None else None

    def match(self, fingerprint: Fingerprint) -> Fingerprint:
        """``fingerprint`` with the longest prefix it shares with a remembered transcript of its bucket."""
        mine = set(fingerprint.checkpoints)
        for entry in self._buckets.get(fingerprint.key, ())[:MAX_CANDIDATES]:
            shared = [c for c in entry.checkpoints if c in mine]
            if shared and shared[-1][0] > fingerprint.known:
                fingerprint.known, fingerprint.entry = shared[-1][0], entry
        if fingerprint.entry is not None:
            self._lru.move_to_end(id(fingerprint.entry))
        return fingerprint

    async def chains(
        self, scope: str, messages: Messages, start: int, dialect: str, fingerprint: Fingerprint | None
    ) -> list[str]:
        """The chain hashes of ``messages[start:]`` (the transcript) within ``scope``, hashing only the messages
        after the prefix this process worked them out for before; the transcript is remembered with them.
        ``fingerprint``: the door's, when it took one of ``messages``."""
        if fingerprint is None or not fingerprint.fits(messages, start, dialect):
            args = (scope, dialect, messages, start)  # a long transcript is serialised and hashed off the loop
            measured = await asyncio.to_thread(measure, *args) if weight(messages) >= OFF_LOOP_CHARS else measure(*args)
            fingerprint = self.match(measured) if measured is not None else None
        transcript = messages[start:]
        known = fingerprint.known_chains(scope) if fingerprint is not None else []
        # Hashing canonical forms is CPU work proportional to what is new: a large one goes to a worker thread,
        # so that the event loop keeps serving other requests meanwhile.
        if len(known) < len(transcript) and weight(transcript[len(known) :]) >= OFF_LOOP_CHARS:
            chains = await asyncio.to_thread(chain_hashes, scope, transcript, dialect, known)
        else:
            chains = chain_hashes(scope, transcript, dialect, known)
        if fingerprint is not None:
            self.record(fingerprint, scope, chains)
        return chains

    def record(self, fingerprint: Fingerprint, scope: str | None, chains: list[str] | None) -> None:
        """Remember ``fingerprint``'s transcript: its chain hashes within ``scope`` (None: not computed), and
        whether the chat door validated it (``Fingerprint.validated``). What it replaces is dropped: the
        transcript it continued, and the same transcript remembered before (a conversation keeps one entry)."""
        whole = fingerprint.checkpoints[-1]
        same = [e for e in self._buckets.get(fingerprint.key, ()) if e.checkpoints[-1] == whole]
        for old in [fingerprint.entry, *same]:
            if old is not None and old.scope == scope:
                self._drop(old)
        if len(chains or ()) > self.max_chains:
            return  # a transcript past the whole bound is not kept (and evicts nothing)
        entry = _Entry(
            fingerprint.key, fingerprint.checkpoints, scope if chains is not None else None, chains,
            fingerprint.validated,
        )  # fmt: skip
        self._buckets.setdefault(fingerprint.key, []).insert(0, entry)
        self._lru[id(entry)] = entry
        self._chains += len(chains or ())
        while len(self._lru) > self.max_entries or self._chains > self.max_chains:
            self._drop(next(iter(self._lru.values())))  # least recently used first

    def _drop(self, entry: _Entry) -> None:
        if self._lru.pop(id(entry), None) is None:
            return
        self._chains -= len(entry.chains or ())
        bucket = self._buckets.get(entry.key)
        if bucket is not None:
            bucket[:] = [e for e in bucket if e is not entry]
            if not bucket:
                del self._buckets[entry.key]


def measure(partition: str, dialect: str, messages: Any, start: int) -> Fingerprint | None:
    """The fingerprint of ``messages[start:]``, matched with nothing yet (no state: any thread may run it).
    None when there is no transcript or orjson cannot serialise it (nesting past its limit, integers past 64
    bits): handled in full then. Any JSON value is accepted: the chat door looks before it validates."""
    if not isinstance(messages, list) or start >= len(messages):
        return None
    transcript = messages[start:]
    try:
        data = orjson.dumps(transcript, option=_SORTED)
        # The open array of the first c messages, for the last CHECKPOINTS values of c.
        sizes = {len(transcript): len(data) - 1}
        first = 1 + len(orjson.dumps(transcript[0], option=_SORTED))
        for c in range(len(transcript) - 1, max(0, len(transcript) - CHECKPOINTS), -1):
            sizes[c] = sizes[c + 1] - 1 - len(orjson.dumps(transcript[c], option=_SORTED))
    except TypeError:  # orjson.JSONEncodeError
        return None
    view = memoryview(data)
    checkpoints: list[Checkpoint] = []
    state, done = hashlib.sha256(), 0
    for c in sorted(sizes):  # one pass over the bytes, a digest at each checkpoint
        state.update(view[done : sizes[c]])
        done = sizes[c]
        checkpoints.append((c, done, state.copy().digest()))
    key = (partition, dialect, hashlib.sha256(view[:first]).digest())
    return Fingerprint(messages, len(messages), start, dialect, key, tuple(checkpoints))
