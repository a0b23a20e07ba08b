"""CORS for browser clients, off unless ``general_settings.cors_allow_origins`` lists origins.

Starlette's ``CORSMiddleware`` does the protocol, with two changes:

* A request from an origin that is not listed gets no CORS header at all (Starlette would still add its
  ``Access-Control-Expose-Headers`` and answer a preflight 400 with its allow lists): it is served exactly
  as if CORS were off, and the browser refuses it.
* Request headers are allowed by name or by prefix, because OpenAI's SDKs send a family of them
  (``x-stainless-os``, ``x-stainless-retry-count``, ``openai-organization``...) that grows with each release.
  Exposed response headers are the ``x-lcm-*`` ones each response carries, plus the retry hints SDKs read.
"""

from __future__ import annotations

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ALLOWED_HEADERS = ("authorization", "content-type", "x-api-key", "x-lcm-conversation-id", "x-lcm-user")
ALLOWED_PREFIXES = ("openai-", "x-stainless-")
EXPOSED_PREFIXES = ("x-lcm-",)
EXPOSED_HEADERS = ("x-should-retry", "retry-after")
METHODS = ("GET", "POST", "DELETE")


def allowed_header(name: str) -> bool:
    name = name.strip().lower()
    return name in ALLOWED_HEADERS or name.startswith(ALLOWED_PREFIXES)


class ProxyCORS(CORSMiddleware):
    def __init__(self, app: ASGIApp, allow_origins: list[str]) -> None:
        super().__init__(app, allow_origins=allow_origins, allow_methods=METHODS, allow_headers=ALLOWED_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = Headers(scope=scope).get("origin")
            if origin is None or not self.is_allowed_origin(origin):
                await self.app(scope, receive, send)  # not a cross-origin call we serve: no CORS headers
                return
        await super().__call__(scope, receive, send)

    def preflight_response(self, request_headers: Headers) -> Response:
        requested = [h.strip().lower() for h in request_headers.get("access-control-request-headers", "").split(",")]
        requested = [h for h in requested if h]
        if not requested or not all(allowed_header(h) for h in requested):
            return super().preflight_response(request_headers)  # Starlette names what it refuses
        # Every requested header is allowed: check the rest without them, then allow exactly those.
        rest = Headers(raw=[(k, v) for k, v in request_headers.raw if k != b"access-control-request-headers"])
        response = super().preflight_response(rest)
        if response.status_code == 200:
            response.headers["access-control-allow-headers"] = ", ".join(dict.fromkeys([*ALLOWED_HEADERS, *requested]))
        return response

    async def send(self, message: Message, send: Send, request_headers: Headers) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            exposed = [k for k in headers if k.startswith(EXPOSED_PREFIXES) or k in EXPOSED_HEADERS]
            if exposed:
                headers["access-control-expose-headers"] = ", ".join(dict.fromkeys(exposed))
        await super().send(message, send, request_headers)


def cors_middleware(origins: list[str]) -> list[Middleware]:
    """The middleware to install: none when no origin is configured."""
    return [Middleware(ProxyCORS, allow_origins=list(origins))] if origins else []
