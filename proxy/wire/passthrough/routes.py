"""The rest of OpenAI's API, passed through to a model's deployment without context management: embeddings,
legacy completions, moderations, text to speech, image generation, one model's object; and the routes of
them all. The multipart uploads (audio transcription, image edits) are in ``proxy.wire.passthrough.uploads``,
the checks of the fields in ``proxy.wire.passthrough.shapes``.

Each request is authenticated and routed as chat is (``model`` names a ``model_list`` entry) and reaches
LiteLLM only through ``Upstream.call``: the deployment's litellm_params, the proxy's timeouts, retries and
fallbacks, and one error boundary. The proxy checks the fields each endpoint needs itself (a 400 naming the
param, before any upstream call). OpenAI's other documented fields go to LiteLLM as keyword arguments, for
it to translate for providers that do not speak OpenAI's format; every other field rides in ``extra_body``,
unchanged. Nothing of these bodies is stored or logged.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.errors import InternalError, InvalidRequestError
from proxy.upstream.client import UpstreamStream, describe_upstream
from proxy.upstream.params import call_credentials
from proxy.upstream.routing import ResolvedModel
from proxy.upstream.stream import truncated
from proxy.wire.http import REPORTED, JSONResponse, read_json_body, to_proxy_error
from proxy.wire.passthrough import uploads
from proxy.wire.passthrough.shapes import (
    MAX_EMBEDDING_INPUTS,
    Endpoint,
    check_counts,
    check_depth,
    invalid,
    kind,
    relayed_response,
    route,
    state_of,
    text,
    text_or_object,
    texts_or_parts,
    texts_or_tokens,
    unreadable,
    wire_json,
)
from proxy.wire.sse import DONE, sse_event
from proxy.wire.streaming import ClosingStream, aclose_iterator

if TYPE_CHECKING:
    from proxy.wire.state import AppState

log = logging.getLogger("lcm_proxy.wire")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


async def _prepared(request: Request, endpoint: Endpoint) -> tuple[AppState, ResolvedModel, dict[str, Any]]:
    """Authenticated, read within the size cap, checked and routed: the call's target and arguments."""
    state = state_of(request)
    state.auth.tenant_for(request)  # an AuthenticationError is answered by the application's handler
    settings = state.config.general_settings
    body = await read_json_body(request, settings.max_body_bytes, settings.body_read_timeout)
    if not isinstance(body, dict):
        raise InvalidRequestError(f"The request body must be a JSON object, got {kind(body)}.", code="invalid_body")
    check_counts(body, endpoint.most)  # before anything walks the body
    check_depth(body)
    target = route(state, body)
    return state, target, endpoint.arguments(body)


async def _answered(request: Request, endpoint: Endpoint) -> Response:
    state, target, arguments = await _prepared(request, endpoint)
    return JSONResponse(wire_json(await state.upstream.call(endpoint.function, target, arguments), target))


# --- the endpoints -----------------------------------------------------------------------------------------

EMBEDDINGS = Endpoint(
    "aembedding", {"input": texts_or_tokens}, frozenset({"dimensions", "encoding_format", "user"}),
    allowed=frozenset({"dimensions"}), most={"input": MAX_EMBEDDING_INPUTS},
)  # fmt: skip
COMPLETIONS = Endpoint(
    "atext_completion",
    {"prompt": texts_or_tokens},
    frozenset({
        "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n", "presence_penalty",
        "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
    }),
    streams=True,
)  # fmt: skip
MODERATIONS = Endpoint("amoderation", {"input": texts_or_parts})
SPEECH = Endpoint(
    "aspeech", {"input": text, "voice": text_or_object}, frozenset({"response_format", "speed", "instructions"})
)
IMAGE_GENERATIONS = Endpoint(
    "aimage_generation",
    {"prompt": text},
    frozenset({
        "n", "size", "quality", "response_format", "style", "user", "background", "moderation",
        "output_compression", "output_format",
    }),
)  # fmt: skip


async def embeddings(request: Request) -> Response:
    """Relayed without being parsed (``proxy.upstream.relay``): the upstream's bytes, or LiteLLM's answer
    serialised in a worker thread."""
    state, target, arguments = await _prepared(request, EMBEDDINGS)
    return relayed_response(await state.upstream.call(EMBEDDINGS.function, target, arguments))


async def moderations(request: Request) -> Response:
    return await _answered(request, MODERATIONS)


async def image_generations(request: Request) -> Response:
    return await _answered(request, IMAGE_GENERATIONS)


async def speech(request: Request) -> Response:
    """The audio as the upstream sent it, with its content type."""
    state, target, arguments = await _prepared(request, SPEECH)
    result = await state.upstream.call(SPEECH.function, target, arguments)
    audio = getattr(result, "content", None)
    if not isinstance(audio, bytes):
        raise unreadable(target, "no audio")
    upstream_headers = getattr(getattr(result, "response", None), "headers", None) or {}
    return Response(audio, media_type=upstream_headers.get("content-type") or "application/octet-stream")


async def completions(request: Request) -> Response:
    """Legacy text completions, streamed as SSE ending in ``data: [DONE]`` when the client asks."""
    state, target, arguments = await _prepared(request, COMPLETIONS)
    if not arguments.get("stream"):
        return JSONResponse(wire_json(await state.upstream.call(COMPLETIONS.function, target, arguments), target))
    options = arguments.get("stream_options") or {}
    if not isinstance(options, dict):
        raise invalid("stream_options", f"expected an object, got {kind(options)}.")
    include_usage = bool(options.get("include_usage"))

    async def primed(deployment: ResolvedModel, wrapper: Any, kwargs: dict[str, Any], timeout: float) -> Any:
        """The stream of the deployment that answered, primed: a failure before its first chunk is a real HTTP
        status, or a move to the next deployment."""
        chunks = _text_chunks(wrapper, include_usage)
        stream = UpstreamStream(wrapper, chunks, timeout, call_credentials(kwargs), describe_upstream(deployment))
        try:
            await stream.prime()
        except BaseException:
            await stream.aclose()
            raise
        return stream

    stream = await state.upstream.call(COMPLETIONS.function, target, arguments, stream=True, opened=primed)
    return ClosingStream(_relay(stream), media_type="text/event-stream", headers=SSE_HEADERS)


async def _text_chunks(wrapper: Any, include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    """LiteLLM's text-completion chunks as OpenAI sends them: every choice with its ``text``, ``logprobs`` and
    ``finish_reason`` (LiteLLM leaves the finish chunk's text out), usage only when asked for, on a chunk of
    its own with no choices. A stream that ends before any finish_reason was cut."""
    finished = False
    async for chunk in wrapper:
        data = chunk.model_dump(exclude_none=True, warnings=False)
        usage = data.pop("usage", None)
        choices = data.get("choices") or []
        for choice in choices:
            if isinstance(choice, dict):
                choice.setdefault("text", "")
                choice.setdefault("logprobs", None)
                choice.setdefault("finish_reason", None)
        finished = finished or any(c.get("finish_reason") for c in choices if isinstance(c, dict))
        if usage is not None and include_usage and not any(c.get("text") or c.get("finish_reason") for c in choices):
            yield {**data, "choices": [], "usage": usage}
        elif choices:
            yield data
    if not finished:
        raise truncated()


async def _relay(stream: UpstreamStream) -> AsyncIterator[bytes]:
    """Chunks as SSE. After the first byte the status is sent, so errors become an error event. Closed before
    its end (the client left: ``proxy.wire.streaming``), it closes ``stream`` at once."""
    chunks = aiter(stream)
    try:
        async for chunk in chunks:
            yield sse_event(chunk)
    except REPORTED as error:
        yield sse_event(to_proxy_error(error).to_json())
        return
    except Exception:
        log.exception("unexpected error while streaming a text completion")
        yield sse_event(InternalError("Internal error in lcm-proxy while streaming.").to_json())
        return
    finally:
        await aclose_iterator(chunks)
    yield DONE


def _both(path: str, handler: Callable[[Request], Any], method: str = "POST") -> list[Route]:
    """The route under ``/v1`` and without it, as chat has."""
    return [Route(f"/v1{path}", handler, methods=[method]), Route(path, handler, methods=[method])]


def _routes() -> list[Route]:
    return [
        *_both("/embeddings", embeddings),
        *_both("/completions", completions),
        *_both("/moderations", moderations),
        *_both("/audio/speech", speech),
        *_both("/audio/transcriptions", uploads.transcriptions),
        *_both("/audio/translations", uploads.translations),
        *_both("/images/generations", image_generations),
        *_both("/images/edits", uploads.image_edits),
    ]


PASSTHROUGH_ROUTES = _routes()
