"""``lcm-proxy doctor``: check that a database keeps every promise the proxy makes about it.

Checks: SQLite's own integrity and foreign keys, the full-text indexes, the migrations; per conversation,
contiguous messages, a context whose summaries resolve and cover messages [0, summarized_upto) without a
gap, summaries that link to exactly the sources they claim (leaves: their message range; condensed nodes:
children that tile their range), so every message is reachable from the active context; per stored file,
that it exists under the data directory (no symlinks), has mode 0600 in 0700 folders, and still has the
content its hash names; and that every recorded payload path of a stored message holds a well-formed
segments object whose file references all have their file. Files left behind by processes that died
mid-request (partial pending files, stored files that no row names) are reported by count and size, and
``--repair`` deletes them (``run_repair``; the rule that keeps that safe beside a running server is in
``proxy.store.files``). A deleted conversation kept for its forks (``proxy.engine.deletion``) must have a
live fork still, and no context of its own. Each standing instruction (``ledger_items``) names the message of
its own conversation at its seq, and what superseded it is an item of the same conversation (a fork's copies
point at the fork's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from proxy.engine.deletion import shared_prefix
from proxy.engine.intercept import SEGMENTS_KEY
from proxy.store.base import Blobs, Store
from proxy.store.files import PENDING_MAX_AGE, DiskFile, FileStore
from proxy.store.records import LEDGER_STATES, ConversationRecord

log = logging.getLogger("lcm_proxy.files")


def _segment_problem(segment: Any) -> str | None:
    """Why ``segment`` is not a piece the interceptor writes (a text piece or a file reference), if it is not."""
    if isinstance(segment, str):
        return None
    if not isinstance(segment, dict) or not isinstance(segment.get("ref"), str):
        return f"segment {segment!r:.80} is neither text nor a file reference"
    if set(segment) - {"ref", "encoding"} or segment.get("encoding", "base64") != "base64":
        return f"file reference {segment!r:.80} has unexpected fields"
    return None


def _segments_at(original: Any, path: Any) -> tuple[list[Any], str | None]:
    """The segments stored at one recorded path, or why that path holds no well-formed segments object."""
    if not isinstance(path, list) or not path or not all(isinstance(k, str | int) for k in path):
        return [], f"recorded payload path {path!r:.80} is not a path"
    target = original
    for key in path:
        in_object = isinstance(target, dict) and isinstance(key, str) and key in target
        in_array = isinstance(target, list) and type(key) is int and 0 <= key < len(target)
        if not (in_object or in_array):
            return [], f"recorded payload path {path} does not exist in the message"
        target = target[key]
    if not isinstance(target, dict) or set(target) != {SEGMENTS_KEY} or not isinstance(target[SEGMENTS_KEY], list):
        return [], f"recorded payload path {path} does not hold a segments object"
    segments = target[SEGMENTS_KEY]
    problem = next((p for p in map(_segment_problem, segments) if p is not None), None)
    return segments, None if problem is None else f"recorded payload path {path}: {problem}"


def _payload_refs(original: Any, paths: Any) -> tuple[list[str], list[str]]:
    """File ids referred to by a stored message, and problems with its recorded paths.

    Only the recorded paths are read, as ``restore`` and ``view_message`` do: anywhere else the message is
    the client's own content, and a client may well send ``{"$lcm_segments": ...}`` in metadata, extra
    fields or content parts. Reading those as references would report files that never existed (for ever,
    since stored messages do not change) or crash on shapes the interceptor never writes."""
    if not isinstance(paths, list):
        return [], [f"recorded payload paths {paths!r:.80} are not a list"]
    refs: list[str] = []
    problems: list[str] = []
    for path in paths:
        segments, problem = _segments_at(original, path)
        if problem is not None:
            problems.append(problem)
            continue
        refs += [segment["ref"] for segment in segments if isinstance(segment, dict)]
    return refs, problems


async def check_database(store: Store, files: Blobs, *, verify_hashes: bool = True) -> list[str]:
    problems: list[str] = await store.integrity()
    search = store.search
    for conversation in await store.read.conversations(None, limit=1_000_000, deleted=True):
        cid = conversation.id
        if conversation.deleted_at is not None:
            problems += await _check_tombstone(store, conversation)
        seqs = await search.message_seqs(cid)
        if seqs != list(range(len(seqs))) or len(seqs) != conversation.message_count:
            problems.append(f"{cid}: messages are not contiguous 0..{conversation.message_count - 1}")
        expected_start = 0
        for item_id, found in await search.context_items(cid):
            if not found:
                problems.append(f"{cid}: context item {item_id} does not resolve to a summary")
                continue
            summary = await store.read.summary(item_id)
            assert summary is not None
            if summary.start_seq != expected_start:
                problems.append(
                    f"{cid}: context summary {item_id} starts at {summary.start_seq}, expected {expected_start}"
                )
            expected_start = summary.end_seq
            problems += await _check_summary(store, cid, item_id, set())
        if expected_start != conversation.summarized_upto:
            problems.append(
                f"{cid}: summaries cover messages up to {expected_start} but the context says {conversation.summarized_upto}:"
                " some messages are unreachable"
            )
        problems += await _check_ledger(store, cid)
        for message_id, seq, original, paths in await search.payload_messages(cid):
            where = f"{cid}: message {seq} (msg_{message_id})"
            refs, path_problems = _payload_refs(orjson.loads(original), orjson.loads(paths))
            problems += [f"{where}: {problem}" for problem in path_problems]
            for ref in refs:
                if await store.read.file(conversation.tenant, ref) is None:
                    problems.append(f"{where} refers to missing file {ref}")

    problems += await files.check(await search.all_files(), verify_hashes=verify_hashes)
    if isinstance(files, FileStore):
        partial, unnamed = await leftover_files(store, files)
        if partial:
            problems.append(
                f"files: {_amount(partial)} partial file(s) left by interrupted writes (--repair deletes them)"
            )
        if unnamed:
            problems.append(f"files: {_amount(unnamed)} stored file(s) that no row names (--repair deletes them)")
    return sorted(set(problems))


async def _check_tombstone(store: Store, conversation: ConversationRecord) -> list[str]:
    """A deleted conversation stays only while a live fork shares its prefix, holding no context of its own."""
    problems: list[str] = []
    _, forks = shared_prefix(conversation.id, await store.read.family(conversation.id))
    if not forks:
        problems.append(f"{conversation.id}: deleted, but kept although no live fork shares its prefix any more")
    if conversation.summarized_upto or await store.search.context_items(conversation.id):
        problems.append(f"{conversation.id}: deleted, but it still has a context of its own")
    return problems


def _amount(found: Sequence[DiskFile]) -> str:
    return f"{len(found)} ({sum(f.bytes for f in found):,} bytes)"


@contextlib.contextmanager
def _cutoff(files: FileStore, min_age: float | None) -> Iterator[float]:
    """The mtime before which a leftover is surely no running request's: with ``min_age``, that long ago
    (whatever the lock says: the startup collection, which must also be safe beside workers on other hosts
    sharing the directory, where a lock may not reach); else anything while no process is writing payloads
    (none can start until the block ends), or ``PENDING_MAX_AGE`` ago."""
    if min_age is not None:
        yield time.time() - min_age
        return
    with files.alone() as alone:
        yield math.inf if alone else time.time() - PENDING_MAX_AGE


async def leftover_files(
    store: Store, files: FileStore, min_age: float | None = None
) -> tuple[list[DiskFile], list[DiskFile]]:
    """(partial files, stored files no row names) that no running request can still be writing (``_cutoff``)."""
    with _cutoff(files, min_age) as cutoff:
        partial = [f for f in await asyncio.to_thread(files.partial_files) if f.mtime < cutoff]
        named = {path for _, path, _ in await store.search.all_files()}
        stored = await asyncio.to_thread(files.stored_files)
        unnamed = [f for f in stored if f.relative not in named and f.mtime < cutoff]
    return partial, unnamed


async def repair_files(store: Store, files: FileStore, batch: int = 200, *, min_age: float | None = None) -> list[str]:
    """Delete the leftovers ``leftover_files`` finds; one line per kind removed. A stored file is deleted only
    in a write transaction that finds no row naming it (rows and their files are published together).
    ``doctor --repair`` and the collection at startup (``collect_leftovers``, with ``min_age``)."""
    with _cutoff(files, min_age) as cutoff:
        partial = [f for f in await asyncio.to_thread(files.partial_files) if f.mtime < cutoff]
        removed_partial = await asyncio.to_thread(lambda: [f for f in partial if files.remove(f.relative)])
    _, unnamed = await leftover_files(store, files, min_age)
    removed: list[DiskFile] = []
    for start in range(0, len(unnamed), batch):
        chunk = unnamed[start : start + batch]
        async with store.write() as tx:
            named = await tx.known_file_paths([f.relative for f in chunk])
            removed += [f for f in chunk if f.relative not in named and files.remove(f.relative)]
    lines = (
        [f"deleted {_amount(removed_partial)} partial file(s) left by interrupted writes"] if removed_partial else []
    )
    lines += [f"deleted {_amount(removed)} stored file(s) that no row named"] if removed else []
    return lines


async def collect_leftovers(store: Store, files: FileStore, min_age: float) -> list[str]:
    """At startup, in the background: delete what processes killed mid-request left (``repair_files``) that is
    older than ``min_age`` (longer than any request of a live worker can have been writing). Logged, counts
    and sizes only; a failure is logged and left for the next start or ``doctor --repair``."""
    try:
        lines = await repair_files(store, files, min_age=min_age)
    except Exception:  # (never the server's concern: it serves on)
        log.exception("collecting leftover payload files failed")
        return []
    for line in lines:
        log.info("leftover payload files: %s", line)
    return lines


async def _check_ledger(store: Store, cid: str) -> list[str]:
    items = await store.search.ledger(cid, include_superseded=True)
    if not items:
        return []
    ids = {item.id for item in items}
    messages = {m.id: m for m in await store.search.messages_by_id([item.message_id for item in items])}
    problems: list[str] = []
    for item in items:
        source = messages.get(item.message_id)
        if source is None or (source.conversation_id, source.seq) != (cid, item.seq):
            problems.append(f"{cid}: ledger item {item.id} does not name its message {item.seq}")
        if (item.superseded_seq is None) != (item.superseded_by is None) or (
            item.superseded_by is not None and item.superseded_by not in ids
        ):
            problems.append(f"{cid}: ledger item {item.id} is superseded by {item.superseded_by}, not one of its items")
        if item.state not in LEDGER_STATES:
            problems.append(f"{cid}: ledger item {item.id} has the unknown state {item.state!r}")
    return problems


async def _check_summary(store: Store, cid: str, summary_id: str, seen: set[str]) -> list[str]:
    if summary_id in seen:
        return [f"{cid}: summary {summary_id} is part of a cycle"]
    seen.add(summary_id)
    summary = await store.read.summary(summary_id)
    if summary is None:
        return [f"{cid}: summary {summary_id} does not exist"]
    sources = await store.search.summary_sources(summary_id)
    problems: list[str] = []
    if summary.kind == "leaf":
        seqs = [seq for message_id, _, seq in sources if message_id is not None]
        if seqs != list(range(summary.start_seq, summary.end_seq)) or len(seqs) != len(sources):
            problems.append(
                f"{cid}: leaf {summary_id} does not link to its messages {summary.start_seq}-{summary.end_seq - 1}"
            )
    else:
        children = [child for _, child, _ in sources if child is not None]
        if len(children) != len(sources) or not children:
            problems.append(f"{cid}: condensed {summary_id} has no child summaries")
        position = summary.start_seq
        for child_id in children:
            child = await store.read.summary(child_id)
            if child is None:
                problems.append(f"{cid}: condensed {summary_id} links to missing {child_id}")
                continue
            if child.start_seq != position:
                problems.append(f"{cid}: children of {summary_id} leave a gap at message {position}")
            position = child.end_seq
            problems += await _check_summary(store, cid, child_id, seen)
        if children and position != summary.end_seq:
            problems.append(f"{cid}: children of {summary_id} end at {position}, not {summary.end_seq}")
    return problems
