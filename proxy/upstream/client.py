"""The upstream provider, reached through LiteLLM (imported and configured by ``proxy.upstream.loading``).

Three jobs:

* **Forwarding without surprises.** For OpenAI-compatible providers the client's body is forwarded field
  for field: everything except ``model``/``stream``/``stream_options`` rides in ``extra_body`` (which the
  OpenAI SDK inside LiteLLM merges into the JSON last), *including* ``messages``, so LiteLLM's rewrites
  (``developer`` -> ``system``, dropped ``refusal: null``/``content: null``) never reach the wire. Other
  providers get the standard OpenAI parameters as keyword arguments, for LiteLLM to translate. Where LiteLLM would
  only build the URL and headers, the proxy sends the request itself (``proxy.upstream.direct``).
* **No hidden retries, real timeouts.** LiteLLM's and the OpenAI SDK's retries are switched off. Every call
  goes through ``Upstream._call``: one pass over the model's deployments and fallbacks (``proxy.upstream.balancer``),
  each tried once, moving on only on a retryable failure before the first byte; the proxy's own
  ``upstream_retries`` repeats that pass. A stream's timeout counts data, not bytes: an upstream that sends
  only keep-alive comments is cut off like one that sends nothing.
* **One error boundary.** ``proxy.upstream.errors.map_litellm_exceptions`` turns every LiteLLM/OpenAI/httpx/
  aiohttp exception into a ``proxy.errors.UpstreamError`` carrying the upstream's status and fields. What the
  upstream answered is checked before anything reads it (``proxy.upstream.stream``, ``proxy.upstream.rounds``): a
  malformed answer is a 502 naming the upstream (``upstream_bad_response``, ``upstream_bad_stream``), never a
  500. Every message leaving it, and every error event inside a stream, goes through
  ``redact_upstream_message``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import functools
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson

from proxy.config.settings import GeneralSettings
from proxy.errors import UpstreamError
from proxy.redaction import environment_credentials, rules
from proxy.types import ChatBody, JSONObject
from proxy.upstream import anthropic, direct, pool, responses
from proxy.upstream.balancer import Balancer, backoff, exhausted, switch_line, switchable
from proxy.upstream.errors import (
    DEFAULT_UPSTREAM,
    describe_upstream,
    is_context_length_error,
    map_litellm_exceptions,
    redact_upstream_message,
    request_not_sent,
    translate_exception,
)
from proxy.upstream.loading import is_passthrough, load_litellm, without_success_logging
from proxy.upstream.native import MESSAGES_CALL, RESPONSES_CALL, NativeCalls
from proxy.upstream.openai import OPENAI_CALLS, OWN_CLIENT_CALLS, openai_client, unsupported
from proxy.upstream.params import (
    PLACEHOLDER_KEY,
    ROUTER_ONLY_PARAMS,
    TRANSLATED_PARAMS,
    call_credentials,
)
from proxy.upstream.relay import (
    EMBEDDING_FIELDS,
    Relayed,
    not_json,
    relay,
    relayable,
    too_large,
)
from proxy.upstream.rounds import Round
from proxy.upstream.routing import ResolvedModel
from proxy.upstream.shapes import response_to_json
from proxy.upstream.sse_events import EventStream
from proxy.upstream.stream import UpstreamStream, litellm_chunks, sse_chunks
from proxy.upstream.windows import ServerWindows

__all__ = [
    "Upstream",
    "UpstreamStream",
    "describe_upstream",
    "is_context_length_error",
    "load_litellm",
    "redact_upstream_message",
    "translate_exception",
]

log = logging.getLogger("lcm_proxy.upstream")
# Finishes an attempt with what LiteLLM returned: (deployment, answer, kwargs, timeout) -> the result.
Opened = Callable[[ResolvedModel, Any, dict[str, Any], float], Awaitable[Any]] | None

MAX_UNSENT_RESENDS = 3  # the pooled connections of one burst go idle, and stale, together


# --- calls -------------------------------------------------------------------------------------------------


# LiteLLM's synchronous embedding calls (deployments the relay cannot call) at most this many at a time, in
# threads of their own; more wait their turn in the pool's queue, off the event loop and the default executor.
EMBEDDING_THREADS = 4


@functools.cache
def _embedding_threads() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(EMBEDDING_THREADS, thread_name_prefix="lcm-embeddings")


class Upstream(NativeCalls):
    def __init__(self, settings: GeneralSettings) -> None:
        self._settings = settings
        self._litellm = load_litellm()
        self.balancer = Balancer(settings)  # which deployment of a model first: in-flight counts, cooldowns
        self._windows: dict[str, int | None] = {}
        self.windows = ServerWindows()  # what each deployment's server says its context is (proxy.upstream.windows)
        self._tool_callers: dict[str, bool | None] = {}

    def context_window(self, model: str) -> int | None:
        """The input-token limit LiteLLM's (bundled, offline) model map knows for ``model``, if any."""
        if model not in self._windows:
            try:
                info = self._litellm.get_model_info(model)
                window = info.get("max_input_tokens") or info.get("max_tokens")
                self._windows[model] = int(window) if window else None
            except Exception:  # unknown models raise
                self._windows[model] = None
        return self._windows[model]

    def supports_function_calling(self, model: str) -> bool | None:
        """Whether LiteLLM's model map says ``model`` makes structured tool calls (None: it does not know)."""
        if model not in self._tool_callers:
            try:
                known = self._litellm.get_model_info(model).get("supports_function_calling")
                self._tool_callers[model] = bool(known) if known is not None else None
            except Exception:  # unknown models raise
                self._tool_callers[model] = None
        return self._tool_callers[model]

    def probe_windows(self, targets: list[ResolvedModel]) -> None:
        """Ask the servers of the deployments with an ``api_base`` that speaks OpenAI's protocol (llama.cpp,
        vLLM, LM Studio...) for their context size, in the background (``proxy.upstream.windows``)."""
        self.windows.start(t for t in targets if t.litellm_params.get("api_base") and is_passthrough(t.litellm_params))

    def _kwargs(self, target: ResolvedModel, body: ChatBody, stream: bool) -> tuple[dict[str, Any], float]:
        kwargs, timeout = self.call_kwargs(target, stream)
        kwargs["stream"] = stream
        if stream and body.get("stream_options") is not None:
            # A real keyword: inside extra_body LiteLLM silently drops the usage chunk.
            kwargs["stream_options"] = copy.deepcopy(body["stream_options"])
        extras = {k: v for k, v in body.items() if k not in ("model", "messages", "stream", "stream_options")}
        if is_passthrough(kwargs):
            # The real messages ride in extra_body, which the OpenAI SDK merges into the JSON last. LiteLLM
            # and the SDK see none: the SDK's recursive TypedDict transform of ``messages`` costs ~0.14 ms per
            # message (140 ms for 1,000; even a one-message placeholder cost ~0.4 ms), and LiteLLM's rewrites
            # must not reach the wire anyway. A fresh list: some LiteLLM providers edit the list in place.
            kwargs["messages"] = []
            kwargs["extra_body"] = {**copy.deepcopy(extras), "messages": body["messages"]}
            if target.direct and (point := direct.endpoint(self._litellm, kwargs)) is not None:
                kwargs[direct.KEY] = point  # sent by ``proxy.upstream.direct``, not LiteLLM
        else:
            # LiteLLM may rewrite what it is given; the client's objects must stay as they were sent.
            kwargs["messages"] = copy.deepcopy(body["messages"])
            # Native providers: LiteLLM translates the OpenAI parameters it knows; the rest go as-is.
            kwargs.update({k: copy.deepcopy(v) for k, v in extras.items() if k in TRANSLATED_PARAMS})
            rest = {k: v for k, v in extras.items() if k not in TRANSLATED_PARAMS}
            if rest:
                kwargs["extra_body"] = copy.deepcopy(rest)
            kwargs["_skip_mcp_handler"] = True  # else tools=[...] needs the optional 'mcp' package
        return kwargs, timeout

    async def _call(
        self,
        target: ResolvedModel,
        build: Callable[[ResolvedModel], tuple[dict[str, Any], float]],
        function: str = "acompletion",
        opened: Opened = None,
    ) -> Any:
        """Every LiteLLM call happens here: one pass over ``target``'s deployments and fallbacks in the balancer's
        order, each tried once with ``build(deployment)``'s kwargs and timeout; a retryable failure (``switchable``)
        moves on to the next at once. ``opened(deployment, answer, kwargs, timeout)`` finishes an attempt (a stream
        reads its first chunk there, so a failure before it moves on too). When the whole pass failed,
        ``upstream_retries`` repeats it after a backoff. A deployment is busy until its answer or stream ends."""
        attempt, alone = 0, len(target.candidates()) == 1
        while True:
            chain = self.balancer.order(target)
            for position, candidate in enumerate(chain):
                kwargs, timeout = build(candidate)
                end = self.balancer.start(candidate)
                try:
                    answer = await self._send(kwargs, timeout, describe_upstream(candidate), function)
                    result = answer if opened is None else await opened(candidate, answer, kwargs, timeout)
                except UpstreamError as exc:
                    end()
                    if not switchable(exc):
                        if is_context_length_error(exc):
                            self.windows.learn_from_refusal(candidate, exc.message)
                        exc.deployment = candidate
                        raise
                    if not alone:
                        self.balancer.failed(candidate)
                    error = exc
                    if position + 1 < len(chain):
                        log.warning("%s", switch_line(candidate, exc, chain[position + 1]))
                    continue
                except BaseException:
                    end()
                    raise
                if isinstance(result, UpstreamStream | EventStream):
                    result.on_close(end)  # busy until the stream is closed
                else:
                    end()
                self.balancer.succeeded(candidate)
                return result
            if attempt >= self._settings.upstream_retries:
                raise exhausted(target, chain, error)
            attempt += 1
            await asyncio.sleep(backoff(attempt))

    async def _send(
        self, kwargs: dict[str, Any], timeout: float, upstream: str = DEFAULT_UPSTREAM, function: str = "acompletion"
    ) -> Any:
        """One call to one deployment. A request that never left (``request_not_sent``) is sent again at once,
        on another connection: not a retry, the upstream saw nothing. ``upstream`` names the provider in the
        errors the proxy words itself (see ``describe_upstream``); ``function`` is the LiteLLM coroutine
        function (``acompletion``, ``aembedding``...)."""
        resent = 0
        credentials = call_credentials(kwargs)
        if log.isEnabledFor(logging.DEBUG):  # names and sizes only: never content
            messages = (kwargs.get("extra_body") or {}).get("messages") or kwargs.get("messages") or []
            log.debug(
                "upstream call: model %s, %d messages, stream %s",
                kwargs.get("model"),
                len(messages),
                kwargs.get("stream"),
            )
        while True:
            try:
                with map_litellm_exceptions(timeout, credentials, upstream), without_success_logging():
                    if function == "aembedding":
                        return await self._embedding(kwargs, upstream)
                    if function == MESSAGES_CALL:
                        return await anthropic.send(self._litellm, kwargs, kwargs.get("messages_path", "/messages"))
                    if function == RESPONSES_CALL:
                        return await responses.send(self._litellm, kwargs)
                    if direct.KEY in kwargs:
                        return await direct.send(kwargs, self._settings.max_upstream_response_bytes, upstream)
                    if function in OPENAI_CALLS:
                        return await self._openai_call(function, kwargs, upstream)
                    return await getattr(self._litellm, function)(**kwargs)
            except UpstreamError as exc:
                if resent < MAX_UNSENT_RESENDS and request_not_sent(exc):
                    resent += 1
                    continue
                raise

    def call_kwargs(self, target: ResolvedModel, stream: bool = False) -> tuple[dict[str, Any], float]:
        """The keyword arguments every call to ``target`` carries (its litellm_params, the proxy's timeouts, no
        hidden retries, a placeholder key for a keyless api_base), and the call's timeout in seconds."""
        params = {k: v for k, v in target.litellm_params.items() if k not in ROUTER_ONLY_PARAMS}
        call_timeout = params.pop("timeout", None)
        stream_timeout = params.pop("stream_timeout", None)
        timeout = float((stream_timeout if stream else None) or call_timeout or self._settings.request_timeout)
        # A separate, short connect timeout: a dead host should fail in seconds, not after request_timeout.
        http_timeout = httpx.Timeout(timeout, connect=min(timeout, self._settings.connect_timeout))
        if params.get("api_base") and not params.get("api_key"):
            # Without a key the OpenAI SDK inside LiteLLM would send the proxy's own $OPENAI_API_KEY to
            # whatever api_base says. Local servers ignore the key; a placeholder keeps ours private.
            params["api_key"] = PLACEHOLDER_KEY
        if self._settings.drop_params:
            params.setdefault("drop_params", True)  # LiteLLM drops what the provider does not support
        return {**params, "timeout": http_timeout, "max_retries": 0, "num_retries": 0}, timeout

    async def call(
        self,
        function: str,
        target: ResolvedModel,
        arguments: dict[str, Any],
        stream: bool = False,
        opened: Opened = None,
    ) -> Any:
        """A LiteLLM call other than chat (``aembedding``, ``atext_completion``, ``amoderation``...) to ``target``
        with ``arguments`` (the client's fields), under the same timeouts, retries, fallbacks and error boundary
        as chat. Returns what LiteLLM returns, or what ``opened`` makes of it (see ``_call``)."""

        def build(candidate: ResolvedModel) -> tuple[dict[str, Any], float]:
            kwargs, timeout = self.call_kwargs(candidate, stream)
            if function in OWN_CLIENT_CALLS and is_passthrough(kwargs):
                kwargs["client"] = openai_client(kwargs)
            return {**kwargs, **arguments}, timeout

        return await self._call(target, build, function, opened)

    async def _embedding(self, kwargs: dict[str, Any], upstream: str) -> Relayed | bytes:
        """Embeddings, never parsed on the event loop (``proxy.upstream.relay``): relayed as the upstream sends
        them from an OpenAI-compatible deployment, else LiteLLM's synchronous call and its answer's JSON in a
        worker thread."""
        if is_passthrough(kwargs) and relayable(kwargs, EMBEDDING_FIELDS):
            model, provider, key, base = self._litellm.get_llm_provider(
                model=kwargs["model"], custom_llm_provider=kwargs.get("custom_llm_provider"),
                api_base=kwargs.get("api_base"),
            )  # fmt: skip
            key = kwargs.get("api_key") or key
            if provider == "openai":  # LiteLLM's defaults for OpenAI itself
                base = base or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE")
                base = base or "https://api.openai.com/v1"
                key = key or os.environ.get("OPENAI_API_KEY")
            if base and key:
                limit = self._settings.max_upstream_response_bytes
                return await relay("/embeddings", kwargs, model, base, key, EMBEDDING_FIELDS, limit, upstream)
        # Not the default executor (asyncio.to_thread): chat's work runs there (JSON parsing, ingest hashing, file
        # reads, recall grep), and slow upstreams holding each thread up to request_timeout would stall it.
        call = functools.partial(contextvars.copy_context().run, self._embedding_json, kwargs, upstream)
        return await asyncio.get_running_loop().run_in_executor(_embedding_threads(), call)

    def _embedding_json(self, kwargs: dict[str, Any], upstream: str) -> bytes:
        result = self._litellm.embedding(**kwargs)
        dump = getattr(result, "model_dump", None)
        # warnings off: LiteLLM types an embedding as floats, and a base64 one (the SDK's default) makes pydantic warn
        data = dump(exclude_none=True, warnings=False) if callable(dump) else None
        if not isinstance(data, dict):
            raise not_json(upstream)
        answer = orjson.dumps(data)
        if len(answer) > self._settings.max_upstream_response_bytes:
            raise too_large(upstream, self._settings.max_upstream_response_bytes)
        return answer

    async def _openai_call(self, function: str, kwargs: dict[str, Any], upstream: str) -> Any:
        """A call LiteLLM has no function for (``proxy.upstream.openai``), to an OpenAI-compatible provider."""
        call, what = OPENAI_CALLS[function]
        if not is_passthrough(kwargs):
            raise unsupported(what, upstream)
        provider, base = kwargs.get("custom_llm_provider"), kwargs.get("api_base")
        model = self._litellm.get_llm_provider(model=kwargs["model"], custom_llm_provider=provider, api_base=base)[0]
        return await call(kwargs, model, openai_client(kwargs))

    async def warm_up(self) -> None:
        """Make one failing call, streamed and not, so LiteLLM's lazy imports (~0.3 s, the OpenAI client, its
        transport) happen now rather than in the first user's request, and before the server freezes its
        startup heap (see ``proxy.app``). The call goes to a loopback port that is bound but not listening:
        the connection is refused at once and nothing leaves the machine. The redaction rules (an import of
        detect-secrets) and the environment's credentials are loaded here too, not in the first error."""
        rules()
        environment_credentials()
        with socket.socket() as refused:
            refused.bind(("127.0.0.1", 0))
            api_base = f"http://127.0.0.1:{refused.getsockname()[1]}/v1"
            for stream in (False, True):
                with contextlib.suppress(Exception), without_success_logging():
                    await self._litellm.acompletion(
                        model="openai/lcm-proxy-warm-up",
                        messages=[],
                        extra_body={"messages": [{"role": "user", "content": "warm-up"}]},
                        api_base=api_base,
                        api_key="warm-up",
                        stream=stream,
                        timeout=5,
                        max_retries=0,
                        num_retries=0,
                    )

    async def complete(self, target: ResolvedModel, body: ChatBody) -> JSONObject:
        async def checked(candidate: ResolvedModel, answer: Any, kwargs: dict[str, Any], timeout: float) -> JSONObject:
            result = answer if isinstance(answer, dict) else response_to_json(answer)
            # What LiteLLM let through must still be an answer every reader can use (a tool call with no name
            # is not): a 502 naming the upstream, here, for the plain path and the recall loop alike.
            Round.from_response(result, describe_upstream(candidate))
            return result

        result: JSONObject = await self._call(target, lambda c: self._kwargs(c, body, stream=False), opened=checked)
        return result

    async def open_stream(self, target: ResolvedModel, body: ChatBody) -> UpstreamStream:
        """Start a streamed completion and wait for its first chunk, so early failures raise here (and may
        move on to another deployment: nothing has reached the client yet)."""
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def primed(candidate: ResolvedModel, wrapper: Any, kwargs: dict[str, Any], timeout: float) -> Any:
            upstream = describe_upstream(candidate)
            response = getattr(getattr(wrapper, "completion_stream", None), "response", wrapper)  # wrapper: direct
            credentials = call_credentials(kwargs)
            if is_passthrough(kwargs) and isinstance(response, httpx.Response | pool.Response):
                chunks = sse_chunks(response, include_usage, credentials, upstream)
            else:
                chunks = litellm_chunks(wrapper, include_usage)
            stream = UpstreamStream(wrapper, chunks, timeout, credentials, upstream)
            try:
                await stream.prime()
            except BaseException:
                await stream.aclose()
                raise
            return stream

        stream: UpstreamStream = await self._call(target, lambda c: self._kwargs(c, body, stream=True), opened=primed)
        return stream
