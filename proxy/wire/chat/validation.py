"""Validation of ``POST /v1/chat/completions`` bodies, done by the proxy itself.

The proxy must reject malformed input with a 400 that names the offending parameter (OpenAI style,
e.g. ``messages[2].tool_calls[0].function.arguments``) *before* spending an upstream call, and it must never
answer a bad request with a 500. Unknown top-level fields are vendor extras and pass through untouched,
so only the fields whose meaning we know are checked here, against OpenAI's published types and ranges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.errors import InvalidRequestError
from proxy.types import ChatBody
from proxy.wire.http import MAX_DEPTH

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
USER_PART_TYPES = {"text", "image_url", "input_audio", "file"}
ASSISTANT_PART_TYPES = {"text", "refusal"}


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


def _fail(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__
    )


def _expect(value: Any, kinds: type | tuple[type, ...], param: str, what: str) -> None:
    bad_bool = isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,))
    if bad_bool or not isinstance(value, kinds):
        raise _fail(param, f"expected {what}, got {_type_name(value)}.")


def _param(path: list[str | int]) -> str:
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


def _depth(body: dict[str, Any]) -> None:
    """Refuse a body nested more than ``MAX_DEPTH`` levels, before anything recursive looks at it.

    Every request pays for this walk, so the common case is a plain breadth-first pass, one level at a time,
    that keeps nothing per value; only a body that is too deep is walked again to name the field."""
    level: list[Any] = [body]
    for _ in range(MAX_DEPTH):
        deeper: list[Any] = []
        for value in level:
            children = value.values() if type(value) is dict else value
            deeper += [c for c in children if type(c) is dict or type(c) is list]
        if not deeper:
            return
        level = deeper
    _name_the_deep_field(body)


def _name_the_deep_field(body: dict[str, Any]) -> None:
    """Raise the 400 for a body known to be too deep, naming the field that holds the first deep value.

    Iterative, and linear in the number of values: each container is visited once and keeps only a link
    to its parent, so a path is spelt out for the one value that fails, not for the thousands that pass."""
    stack: list[_Node] = [(body, 1, None, "")]
    while stack:
        node = stack.pop()
        value, level = node[0], node[1]
        if level > MAX_DEPTH:
            param = _param(_path_to(node))
            raise _fail(param, f"JSON values may be nested at most {MAX_DEPTH} levels deep.")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        stack.extend((child, level + 1, node, key) for key, child in items if isinstance(child, dict | list))


def _number(body: ChatBody, key: str, low: float, high: float, integer: bool = False) -> None:
    if key not in body or body[key] is None:
        return
    value = body[key]
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    _expect(value, kinds, key, "an integer" if integer else "a number")
    if not low <= value <= high:
        raise _fail(key, f"{value} is out of range; expected a value between {low:g} and {high:g}.")


def _text_parts(parts: list[Any], param: str, allowed: set[str]) -> None:
    for i, part in enumerate(parts):
        where = f"{param}[{i}]"
        _expect(part, dict, where, "a content part object")
        kind = part.get("type")
        if kind not in allowed:
            raise _fail(f"{where}.type", f"expected one of {sorted(allowed)}, got {kind!r}.")
        if kind in ("text", "refusal"):
            _expect(part.get(kind), str, f"{where}.{kind}", "a string")
        elif kind == "image_url":
            image = part.get("image_url")
            _expect(image, dict, f"{where}.image_url", "an object with a 'url'")
            _expect(image.get("url"), str, f"{where}.image_url.url", "a string")
        elif kind == "input_audio":
            audio = part.get("input_audio")
            _expect(audio, dict, f"{where}.input_audio", "an object")
            _expect(audio.get("data"), str, f"{where}.input_audio.data", "a base64 string")
        elif kind == "file":
            file = part.get("file")
            _expect(file, dict, f"{where}.file", "an object")
            for key in ("file_data", "file_id", "filename"):
                if file.get(key) is not None:
                    _expect(file[key], str, f"{where}.file.{key}", "a string")


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
            raise _fail(f"{param}.content", "expected at least one content part, got an empty array.")
        _text_parts(content, f"{param}.content", allowed)
    else:
        _expect(content, str, f"{param}.content", "a string or an array of content parts")


def _tool_calls(calls: Any, param: str) -> None:
    _expect(calls, list, param, "an array")
    for i, call in enumerate(calls):
        where = f"{param}[{i}]"
        _expect(call, dict, where, "an object")
        _expect(call.get("id"), str, f"{where}.id", "a string")
        kind = call.get("type", "function")
        _expect(kind, str, f"{where}.type", "a string")
        if kind != "function" and call.get("function") is not None:
            _expect(call["function"], dict, f"{where}.function", "an object")
        if kind == "function":
            fn = call.get("function")
            _expect(fn, dict, f"{where}.function", "an object")
            _expect(fn.get("name"), str, f"{where}.function.name", "a string")
            _expect(fn.get("arguments"), str, f"{where}.function.arguments", "a string")


def _message(message: Any, param: str) -> None:
    _expect(message, dict, param, "a message object")
    role = message.get("role")
    if role is None:
        raise InvalidRequestError(
            f"Missing required parameter: '{param}.role'.",
            param=f"{param}.role",
            code="missing_required_parameter",
        )
    if role not in ROLES:
        raise _fail(f"{param}.role", f"expected one of {list(ROLES)}, got {role!r}.")
    if "name" in message and message["name"] is not None:
        _expect(message["name"], str, f"{param}.name", "a string")
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
        _expect(message.get("name"), str, f"{param}.name", "a string")
        # The legacy function result: its content is the function's output as a string (or null).
        if message.get("content") is not None:
            _expect(message["content"], str, f"{param}.content", "a string")


def _tools(body: ChatBody) -> None:
    tools = body.get("tools")
    if tools is None:
        return
    _expect(tools, list, "tools", "an array")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        _expect(tool, dict, where, "an object")
        kind = tool.get("type")
        _expect(kind, str, f"{where}.type", "a string")
        if kind == "function":
            fn = tool.get("function")
            _expect(fn, dict, f"{where}.function", "an object")
            name = fn.get("name")
            _expect(name, str, f"{where}.function.name", "a string")
            if not name or len(name) > 64 or not all(c.isalnum() or c in "_-" for c in name):
                raise _fail(f"{where}.function.name", "must be 1-64 characters of a-z, A-Z, 0-9, '_' or '-'.")
            if fn.get("parameters") is not None:
                _expect(fn["parameters"], dict, f"{where}.function.parameters", "a JSON Schema object")


def _tool_choice(body: ChatBody) -> None:
    choice = body.get("tool_choice")
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise _fail("tool_choice", f"expected 'none', 'auto', 'required' or an object, got {choice!r}.")
        return
    _expect(choice, dict, "tool_choice", "a string or an object")


def _stream(body: ChatBody) -> None:
    if body.get("stream") is not None:
        _expect(body["stream"], bool, "stream", "a boolean")
    options = body.get("stream_options")
    if options is None:
        return
    _expect(options, dict, "stream_options", "an object")
    if not body.get("stream"):
        raise _fail("stream_options", "only allowed when 'stream' is true.")
    if options.get("include_usage") is not None:
        _expect(options["include_usage"], bool, "stream_options.include_usage", "a boolean")


def _stop(body: ChatBody) -> None:
    stop = body.get("stop")
    if stop is None or isinstance(stop, str):
        return
    _expect(stop, list, "stop", "a string or an array of strings")
    if len(stop) > 4:
        raise _fail("stop", "at most 4 stop sequences are allowed.")
    for i, item in enumerate(stop):
        _expect(item, str, f"stop[{i}]", "a string")


def _response_format(body: ChatBody) -> None:
    fmt = body.get("response_format")
    if fmt is None:
        return
    _expect(fmt, dict, "response_format", "an object")
    _expect(fmt.get("type"), str, "response_format.type", "a string")


def _simple_types(body: ChatBody) -> None:
    for key, kinds, what in (
        ("user", str, "a string"),
        ("metadata", dict, "an object"),
        ("logit_bias", dict, "an object"),
        ("logprobs", bool, "a boolean"),
        ("parallel_tool_calls", bool, "a boolean"),
        ("store", bool, "a boolean"),
        ("seed", int, "an integer"),
    ):
        if body.get(key) is not None:
            _expect(body[key], kinds, key, what)


CHECKS: tuple[Callable[[ChatBody], None], ...] = (
    _stream,
    _stop,
    _tools,
    _tool_choice,
    _response_format,
    _simple_types,
)


# Content parts per message. Real clients send a handful (a few images, text blocks); each part may become a
# stored file, a row and a summary, so a request of 20,000 parts is work, not a conversation. Checked before
# anything walks the parts.
MAX_CONTENT_PARTS = 1000


def _part_counts(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and len(content) > MAX_CONTENT_PARTS:
            raise _fail(
                f"messages[{i}].content", f"at most {MAX_CONTENT_PARTS} content parts per message, got {len(content)}."
            )


def validate_chat_request(body: Any) -> ChatBody:
    """Return ``body`` if it is a well-formed chat completion request, else raise ``InvalidRequestError``."""
    if not isinstance(body, dict):
        raise InvalidRequestError(
            f"The request body must be a JSON object, got {_type_name(body)}.",
            param=None,
            code="invalid_body",
        )
    _part_counts(body)
    _depth(body)
    model = body.get("model")
    if model is None:
        raise InvalidRequestError(
            "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
        )
    _expect(model, str, "model", "a string")
    if not model:
        raise _fail("model", "must not be empty.")
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequestError(
            "Missing required parameter: 'messages'.", param="messages", code="missing_required_parameter"
        )
    _expect(messages, list, "messages", "an array of message objects")
    if not messages:
        raise _fail("messages", "must contain at least one message.")
    for i, message in enumerate(messages):
        _message(message, f"messages[{i}]")
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    _number(body, "presence_penalty", -2, 2)
    _number(body, "frequency_penalty", -2, 2)
    _number(body, "n", 1, 128, integer=True)
    _number(body, "max_tokens", 1, 2**31, integer=True)
    _number(body, "max_completion_tokens", 1, 2**31, integer=True)
    _number(body, "top_logprobs", 0, 20, integer=True)
    for check in CHECKS:
        check(body)
    return body
