"""The 400s of chat request validation, OpenAI style: each names the offending parameter, so a client sees
which of its fields to fix (``messages[2].tool_calls[0].function.arguments``), never a 500.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import InvalidRequestError


def invalid(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


def type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__
    )


def expect(value: Any, kinds: type | tuple[type, ...], param: str, what: str) -> None:
    bad_bool = isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,))
    if bad_bool or not isinstance(value, kinds):
        raise invalid(param, f"expected {what}, got {type_name(value)}.")
