"""``lcm_grep``: search the messages, summaries and stored files a recall scope sees.

Regular expressions run on RE2 (``proxy.engine.patterns``), in a worker thread with one deadline for the whole
call: neither ``a{1000000000}`` nor ``(a|aa)+$`` may freeze the proxy or hold the request past
``GREP_DEADLINE``. Full-text mode asks the store's index with the pattern's words only.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from typing import Any

from proxy.engine import patterns
from proxy.engine.errors import RecallError, UnsafePattern
from proxy.engine.recall.lookup import Lookup, int_arg
from proxy.engine.recall.scope import Scope
from proxy.store.base import Phrase
from proxy.store.records import FileRecord

MAX_PATTERN = patterns.MAX_PATTERN_CHARS
GREP_DEADLINE = 3.0  # seconds of searching per lcm_grep call
MAX_FILE_SCAN = 4 << 20


def search_phrases(text: str) -> list[Phrase]:
    """A user's words as full-text search terms, OR-ed, so the store ranks the messages that share the most of
    them first. Words are letters and digits only: no store's query syntax can slip in."""
    words = [w.lower() for w in re.findall(r"[^\W_]+", text) if w.upper() not in ("AND", "OR", "NOT", "NEAR")]
    return [Phrase((w,)) for w in words[:16]]


async def grep(lookup: Lookup, scope: Scope, args: dict[str, Any]) -> str:
    pattern, mode, where, limit = _arguments(args)
    compiled = None
    if mode == "regex":
        try:
            compiled = await asyncio.to_thread(patterns.compile_pattern, pattern)
        except UnsafePattern as error:
            raise RecallError(str(error), param="pattern") from None
    candidates = await _candidates(lookup, scope, pattern, mode, where, limit)
    file_records = await _files(lookup, scope) if where in ("all", "files") else []
    # Matching runs in a worker thread with one deadline for the whole call: a model-chosen pattern must
    # stall neither the event loop nor the request past GREP_DEADLINE.
    deadline = time.monotonic() + GREP_DEADLINE
    hits = await asyncio.to_thread(_match_all, compiled, pattern, candidates, limit, deadline)
    for record in file_records:
        if len(hits) >= limit:
            break
        text = (await lookup.read(record))[:MAX_FILE_SCAN].decode("utf-8", "replace")
        hit = await asyncio.to_thread(_match_file, compiled, pattern, record, text, deadline)
        if hit is not None:
            hits.append(hit)
    if not hits:
        return f"No matches for {pattern!r} ({mode})."
    return f"{len(hits)} match(es) for {pattern!r}:\n" + "\n".join(hits)


def _arguments(args: dict[str, Any]) -> tuple[str, str, str, int]:
    """``pattern``, ``mode``, ``scope`` (what to search: all, messages, summaries, files) and ``limit``."""
    pattern = args.get("pattern")
    if not isinstance(pattern, str) or not pattern.strip():
        raise RecallError("'pattern' is required", param="pattern")
    if len(pattern) > MAX_PATTERN:
        raise RecallError(f"'pattern' is longer than {MAX_PATTERN} characters", param="pattern")
    mode = args.get("mode") or "regex"
    where = args.get("scope") or "all"
    limit = int_arg(args, "limit", 10, 1, 50)
    if mode not in ("regex", "full_text"):
        raise RecallError("'mode' must be regex or full_text", param="mode")
    if where not in ("all", "messages", "summaries", "files"):
        raise RecallError("'scope' must be all, messages, summaries or files", param="scope")
    return pattern, mode, where, limit


async def _candidates(
    lookup: Lookup, scope: Scope, pattern: str, mode: str, where: str, limit: int
) -> list[tuple[str, str, str]]:
    """The messages and summaries to match, as (kind, label, text), in the order hits are wanted."""
    search = lookup.store.search
    candidates: list[tuple[str, str, str]] = []
    if where in ("all", "messages"):
        conversation_id, upto = scope.current
        if mode == "full_text":
            found = await search.search_messages(conversation_id, search_phrases(pattern), upto, limit)
        else:
            # A fork holds a copy of the prefix it shares with its ancestors: its own messages are all of
            # the messages it may see. A pattern that is plain text lets the store narrow the scan.
            literal = pattern if re.fullmatch(r"[A-Za-z0-9_ ,:;/@#'\"=-]{3,}", pattern) else None
            found = await search.scan_messages(conversation_id, upto, literal=literal)
        candidates += [("message", f"msg_{i} ({role}, message {seq})", text) for i, seq, role, text, _ in found]
    if where in ("all", "summaries"):
        if mode == "full_text":
            summaries = await search.search_summaries(search_phrases(pattern), scope.bounds, limit)
        else:
            summaries = await search.scan_summaries(scope.bounds)
        candidates += [("summary", f"{s.id} ({s.kind} summary, depth {s.depth})", s.content) for s in summaries]
    return candidates


async def _files(lookup: Lookup, scope: Scope) -> list[FileRecord]:
    """The stored text files the scope sees (base64 payloads are binary: nothing to match)."""
    records: list[FileRecord] = []
    for file_id in await lookup.store.search.visible_file_ids(scope.owner, scope.bounds):
        record = await lookup.store.read.file(scope.owner, file_id)
        if record is not None and record.kind != "base64":
            records.append(record)
    return records


def _match_all(
    compiled: Any, pattern: str, candidates: Iterable[tuple[str, str, str]], limit: int, deadline: float
) -> list[str]:
    hits: list[str] = []
    for _kind, label, text in candidates:
        if len(hits) >= limit:
            return hits
        _in_time(deadline)
        span = patterns.search(compiled, text) if compiled is not None else (0, 0)
        if span is not None:
            hits.append(f"- {label}: {_snippet(text, span, pattern)}")
    return hits


def _match_file(compiled: Any, pattern: str, record: FileRecord, text: str, deadline: float) -> str | None:
    _in_time(deadline)  # full-text mode reads every file in scope: the deadline holds there too
    span = patterns.search(compiled, text) if compiled is not None else _word_span(text, pattern)
    if span is None:
        return None
    line = text.count("\n", 0, span[0]) + 1
    return f"- {record.id} ({record.name}, line {line}): {_snippet(text, span, pattern)}"


def _in_time(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise RecallError(
            f"the search took longer than {GREP_DEADLINE:g} s; narrow the pattern or the scope", param="pattern"
        )


def _word_span(text: str, words: str) -> tuple[int, int] | None:
    for word in re.findall(r"\w+", words):
        index = text.lower().find(word.lower())
        if index >= 0:
            return index, index + len(word)
    return None


def _snippet(text: str, span: tuple[int, int], pattern: str, width: int = 120) -> str:
    if span == (0, 0):
        found = _word_span(text, pattern)
        span = found or (0, 0)
    start = max(0, span[0] - width // 2)
    end = min(len(text), span[1] + width // 2)
    snippet = " ".join(text[start:end].split())
    return ("…" if start else "") + snippet + ("…" if end < len(text) else "")
