"""The shapes of the passed-through endpoints (``proxy.wire.passthrough.routes``): what the proxy checks of a
request's fields before any upstream call (a 400 naming the param, never a 500), how the fields become
LiteLLM's arguments (``Endpoint``), and LiteLLM's answer as OpenAI's JSON (``wire_json``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import InvalidRequestError, UpstreamError
from proxy.upstream.client import describe_upstream
from proxy.upstream.relay import Relayed
from proxy.upstream.routing import ResolvedModel
from proxy.wire.http import MAX_DEPTH
from proxy.wire.streaming import ClosingStream

if TYPE_CHECKING:
    from proxy.wire.state import AppState

# --- the fields' shapes --------------------------------------------------------------------------------------


def kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else type(value).__name__)


def invalid(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


def missing(param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def text(value: Any, param: str) -> None:
    if not isinstance(value, str):
        raise invalid(param, f"expected a string, got {kind(value)}.")


def text_or_object(value: Any, param: str) -> None:
    """A voice: its name, or an object naming a custom voice (``{"id": ...}``)."""
    if not isinstance(value, str | dict):
        raise invalid(param, f"expected a string or an object, got {kind(value)}.")


def texts_or_tokens(value: Any, param: str) -> None:
    """Embeddings' ``input`` and completions' ``prompt``: a string, strings, token ids, or arrays of them."""
    if isinstance(value, str):
        return
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value) or all(_is_int(v) for v in value):
            return
        if all(isinstance(v, list) and v and all(_is_int(t) for t in v) for v in value):
            return
    got = "an empty array" if value == [] else kind(value) if not isinstance(value, list) else "a mixed array"
    raise invalid(param, f"expected a string, an array of strings, of token ids or of token id arrays, got {got}.")


MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on the inputs of one embeddings request


def check_counts(fields: dict[str, Any], most: dict[str, int]) -> None:
    """Refuse an array field of more items than ``most`` allows, as OpenAI refuses one (embeddings' ``input``:
    2,048 strings or token id arrays; one array of token ids is one input). A length is read in constant time:
    this runs before anything walks the body, so a request of millions of inputs costs the event loop nothing
    and never makes the upstream answer millions of vectors."""
    for param, limit in most.items():
        value = fields.get(param)
        if isinstance(value, list) and len(value) > limit and not _is_int(value[0]):
            raise InvalidRequestError(
                f"Invalid '{param}': array too long. Expected an array with maximum length {limit},"
                f" but got an array with length {len(value)} instead.",
                param=param,
                code="array_above_max_length",
            )


def texts_or_parts(value: Any, param: str) -> None:
    """Moderations' ``input``: a string, strings, or content parts (``{"type": "text", ...}``, images)."""
    if isinstance(value, str):
        return
    strings_or_parts = isinstance(value, list) and {type(v) for v in value} in ({str}, {dict})
    if strings_or_parts:  # not both kinds in one array
        return
    got = "an empty array" if value == [] else kind(value) if not isinstance(value, list) else "a mixed array"
    raise invalid(param, f"expected a string, an array of strings or an array of content parts, got {got}.")


def check_depth(body: dict[str, Any]) -> None:
    """Refuse values nested deeper than chat allows: LiteLLM and the SDK serialise bodies recursively."""
    pending: list[tuple[Any, int, str]] = [(value, 2, key) for key, value in body.items()]
    while pending:
        value, depth, field = pending.pop()
        if not isinstance(value, dict | list):
            continue
        if depth > MAX_DEPTH:
            raise invalid(field, f"values nested more than {MAX_DEPTH} levels deep are not accepted.")
        children = value.values() if isinstance(value, dict) else value
        pending.extend((child, depth + 1, field) for child in children)


# --- one endpoint ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """What an endpoint asks of LiteLLM: its coroutine, the fields it needs (each with its check), OpenAI's
    optional fields (keyword arguments), and whether it may stream. Everything else goes in ``extra_body``."""

    function: str
    required: dict[str, Callable[[Any, str], None]]
    known: frozenset[str] = frozenset()
    streams: bool = False
    # Fields LiteLLM must not refuse for an OpenAI-compatible deployment (it refuses ``dimensions`` for any
    # embedding model not named text-embedding-3*, a local server's included).
    allowed: frozenset[str] = frozenset()
    most: dict[str, int] = field(default_factory=dict)  # the most items an array field may hold (``check_counts``)

    def arguments(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments from the client's fields (``model`` already taken out by ``route``)."""
        for name, check in self.required.items():
            if fields.get(name) is None:
                raise missing(name)
            check(fields[name], name)
        stream = fields.get("stream")
        if self.streams and stream is not None and not isinstance(stream, bool):
            raise invalid("stream", f"expected a boolean, got {kind(stream)}.")
        if not self.streams and stream not in (None, False, "false", "False"):
            raise invalid("stream", "streaming is not supported by lcm-proxy on this endpoint.")
        if not self.streams:
            fields.pop("stream", None)
        arguments = {k: v for k, v in fields.items() if k in self.required or k in self.known}
        extra = {k: v for k, v in fields.items() if k not in arguments}
        if extra:
            arguments["extra_body"] = extra
        allowed = [k for k in self.allowed if k in arguments]
        if allowed:
            arguments["allowed_openai_params"] = allowed
        return arguments


def state_of(request: Request) -> AppState:
    return request.app.state.lcm  # type: ignore[no-any-return]


def route(state: AppState, fields: dict[str, Any]) -> ResolvedModel:
    """The deployment ``fields["model"]`` names (taken out of ``fields``), routed as chat's is."""
    model = fields.pop("model", None)
    if model is None:
        raise missing("model")
    if not isinstance(model, str):
        raise invalid("model", f"expected a string, got {kind(model)}.")
    if not model:
        raise invalid("model", "must not be empty.")
    return state.router.resolve(model)


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def unreadable(target: ResolvedModel, what: str) -> UpstreamError:
    return UpstreamError(
        f"{_capital(describe_upstream(target))} sent {what}.", status=502, code="upstream_bad_response"
    )


def relayed_response(answer: Relayed | bytes) -> Response:
    """An answer the upstream layer did not parse: relayed as it arrives, or JSON serialised off the loop."""
    if isinstance(answer, bytes):
        return Response(answer, media_type="application/json")
    headers = {"content-length": str(answer.length)} if answer.length is not None else None
    return ClosingStream(answer.chunks, status_code=answer.status, media_type=answer.media_type, headers=headers)


def wire_json(result: Any, target: ResolvedModel) -> dict[str, Any]:
    """LiteLLM's response object as OpenAI's JSON: its fields without nulls (LiteLLM's bookkeeping lives in
    private attributes, which ``model_dump`` leaves out)."""
    dump = getattr(result, "model_dump", None)
    # warnings off: LiteLLM types an embedding as floats, and a base64 one (the SDK's default) makes pydantic warn
    data = dump(exclude_none=True, warnings=False) if callable(dump) else None
    if not isinstance(data, dict):
        raise unreadable(target, "a response that could not be read")
    return data
