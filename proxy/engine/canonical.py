"""Canonical message form and the hash chain that identifies a transcript.

Clients re-send the whole transcript on every request, but not byte for byte: key order changes, and empty
optional fields (``refusal: null``, ``tool_calls: []``, ``name: null``, ``content: ""`` beside tool calls)
come and go between SDK versions and frameworks. Identity therefore hashes a canonical form that drops
empty values and sorts keys; the stored message keeps the client's original JSON. In the formats other than
chat the form also drops ``cache_control``: Claude Code moves its breakpoint to the newest message on every
request and takes it off the one before, which is otherwise the same message (chat's hashes are what they were).
In Messages, content that is one plain text block is the same as that text as a string (Claude Code sends a
message one way and replays it the other).

Each message's *chain hash* covers the scope (a tenant, or an end user within it) and every message before
it, so one indexed lookup answers "does any conversation of this scope start with exactly these k messages?"
and the set of stored chain hashes is prefix-closed, which makes the longest-prefix search a binary search.
The chain of a transcript of another wire format than chat starts from a root of its own (``chain_root``): a
Messages transcript never continues a chat conversation, and chat's hashes are what they were before there
were other formats.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from proxy import dialects
from proxy.types import Message, Messages


def _is_empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items() if not _is_empty(v)}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


HINTS = "cache_control"  # a transport hint, not content: left out of the canonical form of non-chat formats


def _without_hints(message: Message) -> Message:
    """``message`` without ``cache_control`` on itself, its content blocks and a tool result's blocks (never
    inside a value the client wrote, such as a tool's input)."""

    def blocks(content: Any) -> Any:
        if not isinstance(content, list):
            return content
        out = []
        for block in content:
            if isinstance(block, dict):
                block = {k: v for k, v in block.items() if k != HINTS}
                if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                    block["content"] = blocks(block["content"])
            out.append(block)
        return out

    return {k: blocks(v) if k == "content" else v for k, v in message.items() if k != HINTS}


def canonical_bytes(message: Message, dialect: str = dialects.CHAT.name) -> bytes:
    # Fast path for the common shape (only non-empty strings, e.g. role + content): already canonical.
    if all(type(v) is str and v for v in message.values()):
        return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    if dialect != dialects.CHAT.name:
        message = _without_hints(message)
        content = message.get("content")
        if dialect == dialects.MESSAGES.name and isinstance(content, list) and len(content) == 1:
            block = content[0]
            if isinstance(block, dict) and block.keys() == {"type", "text"} and block["type"] == "text":
                message = {**message, "content": block["text"]}
    return orjson.dumps(canonical(message), option=orjson.OPT_SORT_KEYS)


def same_message(a: Message, b: Message) -> bool:
    return bool(canonical(a) == canonical(b))


def chain_root(scope: str, dialect: str = dialects.CHAT.name) -> str:
    seed = b"lcm-chain\x00" + scope.encode()
    if dialect != dialects.CHAT.name:
        seed += b"\x00" + dialect.encode()
    return hashlib.sha256(seed).hexdigest()[:32]


def chain_next(previous: str, message: Message, dialect: str = dialects.CHAT.name) -> str:
    """The chain hash of ``message`` (of wire format ``dialect``) after the prefix whose chain hash is
    ``previous``."""
    return hashlib.sha256(previous.encode() + canonical_bytes(message, dialect)).hexdigest()[:32]


def chain_hashes(
    scope: str, messages: Messages, dialect: str = dialects.CHAT.name, known: list[str] | None = None
) -> list[str]:
    """``result[i]`` identifies ``messages[: i + 1]`` (of wire format ``dialect``) within ``scope``. ``known``:
    the chain hashes of the first messages, already worked out (only the messages after them are hashed)."""
    out = list(known or ())
    previous = out[-1] if out else chain_root(scope, dialect)
    for message in messages[len(out) :]:
        previous = chain_next(previous, message, dialect)
        out.append(previous)
    return out


def split_instructions(messages: Messages) -> tuple[Messages, Messages]:
    """Leading system/developer chat messages are instructions: forwarded verbatim, outside identity."""
    return dialects.split_instructions(dialects.CHAT, messages)
