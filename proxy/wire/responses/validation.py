"""Validation of ``POST /v1/responses`` bodies, done by the proxy itself: a malformed request is a 400 in
OpenAI's error shape naming the parameter (``input[3].call_id``), before anything is stored or sent.

Only what the proxy reads is checked; unknown top-level fields and unknown item types pass through (a newer
client's items are kept and forwarded as they came). ``input`` may be a string (one user message): it comes
back as a list of items, so everything after validation reads one shape.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import InvalidRequestError
from proxy.wire.http import MAX_DEPTH

MAX_ITEMS = 100_000
CALL_TYPES = ("function_call", "custom_tool_call")
OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output")
MESSAGE_ROLES = ("user", "assistant", "system", "developer")


def invalid(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid '{param}': {message}", param=param, code="invalid_value")


def _expect(value: Any, kind: type | tuple[type, ...], param: str, wanted: str) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidRequestError(
            f"Invalid type for '{param}': expected {wanted}, but got {_type_name(value)} instead.",
            param=param,
            code="invalid_type",
        )


def _type_name(value: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a decimal", list: "an array"}
    return "null" if value is None else names.get(type(value), "an object")


def _depth(value: Any, param: str) -> None:
    """A body nested deeper than ``MAX_DEPTH``: refused before anything walks it recursively."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > MAX_DEPTH:
            raise invalid(param, f"nested more than {MAX_DEPTH} levels deep.")
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)


def _item(item: Any, where: str) -> None:
    _expect(item, dict, where, "an object")
    kind = item.get("type", "message" if "role" in item else None)
    _expect(kind, str, f"{where}.type", "a string")
    if kind == "message":
        role = item.get("role")
        if role not in MESSAGE_ROLES:
            raise invalid(f"{where}.role", f"expected one of {', '.join(map(repr, MESSAGE_ROLES))}, got {role!r}.")
        content = item.get("content")
        if not isinstance(content, str):
            _expect(content, list, f"{where}.content", "a string or an array")
            for j, part in enumerate(content):
                _expect(part, dict, f"{where}.content[{j}]", "an object")
                _expect(part.get("type"), str, f"{where}.content[{j}].type", "a string")
    elif kind in CALL_TYPES or kind in OUTPUT_TYPES:
        _expect(item.get("call_id"), str, f"{where}.call_id", "a string")
        if kind == "function_call":
            _expect(item.get("name"), str, f"{where}.name", "a string")
            _expect(item.get("arguments"), str, f"{where}.arguments", "a string")
        if kind in OUTPUT_TYPES and not isinstance(item.get("output"), str | list):
            _expect(item.get("output"), str, f"{where}.output", "a string or an array")
    elif kind in ("reasoning", "compaction") and item.get("encrypted_content") is not None:
        _expect(item["encrypted_content"], str, f"{where}.encrypted_content", "a string")


def validate_request(body: Any) -> dict[str, Any]:
    """The body, checked, with ``input`` as a list of items."""
    _expect(body, dict, "body", "a JSON object")
    _depth(body, "input")
    model = body.get("model")
    _expect(model, str, "model", "a string")
    if not model:
        raise invalid("model", "must not be empty.")
    raw = body.get("input")
    if raw is None and body.get("previous_response_id") is None:
        raise InvalidRequestError(
            "Missing required parameter: 'input'.", param="input", code="missing_required_parameter"
        )
    if isinstance(raw, str):
        items: list[Any] = [{"type": "message", "role": "user", "content": raw}]
    elif raw is None:
        items = []
    else:
        _expect(raw, list, "input", "a string or an array")
        items = raw
    if len(items) > MAX_ITEMS:
        raise invalid("input", f"at most {MAX_ITEMS} items.")
    for i, item in enumerate(items):
        _item(item, f"input[{i}]")
    for key, kind, wanted in (
        ("instructions", str, "a string"), ("previous_response_id", str, "a string"), ("stream", bool, "a boolean"),
        ("store", bool, "a boolean"), ("tools", list, "an array"), ("prompt_cache_key", str, "a string"),
        ("include", list, "an array"), ("metadata", dict, "an object"), ("reasoning", dict, "an object"),
    ):  # fmt: skip
        if body.get(key) is not None:
            _expect(body[key], kind, key, wanted)
    for i, tool in enumerate(body.get("tools") or []):
        _expect(tool, dict, f"tools[{i}]", "an object")
        _expect(tool.get("type"), str, f"tools[{i}].type", "a string")
    if body.get("previous_response_id") == "":
        raise invalid("previous_response_id", "must not be empty.")
    tokens = body.get("max_output_tokens")
    if tokens is not None:
        _expect(tokens, int, "max_output_tokens", "an integer")
        if tokens < 1:
            raise invalid("max_output_tokens", f"{tokens} is below the minimum of 1.")
    return {**body, "input": items}
