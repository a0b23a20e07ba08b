"""What the Messages door knows of Claude Code (FIELD-NOTES, checked with the real CLI): its session ids, its
project rules in ``<system-reminder>`` blocks, and its own compaction.

* **Identity.** ``x-claude-code-session-id`` names the conversation (stable across ``--continue`` and
  ``--resume``); a sub-agent's requests (``x-claude-code-agent-id``) are a conversation of their own, linked to
  the conversation of the agent that started it (``x-claude-code-parent-agent-id``, else the session's).
* **Project rules.** CLAUDE.md and Claude Code's other standing context arrive as ``<system-reminder>`` text
  blocks at the start of the first user message, not in ``system``. They are instructions: ``pinned`` finds
  them, and the door forwards them on every request, wherever the rest of that message went.
* **Its compaction.** A request that asks the model to summarise the conversation (``x-claude-code-compaction``
  with ``CLAUDE_CODE_GATEWAY_HINT_HEADERS=1``, else its fixed prompt) is answered by the proxy from the stored
  conversation (``proxy.engine.digest``); the transcript that follows (``x-claude-code-context-compacted``, else
  its fixed opening) continues the same conversation (``ConversationRecord.continued``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.errors import InvalidRequestError
from proxy.relay.turn import CONVERSATION_HEADER

SESSION_HEADER = "x-claude-code-session-id"
AGENT_HEADER = "x-claude-code-agent-id"
PARENT_HEADER = "x-claude-code-parent-agent-id"
COMPACTION_HEADER = "x-claude-code-compaction"
REQUEST_CLASS_HEADER = "x-claude-code-request-class"
COMPACTED_HEADER = "x-claude-code-context-compacted"
COMPACTION_PROMPT = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."
CONTINUATION = "This session is being continued from a previous conversation"
REMINDER = "<system-reminder>"


def _key(value: str | None, name: str) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > 200 or not value.isprintable():
        raise InvalidRequestError(
            f"Invalid {name} header: expected 1-200 printable characters.", param=name, code="invalid_value"
        )
    return value


def conversation_key(headers: Mapping[str, str]) -> str | None:
    """The client's own name for the conversation: X-LCM-Conversation-Id, else Claude Code's session id (with
    the sub-agent's id for a sub-agent's requests)."""
    own = _key(headers.get(CONVERSATION_HEADER), CONVERSATION_HEADER)
    if own is not None:
        return own
    session = _key(headers.get(SESSION_HEADER), SESSION_HEADER)
    if session is None:
        return None
    agent = _key(headers.get(AGENT_HEADER), AGENT_HEADER)
    return f"claude-code:{session}" + (f":agent:{agent}" if agent else "")


def parent_key(headers: Mapping[str, str]) -> str | None:
    """A sub-agent's request: the key of the conversation of the agent that started it (the named parent agent,
    else the session's main conversation); None for any other request."""
    session = _key(headers.get(SESSION_HEADER), SESSION_HEADER)
    if session is None or _key(headers.get(AGENT_HEADER), AGENT_HEADER) is None:
        return None
    parent = _key(headers.get(PARENT_HEADER), PARENT_HEADER)
    return f"claude-code:{session}" + (f":agent:{parent}" if parent else "")


def server_compacted(messages: list[dict[str, Any]]) -> bool:
    """Whether the transcript holds a ``compaction`` block of Anthropic's server-side compaction
    (``context_management`` edit ``compact_20260112``): it must go back verbatim and in place, and the API reads
    nothing before it, so the proxy forwards such a transcript as the client sent it (and stores it as ever)."""
    return any(
        message.get("role") == "assistant"
        and isinstance(message.get("content"), list)
        and any(isinstance(b, dict) and b.get("type") == "compaction" for b in message["content"])
        for message in messages
    )


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return []


def _last_user(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((m for m in reversed(messages) if m.get("role") == "user"), None)


def is_compaction(headers: Mapping[str, str], body: dict[str, Any]) -> bool:
    """Claude Code asking the model for a summary of the whole conversation."""
    if headers.get(COMPACTION_HEADER) or headers.get(REQUEST_CLASS_HEADER, "").strip() == "compaction":
        return True
    last = _last_user(body["messages"])
    if last is None or last is not body["messages"][-1]:
        return False
    return any(text.lstrip().startswith(COMPACTION_PROMPT) for text in _texts(last.get("content")))


def is_continuation(headers: Mapping[str, str], body: dict[str, Any]) -> bool:
    """The first request after Claude Code compacted: its transcript opens with the summary it kept."""
    if headers.get(COMPACTED_HEADER):
        return True
    first = next((m for m in body["messages"] if m.get("role") == "user"), None)
    if first is None:
        return False
    texts = [t for t in _texts(first.get("content")) if not t.lstrip().startswith(REMINDER)]
    return bool(texts) and texts[0].lstrip().startswith(CONTINUATION)


def _leading_reminders(content: Any) -> list[dict[str, Any]]:
    out = []
    for block in content if isinstance(content, list) else []:
        if not (isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)):
            break
        if not block["text"].lstrip().startswith(REMINDER):
            break
        out.append(block)
    return out


def pinned(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``<system-reminder>`` text blocks that open the first user message (Claude Code's CLAUDE.md and
    standing context): instructions, forwarded on every request. After Claude Code's own compaction the first
    user message is its summary, and they open the next user message instead. A reminder typed later in the
    conversation is the user's text like any other, never pinned."""
    users = [m for m in messages if m.get("role") == "user"]
    candidates = users[:1]
    if users and any(t.lstrip().startswith(CONTINUATION) for t in _texts(users[0].get("content"))):
        candidates = users[:2]
    for message in candidates:
        found = _leading_reminders(message.get("content"))
        if found:
            return found
    return []
