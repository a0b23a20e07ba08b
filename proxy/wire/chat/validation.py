"""Validation of ``POST /v1/chat/completions`` bodies, done by the proxy itself.

The proxy must reject malformed input with a 400 that names the offending parameter (OpenAI style,
e.g. ``messages[2].tool_calls[0].function.arguments``) *before* spending an upstream call, and it must never
answer a bad request with a 500. Unknown top-level fields are vendor extras and pass through untouched,
so only the fields whose meaning we know are checked here, against OpenAI's published types and ranges.

First the bounds of the body (``limits``: content parts, nesting depth), then the messages (``messages``), then
the request's other parameters (here); ``refusals`` spells the 400s.

Messages the door validated before, in an earlier request of the same tenant, are not checked again: ``seen``
(``proxy.engine.seen``) proves by their serialised bytes that they have the very values that passed then, and
every check of a message depends on its value alone. The rest of the body is checked in full, every time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from proxy.dialects.chat import INSTRUCTION_ROLES
from proxy.engine.seen import Fingerprint, Seen, measure
from proxy.errors import InvalidRequestError
from proxy.types import ChatBody
from proxy.wire.chat.limits import check_depth, check_part_counts
from proxy.wire.chat.messages import check_message
from proxy.wire.chat.refusals import expect, invalid, type_name


def _number(body: ChatBody, key: str, low: float, high: float, integer: bool = False) -> None:
    if key not in body or body[key] is None:
        return
    value = body[key]
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    expect(value, kinds, key, "an integer" if integer else "a number")
    if not low <= value <= high:
        raise invalid(key, f"{value} is out of range; expected a value between {low:g} and {high:g}.")


def _tools(body: ChatBody) -> None:
    tools = body.get("tools")
    if tools is None:
        return
    expect(tools, list, "tools", "an array")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        expect(tool, dict, where, "an object")
        kind = tool.get("type")
        expect(kind, str, f"{where}.type", "a string")
        if kind == "function":
            fn = tool.get("function")
            expect(fn, dict, f"{where}.function", "an object")
            name = fn.get("name")
            expect(name, str, f"{where}.function.name", "a string")
            if not name or len(name) > 64 or not all(c.isalnum() or c in "_-" for c in name):
                raise invalid(f"{where}.function.name", "must be 1-64 characters of a-z, A-Z, 0-9, '_' or '-'.")
            if fn.get("parameters") is not None:
                expect(fn["parameters"], dict, f"{where}.function.parameters", "a JSON Schema object")


def _tool_choice(body: ChatBody) -> None:
    choice = body.get("tool_choice")
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise invalid("tool_choice", f"expected 'none', 'auto', 'required' or an object, got {choice!r}.")
        return
    expect(choice, dict, "tool_choice", "a string or an object")


def _stream(body: ChatBody) -> None:
    if body.get("stream") is not None:
        expect(body["stream"], bool, "stream", "a boolean")
    options = body.get("stream_options")
    if options is None:
        return
    expect(options, dict, "stream_options", "an object")
    if not body.get("stream"):
        raise invalid("stream_options", "only allowed when 'stream' is true.")
    if options.get("include_usage") is not None:
        expect(options["include_usage"], bool, "stream_options.include_usage", "a boolean")


def _stop(body: ChatBody) -> None:
    stop = body.get("stop")
    if stop is None or isinstance(stop, str):
        return
    expect(stop, list, "stop", "a string or an array of strings")
    if len(stop) > 4:
        raise invalid("stop", "at most 4 stop sequences are allowed.")
    for i, item in enumerate(stop):
        expect(item, str, f"stop[{i}]", "a string")


def _response_format(body: ChatBody) -> None:
    fmt = body.get("response_format")
    if fmt is None:
        return
    expect(fmt, dict, "response_format", "an object")
    expect(fmt.get("type"), str, "response_format.type", "a string")


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
            expect(body[key], kinds, key, what)


CHECKS: tuple[Callable[[ChatBody], None], ...] = (
    _stream,
    _stop,
    _tools,
    _tool_choice,
    _response_format,
    _simple_types,
)


# Bodies above this many bytes are measured (serialised and hashed) in a worker thread: the event loop stays free.
MEASURE_ON_LOOP_BYTES = 1 << 20


async def fingerprint(seen: Seen, tenant: str, body: Any, size: int = 0) -> Fingerprint | None:
    """The fingerprint of ``body``'s transcript among what ``tenant`` sent before (any JSON value: this comes
    before validation); ``validate_chat_request`` skips what it shows was validated already. ``size``: the
    body's length in bytes, when known."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return None
    start = 0  # leading instructions, as the chat dialect splits them off a valid list
    while start < len(messages) and isinstance(messages[start], dict):
        if messages[start].get("role") not in INSTRUCTION_ROLES:
            break
        start += 1
    if size <= MEASURE_ON_LOOP_BYTES:
        return seen.look(tenant, "chat", messages, start)
    measured = await asyncio.to_thread(measure, tenant, "chat", messages, start)  # pure: no shared state
    return seen.match(measured) if measured is not None else None


def validate_chat_request(body: Any, seen: Fingerprint | None = None) -> ChatBody:
    """Return ``body`` if it is a well-formed chat completion request, else raise ``InvalidRequestError``.
    ``seen``: ``body``'s fingerprint (``fingerprint``); its messages validated before are not checked again,
    and it is marked validated when the whole body passes."""
    describes = seen is not None and isinstance(body, dict) and seen.fits(body.get("messages"), seen.start, "chat")
    known = seen.valid_span if seen is not None and describes else range(0)
    if not isinstance(body, dict):
        raise InvalidRequestError(
            f"The request body must be a JSON object, got {type_name(body)}.",
            param=None,
            code="invalid_body",
        )
    check_part_counts(body, known)
    check_depth(body, known)
    model = body.get("model")
    if model is None:
        raise InvalidRequestError(
            "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
        )
    expect(model, str, "model", "a string")
    if not model:
        raise invalid("model", "must not be empty.")
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequestError(
            "Missing required parameter: 'messages'.", param="messages", code="missing_required_parameter"
        )
    expect(messages, list, "messages", "an array of message objects")
    if not messages:
        raise invalid("messages", "must contain at least one message.")
    for i in (*range(known.start), *range(known.stop, len(messages))):
        check_message(messages[i], f"messages[{i}]")
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
    if seen is not None and describes:
        seen.validated = True
    return body
