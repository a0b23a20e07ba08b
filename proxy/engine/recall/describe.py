"""``lcm_describe``: open one id from a summary, a stub or a grep result, within the recall scope.

A summary shows its lineage and content, a stored file its exploration summary and a range of its lines
(bounded in bytes, with where to continue), a message its rendered text.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.dialects import by_name
from proxy.engine.errors import RecallError
from proxy.engine.plan import view_message
from proxy.engine.recall.lookup import Lookup, int_arg
from proxy.engine.recall.scope import Scope
from proxy.engine.render import render_message, timestamp
from proxy.store.records import FileRecord, SummaryRecord

ID_PATTERN = re.compile(r"^(sum|file)_[0-9a-f]{16}$|^msg_[0-9]{1,18}$")


async def describe(lookup: Lookup, scope: Scope, args: dict[str, Any]) -> str:
    item_id = str(args.get("id") or "").strip()
    if not ID_PATTERN.match(item_id):
        raise RecallError("'id' must be a sum_…, file_… or msg_… id from the context or from lcm_grep")
    if item_id.startswith("sum_"):
        return await _describe_summary(lookup, scope, await lookup.summary(scope, item_id))
    if item_id.startswith("file_"):
        return await _describe_file(lookup, await lookup.file(scope, item_id), args)
    return await _describe_message(lookup, scope, int(item_id[4:]))


async def _describe_summary(lookup: Lookup, scope: Scope, summary: SummaryRecord) -> str:
    parents = []
    for parent_id in await lookup.store.read.parent_summary_ids(summary.id):
        parent = await lookup.store.read.summary(parent_id)
        if parent is not None and scope.sees_summary(parent):  # a later node of an ancestor is not ours
            parents.append(parent_id)
    children = await lookup.store.read.child_summaries(summary.id)
    lines = [
        f"Summary {summary.id}: {summary.kind}, depth {summary.depth}, "
        f"covers messages {summary.start_seq}-{summary.end_seq - 1}",
        f"Time range: {timestamp(summary.earliest_at)} to {timestamp(summary.latest_at)}",
        f"Descendant summaries: {summary.descendant_count}; "
        f"tokens {summary.token_count} (from {summary.source_token_count})",
        f"Parents (summaries that contain it): {', '.join(parents) or 'none (it is in the active context)'}",
    ]
    if children:
        lines.append("Children: " + ", ".join(c.id for c in children))
    else:
        lines.append(f"Sources: messages {summary.start_seq}-{summary.end_seq - 1} (call lcm_expand to read them)")
    if summary.file_ids:
        lines.append("Files mentioned: " + ", ".join(orjson.loads(summary.file_ids)))
    lines += ["", "Content:", summary.content]
    return "\n".join(lines)


async def _describe_file(lookup: Lookup, record: FileRecord, args: dict[str, Any]) -> str:
    max_bytes = int_arg(args, "max_bytes", 20000, 100, 200000)
    header = [
        f"File {record.id}: {record.name} ({record.mime}), {record.bytes} bytes, stored {timestamp(record.created_at)}",
    ]
    if record.exploration:
        header += ["Exploration summary:", record.exploration]
    if record.kind == "base64":
        return "\n".join([*header, "(binary content: not shown as text)"])
    text = (await lookup.read(record)).decode("utf-8", "replace")
    lines = text.splitlines(keepends=True)
    first, last = args.get("start_line"), args.get("end_line")
    if type(first) is int and type(last) is int and last < first:
        raise RecallError(f"'end_line' ({last}) is before 'start_line' ({first})", param="end_line")
    start = int_arg(args, "start_line", 1, 1, max(1, len(lines)))
    end = int_arg(args, "end_line", len(lines), start, max(start, len(lines)))
    selected = "".join(lines[start - 1 : end])
    clipped = selected.encode()[:max_bytes].decode("utf-8", "ignore")
    shown_end = start - 1 + clipped.count("\n") + (0 if clipped.endswith("\n") or not clipped else 1)
    more = (
        f" (truncated at {max_bytes} bytes: continue with start_line={shown_end + 1})"
        if len(clipped) < len(selected)
        else ""
    )
    return "\n".join([*header, f"Lines {start}-{shown_end} of {len(lines)}{more}:", clipped])


async def _describe_message(lookup: Lookup, scope: Scope, message_id: int) -> str:
    found = await lookup.store.read.messages_by_id([message_id])
    if not found or not scope.sees_message(found[0].conversation_id, found[0].seq):
        raise RecallError(f"no message msg_{message_id} in this conversation")
    record = found[0]
    message, _ = view_message(record, stubbed=False)
    return f"Message msg_{message_id} (message {record.seq}):\n" + render_message(
        message, record.created_at, by_name(scope.dialect)
    )
