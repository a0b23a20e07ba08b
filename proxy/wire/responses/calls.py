"""The Responses door's upstream call, whichever kind of deployment serves the model: one that speaks Responses
gets the request natively and its events are relayed (``proxy.upstream.responses``); any other gets it
translated to Chat Completions and its answer translated back, stream included
(``proxy.upstream.translate_responses``). Either way the door sees one shape: a whole response object, or a
stream of event dicts.

What goes upstream is the request as the client sent it, with the proxy's assembled ``input`` in place of the
client's and never a ``previous_response_id`` (the proxy keeps chains itself and sends the whole history); it
is sent with ``store: false`` (the proxy stores what the client asked to store), so reasoning items come back
with their ``encrypted_content``, which is how they can be replayed without the upstream's storage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.errors import InvalidRequestError
from proxy.relay.turn import Services
from proxy.types import Messages
from proxy.upstream.routing import ResolvedModel
from proxy.upstream.translate_responses import Untranslatable, chat_to_response, responses_to_chat
from proxy.upstream.translate_responses_stream import ChatToResponsesStream

Events = AsyncIterator[dict[str, Any]]
ENCRYPTED_REASONING = "reasoning.encrypted_content"
# Client headers a Responses upstream receives as they came (besides every ``x-codex-*`` header).
FORWARDED = frozenset({"openai-beta", "session-id", "originator", "user-agent", "version"})


def client_headers(headers: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers.items():
        name = name.lower()
        if name in FORWARDED or name.startswith("x-codex-"):
            out[name] = value
    return out


def upstream_body(body: dict[str, Any], items: Messages) -> dict[str, Any]:
    """What the upstream receives. A reasoning item without ``encrypted_content`` is left out: with ``store:
    false`` the upstream has no copy to look it up by id (it refuses it), and the client did not ask for the
    content (``include``) that would let it be replayed."""
    out = {k: v for k, v in body.items() if k not in ("previous_response_id", "input")}
    out["input"] = [i for i in items if i.get("type") != "reasoning" or i.get("encrypted_content")]
    out["store"] = False
    if body.get("reasoning"):  # a reasoning model: its reasoning comes back replayable
        include = [x for x in body.get("include") or [] if isinstance(x, str)]
        out["include"] = include if ENCRYPTED_REASONING in include else [*include, ENCRYPTED_REASONING]
    return out


def _chat(body: dict[str, Any]) -> dict[str, Any]:
    try:
        return responses_to_chat(body)
    except Untranslatable as error:
        raise InvalidRequestError(str(error), param=error.param, code="invalid_value") from None


@dataclass
class Opened:
    events: Events
    close: Callable[[], Awaitable[None]]


async def complete(
    state: Services, target: ResolvedModel, body: dict[str, Any], headers: dict[str, str], native: bool, rid: str
) -> dict[str, Any]:
    if native:
        answer = await state.upstream.responses(target, body, headers)
        return {**answer, "id": rid}
    result = await state.upstream.complete(target, _chat(body))
    return chat_to_response(result, body, rid)


async def open_stream(
    state: Services, target: ResolvedModel, body: dict[str, Any], headers: dict[str, str], native: bool, rid: str
) -> Opened:
    """Open the upstream's stream, its first event read (an early failure raises here, before any byte is sent)."""
    stream: Any
    if native:
        stream = await state.upstream.open_responses_stream(target, {**body, "stream": True}, headers)
        source: Any = stream
    else:
        stream = await state.upstream.open_stream(target, {**_chat(body), "stream": True})
        source = ChatToResponsesStream(stream, body, rid)
    iterator = aiter(source)
    try:
        first = await anext(iterator, None)
    except BaseException:
        await stream.aclose()
        raise
    return Opened(_events(first, iterator), stream.aclose)


async def _events(first: Any, rest: AsyncIterator[Any]) -> Events:
    event = first
    while event is not None:
        yield event.data if hasattr(event, "data") else event
        event = await anext(rest, None)
