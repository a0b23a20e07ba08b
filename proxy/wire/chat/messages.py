"""Validation of the ``messages`` array of a chat request: roles, content parts, tool calls and tool results,
against OpenAI's published types.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import InvalidRequestError
from proxy.wire.chat.refusals import expect, invalid

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
USER_PART_TYPES = {"text", "image_url", "input_audio", "file"}
ASSISTANT_PART_TYPES = {"text", "refusal"}


def _text_parts(parts: list[Any], param: str, allowed: set[str]) -> None:
    for i, part in enumerate(parts):
        where = f"{param}[{i}]"
        expect(part, dict, where, "a content part object")
        kind = part.get("type")
        if kind not in allowed:
            raise invalid(f"{where}.type", f"expected one of {sorted(allowed)}, got {kind!r}.")
        if kind in ("text", "refusal"):
            expect(part.get(kind), str, f"{where}.{kind}", "a string")
        elif kind == "image_url":
            image = part.get("image_url")
            expect(image, dict, f"{where}.image_url", "an object with a 'url'")
            expect(image.get("url"), str, f"{where}.image_url.url", "a string")
        elif kind == "input_audio":
            audio = part.get("input_audio")
            expect(audio, dict, f"{where}.input_audio", "an object")
            expect(audio.get("data"), str, f"{where}.input_audio.data", "a base64 string")
        elif kind == "file":
            file = part.get("file")
            expect(file, dict, f"{where}.file", "an object")
            for key in ("file_data", "file_id", "filename"):
                if file.get(key) is not None:
                    expect(file[key], str, f"{where}.file.{key}", "a string")


def _content(message: dict[str, Any], param: str, allowed: set[str], nullable: bool) -> None:
    if "content" not in message or message["content"] is None:
        if not nullable:
            raise InvalidRequestError(
                f"Missing required parameter: '{param}.content'.",
                param=f"{param}.content",
                code="missing_required_parameter",
            )
        return
    content = message["content"]
    if isinstance(content, list):
        if not content and message.get("role") != "assistant":
            # OpenAI refuses an empty array ("expected an array with minimum length 1"); an assistant turn that
            # only calls tools may carry one.
            raise invalid(f"{param}.content", "expected at least one content part, got an empty array.")
        _text_parts(content, f"{param}.content", allowed)
    else:
        expect(content, str, f"{param}.content", "a string or an array of content parts")


def _tool_calls(calls: Any, param: str) -> None:
    expect(calls, list, param, "an array")
    for i, call in enumerate(calls):
        where = f"{param}[{i}]"
        expect(call, dict, where, "an object")
        expect(call.get("id"), str, f"{where}.id", "a string")
        kind = call.get("type", "function")
        expect(kind, str, f"{where}.type", "a string")
        if kind != "function" and call.get("function") is not None:
            expect(call["function"], dict, f"{where}.function", "an object")
        if kind == "function":
            fn = call.get("function")
            expect(fn, dict, f"{where}.function", "an object")
            expect(fn.get("name"), str, f"{where}.function.name", "a string")
            expect(fn.get("arguments"), str, f"{where}.function.arguments", "a string")


def check_message(message: Any, param: str) -> None:
    expect(message, dict, param, "a message object")
    role = message.get("role")
    if role is None:
        raise InvalidRequestError(
            f"Missing required parameter: '{param}.role'.",
            param=f"{param}.role",
            code="missing_required_parameter",
        )
    if role not in ROLES:
        raise invalid(f"{param}.role", f"expected one of {list(ROLES)}, got {role!r}.")
    if "name" in message and message["name"] is not None:
        expect(message["name"], str, f"{param}.name", "a string")
    if role in ("system", "developer"):
        _content(message, param, {"text"}, nullable=False)
    elif role == "user":
        _content(message, param, USER_PART_TYPES, nullable=False)
    elif role == "assistant":
        has_calls = bool(message.get("tool_calls")) or bool(message.get("function_call"))
        _content(message, param, ASSISTANT_PART_TYPES, nullable=True)
        if message.get("tool_calls") is not None:
            _tool_calls(message["tool_calls"], f"{param}.tool_calls")
        if message.get("content") is None and not has_calls and not message.get("audio"):
            raise InvalidRequestError(
                f"Missing required parameter: '{param}.content' (required unless 'tool_calls' is set).",
                param=f"{param}.content",
                code="missing_required_parameter",
            )
    elif role == "tool":
        _content(message, param, {"text"}, nullable=False)
        if not isinstance(message.get("tool_call_id"), str):
            raise InvalidRequestError(
                f"Missing required parameter: '{param}.tool_call_id'.",
                param=f"{param}.tool_call_id",
                code="missing_required_parameter",
            )
    elif role == "function":
        expect(message.get("name"), str, f"{param}.name", "a string")
        # The legacy function result: its content is the function's output as a string (or null).
        if message.get("content") is not None:
            expect(message["content"], str, f"{param}.content", "a string")
