"""The bounds a chat body meets before anything walks it: content parts per message and nesting depth.

Each part may become a stored file, a row and a summary, and recursive code further on must never meet
hostile nesting, so both are refused first, with a 400 that names the client's field. The walks are
iterative and linear: a path is spelt out only for the one value that fails, not for the thousands that pass.
"""

from __future__ import annotations

from typing import Any

from proxy.wire.chat.refusals import invalid
from proxy.wire.http import MAX_DEPTH

# Content parts per message. Real clients send a handful (a few images, text blocks); each part may become a
# stored file, a row and a summary, so a request of 20,000 parts is work, not a conversation. Checked before
# anything walks the parts.
MAX_CONTENT_PARTS = 1000

# The part of the request whose structure OpenAI defines: nested dicts name known keys, a one-item list
# describes every item of an array. A path is reported down to the first key or index outside it, which is
# the client's own field (``messages[3].metadata``, ``tools[0].function.parameters``, ``vendor_extra``).
KNOWN_SHAPE: dict[str, Any] = {
    "messages": [
        {
            "content": [{"image_url": {}, "input_audio": {}, "file": {}}],
            "tool_calls": [{"function": {}}],
            "function_call": {},
            "audio": {},
        }
    ],
    "tools": [{"function": {}}],
    "tool_choice": {"function": {}},
    "response_format": {"json_schema": {}},
    "stream_options": {},
}


def check_part_counts(body: dict[str, Any], known: range = range(0)) -> None:
    """``known``: indexes of messages that met every bound before, with the same values (not looked at)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for i in (*range(known.start), *range(known.stop, len(messages))):
        message = messages[i]
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and len(content) > MAX_CONTENT_PARTS:
            raise invalid(
                f"messages[{i}].content", f"at most {MAX_CONTENT_PARTS} content parts per message, got {len(content)}."
            )


def client_field(path: list[str | int]) -> str:
    """The client's field that holds ``path``: the path cut after its first step outside ``KNOWN_SHAPE``."""
    shape: Any = KNOWN_SHAPE
    out = ""
    for step in path:
        if isinstance(step, int):
            if not isinstance(shape, list):
                break
            out += f"[{step}]"
            shape = shape[0]
        else:
            if not isinstance(shape, dict):
                break
            out += f".{step}" if out else step
            shape = shape.get(step)
            if shape is None:
                break
    return out


# One container met while walking the body: (value, its nesting level, the parent's node, key in the parent).
_Node = tuple[Any, int, "_Node | None", str | int]


def _path_to(node: _Node) -> list[str | int]:
    """The keys and indexes from the body down to ``node``."""
    path: list[str | int] = []
    while node[2] is not None:
        path.append(node[3])
        node = node[2]
    return path[::-1]


def check_depth(body: dict[str, Any], known: range = range(0)) -> None:
    """Refuse a body nested more than ``MAX_DEPTH`` levels, before anything recursive looks at it.

    Every request pays for this walk, so the common case is a plain breadth-first pass, one level at a time,
    that keeps nothing per value; only a body that is too deep is walked again to name the field. ``known``:
    indexes of messages that met the bound before, with the same values (at the same depth: each is an item
    of the body's ``messages``), left out of the walk."""
    original, messages = body, body.get("messages")
    if known and isinstance(messages, list):
        body = {**body, "messages": [*messages[: known.start], *messages[known.stop :]]}
    level: list[Any] = [body]
    for _ in range(MAX_DEPTH):
        deeper: list[Any] = []
        for value in level:
            children = value.values() if type(value) is dict else value
            deeper += [c for c in children if type(c) is dict or type(c) is list]
        if not deeper:
            return
        level = deeper
    _name_the_deep_field(original)


def _name_the_deep_field(body: dict[str, Any]) -> None:
    """Raise the 400 for a body known to be too deep, naming the field that holds the first deep value.

    Iterative, and linear in the number of values: each container is visited once and keeps only a link
    to its parent, so a path is spelt out for the one value that fails, not for the thousands that pass."""
    stack: list[_Node] = [(body, 1, None, "")]
    while stack:
        node = stack.pop()
        value, level = node[0], node[1]
        if level > MAX_DEPTH:
            param = client_field(_path_to(node))
            raise invalid(param, f"JSON values may be nested at most {MAX_DEPTH} levels deep.")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        stack.extend((child, level + 1, node, key) for key, child in items if isinstance(child, dict | list))
