"""Anthropic Messages: ``{"role": "user" | "assistant", "content": str | [blocks]}``.

Blocks: ``text``, ``image`` and ``document`` (a ``source`` that may carry base64 data), ``tool_use`` (``id``,
``name``, ``input``), ``tool_result`` (``tool_use_id``, ``content``), ``thinking`` (``thinking``,
``signature``) and ``redacted_thinking`` (``data``). A tool call is an assistant message's ``tool_use``
blocks; their results are the ``tool_result`` blocks that open the next user message, which is why such a
user message is stored with role ``"tool"``: it continues the assistant message before it and is not the
user's own turn. Claude Code appends a ``<system-reminder>`` text block after the results, and a user who
types while tools run has their words added there too: the message is still a tool result (it must stay with
the calls it answers), so the newest *user turn* is the last message that opens with no result.

Nothing here rewrites a stored block: thinking blocks and their signatures are forwarded byte-identical (the
API checks them). Newer models refuse a thinking block replayed after the prefix before it changed, which a
compaction does: what to forward then is the Messages door's rule to make (drop the earlier turns' thinking
blocks, as the API allows), not a rewrite of what is stored. Only the proxy's own blocks are made here, as
text blocks of a user message. The top-level ``system`` field is the door's business; a leading ``system``
message some clients put in ``messages`` is read as an instruction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from proxy import tokens
from proxy.dialects.base import Path, Site, ToolCall
from proxy.types import Message

REASONING_BLOCKS = ("thinking", "redacted_thinking")
REMINDER_OPEN, REMINDER_CLOSE = "<system-reminder>", "</system-reminder>"


def without_reminders(text: str) -> str:
    """``text`` without its ``<system-reminder>`` spans: Claude Code's own context (CLAUDE.md, the date, token
    counts, tool lists), repeated in every session and appended to tool results. The door forwards the leading
    ones verbatim as instructions; for summaries and search they are noise that would crowd out the
    conversation. Linear: one scan with ``str.find``. Only closed spans go: an opening tag with no close (a file
    that mentions the tag) is text like any other."""
    if REMINDER_OPEN not in text:
        return text
    out: list[str] = []
    at = 0
    while (start := text.find(REMINDER_OPEN, at)) >= 0:
        end = text.find(REMINDER_CLOSE, start)
        if end < 0:
            break
        out.append(text[at:start])
        at = end + len(REMINDER_CLOSE)
    out.append(text[at:])
    return "".join(out).strip()


def _blocks(message: Message) -> list[dict[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return without_reminders(content)
    if isinstance(content, list):
        texts = (b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
        return "\n".join(without_reminders(t) for t in texts)
    return ""


def _single_text(content: Any) -> bool:
    """A tool result made of one text block (larger mixes stay inline)."""
    return (
        isinstance(content, list)
        and len(content) == 1
        and isinstance(content[0], dict)
        and content[0].get("type") == "text"
        and isinstance(content[0].get("text"), str)
    )


def _source_cost(source: Any) -> int:
    """A document's source: plain text counted as text, inline content by its blocks, base64 bytes at a rough
    and stable rate (decoded bytes / 16), a reference (``file_id``, ``url``) at an image's size."""
    source = source if isinstance(source, dict) else {}
    data = source.get("data")
    if source.get("type") == "text" and isinstance(data, str):
        return tokens.count_text(data)
    if source.get("type") == "content" and isinstance(source.get("content"), (str, list)):
        content = source["content"]
        if isinstance(content, str):
            return tokens.count_text(content)
        return sum(_block_cost(b) for b in content if isinstance(b, dict))
    return max(1, len(data) * 3 // 4 // 16) if isinstance(data, str) else tokens.IMAGE_TOKENS


def _block_cost(block: dict[str, Any]) -> int:
    """Tokens of one content block: text as text, images at their billed size, signatures not at all (they
    only let the API check a thinking block), redacted thinking at its length (it stands for reasoning the
    model reads), everything else (tool inputs, result content, ids) as JSON values."""
    kind = block.get("type")
    if kind == "image":
        return tokens.IMAGE_TOKENS
    if kind == "document":
        return _source_cost(block.get("source"))
    if kind == "thinking":
        return tokens.count_value(block.get("thinking"))
    if kind == "redacted_thinking":
        return len(str(block.get("data", ""))) // 4
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            inner = sum(_block_cost(b) for b in content if isinstance(b, dict))
        else:
            inner = tokens.count_value(content)
        return inner + tokens.count_value(block.get("tool_use_id")) + 3
    skip = ("type", "cache_control", "content")
    return tokens.count_value({k: v for k, v in block.items() if k not in skip}) + tokens.count_value(block.get("id"))


class MessagesDialect:
    name = "messages"

    def role(self, message: Message) -> str:
        role = str(message.get("role"))
        blocks = _blocks(message)
        if role == "user" and blocks and blocks[0].get("type") == "tool_result":
            return "tool"
        return role

    def continues(self, previous: str, role: str) -> bool:
        return role == "tool"

    def user_turn(self, role: str) -> bool:
        return role == "user"

    def instruction_count(self, messages: Sequence[Message]) -> int:
        i = 0
        while i < len(messages) and messages[i].get("role") == "system":
            i += 1
        return i

    def question(self, message: Message) -> str:
        """The last text block with words outside reminders (the user's, in Claude Code's messages, which open
        with its reminders and command notes); the whole text when there is none."""
        for block in reversed(_blocks(message)):
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                words = without_reminders(block["text"])
                if words.strip():
                    return words
        return self.text(message)

    def text(self, message: Message) -> str:
        content = message.get("content")
        if isinstance(content, str):
            return without_reminders(content)
        pieces: list[str] = []
        for block in _blocks(message):
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                pieces.append(without_reminders(block["text"]))
            elif kind == "tool_result":
                pieces.append(_result_text(block.get("content")))
            elif kind == "image":
                pieces.append("[image]")
            elif kind == "document":
                pieces.append(f"[document: {block.get('title') or 'attachment'}]")
        return "\n".join(p for p in pieces if p)

    def search_text(self, message: Message) -> list[str]:
        content = message.get("content")
        parts = [without_reminders(content)] if isinstance(content, str) else []
        for block in _blocks(message):
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(without_reminders(block["text"]))
            elif block.get("type") == "tool_result":
                parts.append(_result_text(block.get("content")))
        return parts + [f"{c.name}({c.arguments})" for c in self.tool_calls(message)]

    def header(self, message: Message) -> str:
        if self.role(message) == "tool":
            return f"tool result ({', '.join(self.result_ids(message))})"
        return str(message.get("role"))

    def tool_calls(self, message: Message) -> list[ToolCall]:
        return [
            ToolCall(str(b.get("id")), str(b.get("name", "?")), orjson.dumps(b.get("input", {})).decode())
            for b in _blocks(message)
            if b.get("type") == "tool_use"
        ]

    def result_ids(self, message: Message) -> list[str]:
        return [str(b.get("tool_use_id")) for b in _blocks(message) if b.get("type") == "tool_result"]

    def count(self, message: Message) -> int:
        content = message.get("content")
        if isinstance(content, str):
            return tokens.MESSAGE_OVERHEAD + tokens.count_text(content)
        return tokens.MESSAGE_OVERHEAD + sum(_block_cost(b) for b in _blocks(message))

    def payload_sites(self, message: Message) -> list[Site]:
        content = message.get("content")
        if isinstance(content, str):
            return [Site("text", ["content"])]
        sites: list[Site] = []
        for i, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict):
                continue
            kind, source = block.get("type"), block.get("source")
            if kind == "text" and isinstance(block.get("text"), str):
                if block["text"].lstrip().startswith(REMINDER_OPEN):
                    continue  # Claude Code's context (CLAUDE.md, skills): instructions, forwarded verbatim
                sites.append(Site("text", ["content", i, "text"]))
            elif (
                kind in ("image", "document")
                and isinstance(source, dict)
                and source.get("type") == "base64"
                and (isinstance(source.get("data"), str))
            ):
                name = str(block.get("title") or kind)
                sites.append(Site("base64", ["content", i, "source", "data"], name=name, mime=source.get("media_type")))
            elif kind == "tool_result":
                result, call_id = block.get("content"), str(block.get("tool_use_id"))
                if isinstance(result, str):
                    sites.append(Site("tool_result", ["content", i, "content"], ["content", i, "content"], call_id))
                elif _single_text(result):
                    path: Path = ["content", i, "content", 0, "text"]
                    sites.append(Site("tool_result", path, ["content", i, "content"], call_id))
        return sites

    def summary_message(self, text: str) -> Message:
        return {"role": "user", "content": [{"type": "text", "text": text}]}

    def prepend(self, message: Message, text: str) -> Message:
        """The block goes before the user's words, after any tool results (the API wants those first)."""
        content = message.get("content")
        block = {"type": "text", "text": text}
        if isinstance(content, list):
            at = 0
            while at < len(content) and isinstance(content[at], dict) and content[at].get("type") == "tool_result":
                at += 1
            return {**message, "content": [*content[:at], block, *content[at:]]}
        if isinstance(content, str) and content:
            return {**message, "content": f"{text}\n\n{content}"}
        return {**message, "content": [block]}

    def append(self, message: Message, text: str) -> Message:
        """A text block after the content (after tool results, as the API wants them first)."""
        content = message.get("content")
        block = {"type": "text", "text": text}
        if isinstance(content, list):
            return {**message, "content": [*content, block]}
        if isinstance(content, str) and content:
            return {**message, "content": f"{content}\n\n{text}"}
        return {**message, "content": [block]}


MESSAGES = MessagesDialect()
