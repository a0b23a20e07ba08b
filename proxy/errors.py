"""The proxy's exception hierarchy.

Every error a client can see is a ``ProxyError``; the wire layer turns it into OpenAI's error JSON
(``{"error": {"message", "type", "param", "code"}}``) with ``status`` as the HTTP status. Lower-layer
errors are translated into these at exactly one boundary each, so nothing else in the code base needs to
know their types: LiteLLM's in ``proxy.upstream.errors``, the engine's and the store's (``EngineError``,
which knows nothing of HTTP) in ``proxy.wire.http.to_proxy_error``, YAML's in ``proxy.config.settings``.

    ProxyError                       any error reported to a client
    ├── InternalError                500: a bug in the proxy; never retried by SDKs
    ├── InvalidRequestError          400: the request is malformed; ``param`` names the culprit
    │   └── ContextLengthExceeded    400: the newest user message and what follows do not fit the model
    ├── AuthenticationError          401: missing or unknown proxy API key
    ├── PermissionDeniedError        403: a valid key asking for what it may not (another tenant's data); a
    │                                     Host or a cross-site Origin the proxy does not serve (``proxy.wire.guard``)
    ├── NotFoundError                404: unknown model, conversation, summary or file
    ├── RequestTimeoutError          408: the body did not arrive within ``general_settings.body_read_timeout``
    ├── PayloadTooLargeError         413: body over ``general_settings.max_body_bytes``
    ├── UnsupportedMediaTypeError    415: a body that is not JSON on a JSON endpoint (``proxy.wire.guard``)
    ├── ConversationBusyError        409: concurrent requests kept changing the conversation; retry
    ├── StoreBusyError               503: the database stayed locked by another process; retry
    ├── ShuttingDownError            503: the server stopped before the request's answer began; retry
    └── UpstreamError                the provider failed: its status and its message
        ├── UpstreamConnectionError  502: the provider could not be reached
        ├── UpstreamTimeoutError     504: the provider did not answer in time
        └── UpstreamContextLengthError  the provider refused the prompt as longer than its window

    ConfigError                      the YAML configuration is invalid (never sent over HTTP)
"""

from __future__ import annotations

from typing import Any

# Statuses for which retrying the same request cannot succeed. Responses with these carry
# ``x-should-retry: false`` so that OpenAI SDKs do not resend them behind the user's back.
NON_RETRYABLE_STATUSES = frozenset({400, 401, 403, 404, 405, 413, 415, 422, 501})


class ProxyError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type

    @property
    def retryable(self) -> bool:
        return self.status not in NON_RETRYABLE_STATUSES

    def to_json(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InternalError(ProxyError):
    """A bug in the proxy. OpenAI SDKs would send the same request three times; ``retryable`` stops that."""

    status = 500

    @property
    def retryable(self) -> bool:
        return False


class InvalidRequestError(ProxyError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequestError):
    code = "context_length_exceeded"


class AuthenticationError(ProxyError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDeniedError(ProxyError):
    """The key is valid but may not do this (OpenAI's 403 ``permission_error``)."""

    status = 403
    type = "permission_error"
    code = "permission_denied"


class NotFoundError(ProxyError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class PayloadTooLargeError(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"
    # Refused before or part way through the body: the rest of it may still be on its way (RequestTimeoutError).
    close_connection = True


class RequestTimeoutError(ProxyError):
    """The request body did not arrive in full in time. Retryable: a client on a briefly slow link may try again."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"
    # The rest of the body may still be on its way: the answer closes the connection, or a client that goes on
    # trickling would keep it (every byte it sends resets the server's keep-alive timer).
    close_connection = True


class UnsupportedMediaTypeError(ProxyError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class ConversationBusyError(ProxyError):
    """Other requests kept extending the same conversation while this one was being stored. Nothing was
    written for it; the SDKs retry a 409 on their own."""

    status = 409
    type = "conflict_error"
    code = "conversation_busy"


class ShuttingDownError(ProxyError):
    """The server stopped while the request was still being prepared (e.g. waiting for an inline compaction)
    and nothing had been sent: the SDKs retry a 503, against another replica or once the proxy is back."""

    status = 503
    type = "server_error"
    code = "shutting_down"


class StoreBusyError(ProxyError):
    """The database stayed locked by another process (another worker, the operator's CLI) for longer than the
    store waits. Nothing was written for the request; retrying shortly succeeds once the lock is released."""

    status = 503
    type = "server_error"
    code = "store_busy"
    retry_after = 1  # seconds: the Retry-After header of the response


class UpstreamError(ProxyError):
    status = 502
    type = "upstream_error"
    deployment: Any = None  # the deployment (``ResolvedModel``) that answered with this error, set by Upstream._call


class UpstreamConnectionError(UpstreamError):
    status = 502
    code = "upstream_unreachable"


class UpstreamTimeoutError(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamContextLengthError(UpstreamError):
    """The provider's own "prompt too long" refusal, with its status, type and code kept as it sent them."""

    status = 400


class ConfigError(Exception):
    """The configuration file is invalid. ``problems`` holds one line per error, each naming a key path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))

    def __str__(self) -> str:
        lines = "\n".join(f"  - {p}" for p in self.problems)
        return f"invalid configuration in {self.source}:\n{lines}"
