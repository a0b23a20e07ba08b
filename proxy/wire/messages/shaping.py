"""The Messages request the upstream receives, from the client's body and the engine's messages.

The engine reads the top-level ``system`` as an instruction (a leading ``system`` message of the transcript,
``engine_transcript``) and hands back the messages to forward; ``outgoing`` puts ``system`` back in its place,
byte for byte (Claude Code's first block, its attribution line, stays first and unchanged), and keeps the
rules Anthropic's API enforces wherever the proxy changed the transcript:

* the ``<system-reminder>`` blocks the first user message opened with (CLAUDE.md) are in the first user message
  forwarded, whatever happened to the rest of that message;
* roles alternate, starting with the user (a summary message is merged with a user message that follows it);
* thinking blocks are bound to the prefix before them: past the point where the forwarded transcript differs
  from the client's, they are dropped, except in the newest assistant turn of a tool loop (the API wants those
  back), for which an Anthropic upstream is told to drop a block whose prefix changed
  (``thinking.block_binding.prefix_mismatch_behavior``, with its beta header: the two halves go together);
* at most four ``cache_control`` breakpoints, one of them after the proxy's summary (the stable prefix).
"""

from __future__ import annotations

import copy
from typing import Any

from proxy.types import Message

BINDING_BETA = "thinking-binding-controls-2026-08-01"
MAX_BREAKPOINTS = 4
THINKING = ("thinking", "redacted_thinking")


def engine_transcript(body: dict[str, Any]) -> list[Message]:
    system = body.get("system")
    lead: list[Message] = [{"role": "system", "content": system}] if system not in (None, "", []) else []
    return [*lead, *body["messages"]]


def _blocks(message: Message) -> list[Any]:
    content = message.get("content")
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content}] if isinstance(content, str) and content else []


def _has_blocks(messages: list[Message], wanted: list[dict[str, Any]]) -> bool:
    first = wanted[0]
    return any(isinstance(m.get("content"), list) and first in m["content"] for m in messages)


def _with_reminders(messages: list[Message], reminders: list[dict[str, Any]]) -> list[Message]:
    if not reminders or _has_blocks(messages, reminders):
        return messages
    for i, message in enumerate(messages):
        if message.get("role") == "user":
            blocks = _blocks(message)
            at = 0
            while at < len(blocks) and isinstance(blocks[at], dict) and blocks[at].get("type") == "tool_result":
                at += 1
            return [*messages[:i], {**message, "content": [*blocks[:at], *reminders, *blocks[at:]]}, *messages[i + 1 :]]
    return [{"role": "user", "content": list(reminders)}, *messages]


def _alternating(messages: list[Message]) -> list[Message]:
    out: list[Message] = []
    for message in messages:
        if out and out[-1].get("role") == message.get("role") and message.get("role") in ("user", "assistant"):
            out[-1] = {**out[-1], "content": [*_blocks(out[-1]), *_blocks(message)]}
        else:
            out.append(message)
    if out and out[0].get("role") == "assistant":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": "(The conversation continues.)"}]})
    return out


def _common(a: list[Message], b: list[Message]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def _last_user_turn(messages: list[Message]) -> int:
    """Index of the newest message with the user's own words (not only tool results)."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message.get("role") != "user":
            continue
        blocks = _blocks(message)
        if not blocks or not (isinstance(blocks[0], dict) and blocks[0].get("type") == "tool_result"):
            return i
    return -1


def _thinking(messages: list[Message], changed_from: int) -> tuple[list[Message], bool]:
    """Thinking blocks past ``changed_from`` dropped, but the newest tool loop's; whether any were kept there."""
    tool_loop = _last_user_turn(messages)
    kept = False
    out = list(messages)
    for i in range(changed_from, len(out)):
        message = out[i]
        if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
            continue
        if not any(isinstance(b, dict) and b.get("type") in THINKING for b in message["content"]):
            continue
        if i > tool_loop:
            kept = True
            continue
        rest = [b for b in message["content"] if not (isinstance(b, dict) and b.get("type") in THINKING)]
        out[i] = {**message, "content": rest or [{"type": "text", "text": "(reasoning omitted)"}]}
    return out, kept


def _breakpoints(body: dict[str, Any]) -> list[tuple[str, int, int]]:
    """Where the request's ``cache_control`` breakpoints are: ("system" | "tools" | "messages", i, block)."""
    found: list[tuple[str, int, int]] = []
    system = body.get("system")
    if isinstance(system, list):
        found += [("system", i, -1) for i, b in enumerate(system) if isinstance(b, dict) and "cache_control" in b]
    for i, tool in enumerate(body.get("tools") or []):
        if isinstance(tool, dict) and "cache_control" in tool:
            found.append(("tools", i, -1))
    for i, message in enumerate(body["messages"]):
        content = message.get("content")
        if isinstance(content, list):
            found += [("messages", i, j) for j, b in enumerate(content) if isinstance(b, dict) and "cache_control" in b]
    return found


def _cache_control(body: dict[str, Any], summary_at: int | None) -> None:
    """At most ``MAX_BREAKPOINTS``: the earliest message breakpoints go first; one after the summary when room."""
    messages = body["messages"]
    points = _breakpoints(body)
    extra = len(points) - MAX_BREAKPOINTS + (1 if summary_at is not None else 0)
    for where, i, j in points:
        if extra <= 0:
            break
        if where == "messages":
            content = list(messages[i]["content"])
            content[j] = {k: v for k, v in content[j].items() if k != "cache_control"}
            messages[i] = {**messages[i], "content": content}
            extra -= 1
    if summary_at is not None and len(_breakpoints(body)) < MAX_BREAKPOINTS:
        content = _blocks(messages[summary_at])
        if content and isinstance(content[-1], dict) and content[-1].get("type") == "text":
            content[-1] = {**content[-1], "cache_control": {"type": "ephemeral"}}
            messages[summary_at] = {**messages[summary_at], "content": content}


def outgoing(
    body: dict[str, Any], forwarded: list[Message], reminders: list[dict[str, Any]], *, anthropic: bool
) -> tuple[dict[str, Any], list[str]]:
    """The upstream's body for ``forwarded`` (the engine's messages, ``system`` first when the client sent one),
    and the beta names it needs besides the client's."""
    has_system = body.get("system") not in (None, "", [])
    system, messages = (forwarded[0]["content"], forwarded[1:]) if has_system else (None, forwarded)
    out: dict[str, Any] = {**body, "messages": messages}
    if has_system:
        out["system"] = system
    client = body["messages"]
    if messages is client or messages == client:
        return out, []
    messages = _with_reminders(messages, reminders)
    messages = _alternating(messages)
    changed_from = _common(messages, client)
    messages, kept = _thinking(messages, changed_from)
    out["messages"] = messages
    betas: list[str] = []
    thinking = body.get("thinking")
    if kept and anthropic and isinstance(thinking, dict) and thinking.get("type") != "disabled":
        out["thinking"] = {**thinking, "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
        betas.append(BINDING_BETA)
    if anthropic:
        out["messages"] = [copy.copy(m) for m in messages]
        _cache_control(out, 0 if changed_from == 0 else None)
    return out, betas


def with_betas(headers: dict[str, str], betas: list[str]) -> dict[str, str]:
    """The client's ``anthropic-beta`` list as it came, with ``betas`` it lacks appended."""
    if not betas:
        return headers
    have = [b.strip() for b in headers.get("anthropic-beta", "").split(",") if b.strip()]
    missing = [b for b in betas if b not in have]
    if not missing:
        return headers
    joined = ",".join([headers["anthropic-beta"]] if have else []) + ("," if have else "") + ",".join(missing)
    return {**headers, "anthropic-beta": joined}
