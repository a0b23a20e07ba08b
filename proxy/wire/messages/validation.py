"""Validation of ``POST /v1/messages`` bodies, and the door's errors in Anthropic's shape.

Only what the proxy reads is checked, against Anthropic's published types: ``model``, ``max_tokens``,
``messages`` (roles, content as a string or a list of typed blocks), ``system``, ``stream``, ``tools``. Every
other field, and every block type the proxy does not know, passes through untouched (Claude Code sends new
ones with new betas). A failure is a 400 naming the parameter (``messages.2.content.0.type``), before anything
is stored or sent.

Errors leave as ``{"type": "error", "error": {"type": ..., "message": ...}}``: the proxy's own with the type
Anthropic uses for their status, the upstream's with the type and wording the upstream gave (Claude Code's
recovery matches on them).
"""

from __future__ import annotations

from typing import Any

from proxy.errors import ContextLengthExceeded, InvalidRequestError, ProxyError
from proxy.wire.http import MAX_DEPTH, JSONResponse

ROLES = ("user", "assistant", "system")
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
KNOWN = frozenset(set(ANTHROPIC_TYPES.values()) | {"api_error", "billing_error"})


def _invalid(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param=param, code="invalid_value")


def _blocks(content: Any, where: str, role: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _invalid(where, "expected a string or an array of content blocks.")
    if not content and role != "assistant":
        raise _invalid(where, "must contain at least one content block.")
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise _invalid(f"{where}.{i}", "expected an object.")
        kind = block.get("type")
        if not isinstance(kind, str) or not kind:
            raise _invalid(f"{where}.{i}.type", "Field required: a content block's type, as a string.")
        if kind == "text" and not isinstance(block.get("text"), str):
            raise _invalid(f"{where}.{i}.text", "expected a string.")
        if kind == "tool_use" and not (isinstance(block.get("id"), str) and isinstance(block.get("name"), str)):
            raise _invalid(f"{where}.{i}", "a tool_use block needs an `id` and a `name` (strings).")
        if kind == "tool_result" and not isinstance(block.get("tool_use_id"), str):
            raise _invalid(f"{where}.{i}.tool_use_id", "expected a string.")


def _check_depth(body: dict[str, Any]) -> None:
    """At most ``MAX_DEPTH`` levels (the body is level 1), checked before anything recursive walks the body:
    iterative, each container visited once, the path spelt out only for the value that fails."""
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(body, 1, ())]
    while stack:
        value, level, path = stack.pop()
        if level > MAX_DEPTH:
            raise _invalid(".".join(path) or "body", f"JSON values may be nested at most {MAX_DEPTH} levels deep.")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        stack.extend((child, level + 1, (*path, str(key))) for key, child in items if isinstance(child, dict | list))


def validate_messages_request(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.", param="body")
    _check_depth(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model", "Field required: the model's name, as a string.")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _invalid("max_tokens", "Field required: a positive integer.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "Field required: a non-empty array of messages.")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(f"messages.{i}", "expected an object.")
        role = message.get("role")
        if role not in ROLES:
            raise _invalid(f"messages.{i}.role", "expected 'user' or 'assistant'.")
        if "content" not in message:
            raise _invalid(f"messages.{i}.content", "Field required.")
        _blocks(message["content"], f"messages.{i}.content", str(role))
    system = body.get("system")
    if system is not None:
        _blocks(system, "system", "system")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _invalid("stream", "expected a boolean.")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _invalid("tools", "expected an array.")
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                raise _invalid(f"tools.{i}.name", "Field required: the tool's name, as a string.")
    return body


def validate_count_request(body: Any) -> dict[str, Any]:
    """``count_tokens`` takes a Messages body without ``max_tokens``."""
    if isinstance(body, dict) and "max_tokens" not in body:
        body = {**body, "max_tokens": 1}
    return validate_messages_request(body)


def anthropic_error(error: ProxyError) -> dict[str, Any]:
    kind = error.type if error.type in KNOWN else None
    if kind is None:
        kind = ANTHROPIC_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def error_response(error: ProxyError, headers: dict[str, str] | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if not error.retryable:
        headers["x-should-retry"] = "false"
    retry_after = getattr(error, "retry_after", None)
    if retry_after is not None:
        headers.setdefault("retry-after", str(retry_after))
    if getattr(error, "close_connection", False):
        headers["connection"] = "close"
    return JSONResponse(anthropic_error(error), status_code=error.status, headers=headers)


def worded(error: ProxyError) -> ProxyError:
    """The proxy's own "too long" refusals worded as Anthropic's: a prompt that cannot fit as "prompt is too long"
    (which Claude Code's reactive compaction reads), an output reserve that leaves no room as "input length and
    `max_tokens` exceed context limit" (a compaction cannot help that one)."""
    if not isinstance(error, ContextLengthExceeded) or error.message.lower().startswith(("prompt is", "input length")):
        return error
    if error.param == "max_tokens":
        error.message = f"input length and `max_tokens` exceed context limit: {error.message}"
    else:
        error.message = f"prompt is too long: {error.message}"
    return error
