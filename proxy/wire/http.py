"""Small HTTP helpers shared by the routes: JSON bodies with a size cap, JSON and error responses."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from proxy.errors import InvalidRequestError, PayloadTooLargeError, ProxyError


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(error: ProxyError, headers: dict[str, str] | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if not error.retryable:
        headers["x-should-retry"] = "false"
    return JSONResponse(error.to_json(), status_code=error.status, headers=headers)


async def read_json_body(request: Request, limit: int) -> Any:
    """Read and parse the body, refusing more than ``limit`` bytes before buffering them."""
    declared = request.headers.get("content-length")
    too_large = PayloadTooLargeError(f"Request body is larger than the configured limit of {limit} bytes.")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        # The client hung up mid-upload (its own timeout): nobody reads the answer, and it is not a proxy bug.
        raise InvalidRequestError(
            "The client closed the connection before the request body was complete.",
            status=499,
            code="client_closed_request",
        ) from None
    raw = b"".join(chunks)
    if not raw.strip():
        raise InvalidRequestError("The request body is empty; expected a JSON object.", code="invalid_body")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(
            f"We could not parse the JSON body of your request ({exc.msg} at position {exc.pos}).",
            code="invalid_json",
        ) from None
