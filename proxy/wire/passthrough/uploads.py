"""Multipart uploads passed through: audio transcription and translation, image edits
(``proxy.wire.passthrough.routes`` has the JSON endpoints and the routes, ``proxy.wire.passthrough.shapes`` the
checks).

The body is read within ``general_settings.max_body_bytes`` as it arrives (a larger declared length is
refused before reading), and Starlette's parser caps the number of files and fields and each field's size.
Files are read into memory for the call and the parser's spooled copies closed before the upstream is
called; nothing is stored or logged. Form fields arrive as strings and are forwarded as strings; a repeated
``name[]`` field becomes the list of its values (sent on as ``name[]`` again).
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from proxy.errors import InvalidRequestError
from proxy.wire.http import JSONResponse, bounded_receive, too_large
from proxy.wire.passthrough.shapes import Endpoint, invalid, kind, route, state_of, text, unreadable, wire_json

MAX_FIELDS = 100
MAX_FIELD_BYTES = 1 << 20  # one non-file field (a prompt); files are bounded by max_body_bytes only
MAX_IMAGES = 16  # OpenAI's limit for one edit; a mask comes on top

Upload = tuple[str, bytes, str]  # (filename, content, content type), as LiteLLM and the OpenAI SDK take a file


async def _value(value: str | UploadFile) -> str | Upload:
    if isinstance(value, str):
        return value
    return (value.filename or "upload", await value.read(), value.content_type or "application/octet-stream")


async def read_form(request: Request, limit: int, timeout: float, max_files: int) -> dict[str, Any]:
    """The multipart body's fields: strings, uploads, and lists of either for ``name[]`` fields. The body is
    refused past ``limit`` bytes (413) or ``timeout`` seconds (408), from inside the parser's reads."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise InvalidRequestError(
            "The request body must be multipart/form-data on this endpoint.", code="invalid_content_type"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    capped = Request(request.scope, bounded_receive(request.receive, limit, timeout))
    fields: dict[str, Any] = {}
    try:
        async with capped.form(max_files=max_files, max_fields=MAX_FIELDS, max_part_size=MAX_FIELD_BYTES) as form:
            for key in form:
                values = [await _value(v) for v in form.getlist(key)]
                if key.endswith("[]"):
                    fields[key[:-2]] = [*fields.get(key[:-2], []), *values]
                else:
                    fields[key] = values[-1]
    except HTTPException as exc:  # Starlette's answer to a malformed body, or one over the parser's caps
        raise InvalidRequestError(f"The multipart body could not be read: {exc.detail}", code="invalid_body") from None
    except ClientDisconnect:
        raise InvalidRequestError(
            "The client closed the connection before the request body was complete.",
            status=499,
            code="client_closed_request",
        ) from None
    return fields


FILE_FIELDS = ("file", "image", "mask")


def no_other_files(arguments: dict[str, Any]) -> None:
    """Uploads go in the fields that take them; LiteLLM would send one anywhere else as garbled text."""
    fields = {**(arguments.get("extra_body") or {}), **{k: v for k, v in arguments.items() if k != "extra_body"}}
    for key, value in fields.items():
        if key in FILE_FIELDS:
            continue
        if isinstance(value, tuple) or (isinstance(value, list) and any(isinstance(v, tuple) for v in value)):
            raise invalid(key, "this field takes no file here.")


def upload(value: Any, param: str) -> None:
    if not isinstance(value, tuple):
        got = "a text field" if isinstance(value, str) else kind(value)
        raise invalid(param, f"expected an uploaded file, got {got}.")


def uploads(value: Any, param: str) -> None:
    """One uploaded image, or several (``image[]``)."""
    for item in value if isinstance(value, list) else [value]:
        upload(item, param)


TRANSCRIPTIONS = Endpoint(
    "atranscription",
    {"file": upload},
    frozenset({"language", "prompt", "response_format", "temperature", "timestamp_granularities"}),
)
TRANSLATIONS = Endpoint("atranslation", {"file": upload}, frozenset({"prompt", "response_format", "temperature"}))
IMAGE_EDITS = Endpoint(
    "aimage_edit",
    {"image": uploads, "prompt": text},
    frozenset({
        "mask", "n", "size", "quality", "response_format", "user", "background", "input_fidelity",
        "output_compression", "output_format",
    }),
)  # fmt: skip
PLAIN_FORMATS = ("text", "srt", "vtt")  # transcriptions answered as text/plain, as OpenAI answers them


async def transcriptions(request: Request) -> Response:
    return await _audio_text(request, TRANSCRIPTIONS)


async def translations(request: Request) -> Response:
    """LiteLLM has no audio translation call: the upstream makes it with the OpenAI SDK, for OpenAI-compatible
    deployments (``proxy.upstream.openai``; others answer 501)."""
    return await _audio_text(request, TRANSLATIONS)


async def _audio_text(request: Request, endpoint: Endpoint) -> Response:
    state = state_of(request)
    state.auth.tenant_for(request)  # before reading the upload
    settings = state.config.general_settings
    fields = await read_form(request, settings.max_body_bytes, settings.body_read_timeout, max_files=1)
    target = route(state, fields)
    # OpenAI's default, said out loud: LiteLLM would ask for verbose_json (for its cost tracking), which
    # changes the answer and which gpt-4o-transcribe refuses.
    fields.setdefault("response_format", "json")
    arguments = endpoint.arguments(fields)
    no_other_files(arguments)
    result = await state.upstream.call(endpoint.function, target, arguments)
    if fields["response_format"] in PLAIN_FORMATS:
        transcript = result if isinstance(result, str) else getattr(result, "text", None)
        if not isinstance(transcript, str):
            raise unreadable(target, "no transcript")
        return Response(transcript, media_type="text/plain")
    return JSONResponse(wire_json(result, target))


async def image_edits(request: Request) -> Response:
    state = state_of(request)
    state.auth.tenant_for(request)
    settings = state.config.general_settings
    fields = await read_form(request, settings.max_body_bytes, settings.body_read_timeout, max_files=MAX_IMAGES + 1)
    target = route(state, fields)
    arguments = IMAGE_EDITS.arguments(fields)
    no_other_files(arguments)
    if "mask" in arguments:
        upload(arguments["mask"], "mask")
    # LiteLLM's image edit takes the files' bytes (it names them and reads their type from the bytes).
    images = arguments["image"] if isinstance(arguments["image"], list) else [arguments["image"]]
    arguments["image"] = [image[1] for image in images] if len(images) > 1 else images[0][1]
    if "mask" in arguments:
        arguments["mask"] = arguments["mask"][1]
    result = await state.upstream.call(IMAGE_EDITS.function, target, arguments)
    return JSONResponse(wire_json(result, target))
