"""The calls made natively, in the client's own wire format, to deployments that speak it: Anthropic's
Messages (``proxy.upstream.anthropic``) and OpenAI's Responses (``proxy.upstream.responses``).

``NativeCalls`` is a mixin of ``proxy.upstream.client.Upstream``: each call goes through the same ``_call`` as
chat (the balancer's order, fallbacks, ``upstream_retries``, the error boundary), with a function name that
``Upstream._send`` dispatches to the module that sends it (``MESSAGES_CALL``, ``RESPONSES_CALL``). A stream is
returned open, its status checked (an error status raises before anything reaches the client, and may move on
to another deployment); the door reads its first event. Doors for deployments that do not speak the format
translate to and from Chat Completions instead (``proxy.upstream.translate``,
``proxy.upstream.translate_responses``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from proxy.config.settings import GeneralSettings
from proxy.types import JSONObject
from proxy.upstream import anthropic, responses
from proxy.upstream.anthropic import MessagesStream
from proxy.upstream.errors import describe_upstream, map_litellm_exceptions
from proxy.upstream.params import call_credentials
from proxy.upstream.responses import ResponsesStream
from proxy.upstream.routing import ResolvedModel

MESSAGES_CALL = "anthropic_messages"  # ``Upstream._send``'s name for a native Messages call
RESPONSES_CALL = "openai_responses"  # ``Upstream._send``'s name for a native Responses call

Build = Callable[[ResolvedModel], tuple[dict[str, Any], float]]
Opened = Callable[[ResolvedModel, Any, dict[str, Any], float], Awaitable[Any]]


class NativeCalls:
    """Messages and Responses calls, natively; ``Upstream`` provides what they are made with."""

    _settings: GeneralSettings
    _litellm: Any

    def call_kwargs(self, target: ResolvedModel, stream: bool = False) -> tuple[dict[str, Any], float]:
        raise NotImplementedError  # ``Upstream.call_kwargs``

    async def _call(self, target: ResolvedModel, build: Build, function: str, opened: Opened | None) -> Any:
        raise NotImplementedError  # ``Upstream._call``

    def _native_kwargs(self, candidate: ResolvedModel, stream: bool, **fields: Any) -> tuple[dict[str, Any], float]:
        kwargs, timeout = self.call_kwargs(candidate, stream)
        return {**kwargs, **fields}, timeout

    async def _native_json(self, target: ResolvedModel, function: str, reader: Any, build: Build) -> JSONObject:
        limit = self._settings.max_upstream_response_bytes

        async def opened(candidate: ResolvedModel, response: Any, kwargs: dict[str, Any], timeout: float) -> Any:
            upstream = describe_upstream(candidate)
            with map_litellm_exceptions(timeout, call_credentials(kwargs), upstream):
                return await reader(response, limit, upstream)

        result: JSONObject = await self._call(target, build, function, opened)
        return result

    # Anthropic's Messages API (``proxy.upstream.anthropic``)

    def speaks_messages(self, target: ResolvedModel) -> bool:
        """Whether ``target``'s deployment is an Anthropic one, called with Messages requests natively."""
        kwargs, _ = self.call_kwargs(target)
        return anthropic.is_anthropic(self._litellm, kwargs)

    def _messages_kwargs(
        self, candidate: ResolvedModel, body: JSONObject, headers: dict[str, str], stream: bool, path: str
    ) -> tuple[dict[str, Any], float]:
        return self._native_kwargs(candidate, stream, messages_body=body, client_headers=headers, messages_path=path)

    async def messages(
        self, target: ResolvedModel, body: JSONObject, headers: dict[str, str], path: str = "/messages"
    ) -> JSONObject:
        """A non-streamed Messages answer (or count_tokens' with ``path``) of an Anthropic deployment."""
        return await self._native_json(
            target, MESSAGES_CALL, anthropic.read_json, lambda c: self._messages_kwargs(c, body, headers, False, path)
        )

    async def open_messages_stream(
        self, target: ResolvedModel, body: JSONObject, headers: dict[str, str]
    ) -> MessagesStream:
        """A streamed Messages answer of an Anthropic deployment, its status checked (early failures raise)."""

        async def opened(candidate: ResolvedModel, response: Any, kwargs: dict[str, Any], timeout: float) -> Any:
            return MessagesStream(response, describe_upstream(candidate), timeout, call_credentials(kwargs))

        def build(candidate: ResolvedModel) -> tuple[dict[str, Any], float]:
            return self._messages_kwargs(candidate, body, headers, True, "/messages")

        stream: MessagesStream = await self._call(target, build, MESSAGES_CALL, opened)
        return stream

    # OpenAI's Responses API (``proxy.upstream.responses``)

    def speaks_responses(self, target: ResolvedModel) -> bool:
        """Whether ``target``'s deployment is called with Responses requests natively (an OpenAI or Azure
        deployment spelt ``openai/responses/...`` or with ``model_info.mode: responses``)."""
        kwargs, _ = self.call_kwargs(target)
        return responses.is_responses(self._litellm, {**kwargs, "model_info": {"mode": target.mode}})

    def _responses_kwargs(
        self, candidate: ResolvedModel, body: JSONObject, headers: dict[str, str], stream: bool
    ) -> tuple[dict[str, Any], float]:
        return self._native_kwargs(candidate, stream, responses_body=body, client_headers=headers)

    async def responses(self, target: ResolvedModel, body: JSONObject, headers: dict[str, str]) -> JSONObject:
        """A non-streamed Responses answer of a deployment that speaks Responses."""
        return await self._native_json(
            target, RESPONSES_CALL, responses.read_json, lambda c: self._responses_kwargs(c, body, headers, False)
        )

    async def open_responses_stream(
        self, target: ResolvedModel, body: JSONObject, headers: dict[str, str]
    ) -> ResponsesStream:
        """A streamed Responses answer, its status checked (early failures raise; the door reads the first
        event). ``body`` should say ``"stream": true``: it is sent as given."""

        async def opened(candidate: ResolvedModel, response: Any, kwargs: dict[str, Any], timeout: float) -> Any:
            return ResponsesStream(response, describe_upstream(candidate), timeout, call_credentials(kwargs))

        def build(candidate: ResolvedModel) -> tuple[dict[str, Any], float]:
            return self._responses_kwargs(candidate, body, headers, True)

        stream: ResponsesStream = await self._call(target, build, RESPONSES_CALL, opened)
        return stream
