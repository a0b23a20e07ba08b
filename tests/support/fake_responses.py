"""A fake of OpenAI's Responses API: a real Starlette app, served on loopback by the tests.

It answers ``POST /v1/responses``, streamed or not, in OpenAI's shapes, from a script of ``RReply`` objects
(first in, first out), else ``responder(body)``, else an echo of the last user text. A reply may hold a
reasoning item (first), text (one assistant message) and function calls. Streams carry the event sequence
Codex and the SDK read (``response.created``, ``response.in_progress``; per item ``response.output_item.added``,
the content part and text deltas or the argument deltas, ``response.output_item.done``; ``response.completed``
with usage), every event with a ``sequence_number`` from 0. Every request is recorded as it arrived.

It is as strict as the real API where a gateway in front of it can break things; each of these is a 400
``{"error": {"message", "type": "invalid_request_error", "param", "code"}}`` worded like the API's:

- a ``reasoning`` item whose ``encrypted_content`` the fake did not issue: it issues (only when ``include``
  asks for ``reasoning.encrypted_content``, as the API does) an HMAC, with a fixed secret, over the item's id
  and summary, so a changed summary, a moved id or a made-up blob fails (``invalid_encrypted_content``); a
  reasoning item with no encrypted content is "not found" (nothing is stored: ``store`` does not matter here);
- any ``compaction`` item or ``compaction_trigger`` item at all: the fake never issued one, so a proxy that
  forwards its own compaction handles (or Codex's, from another upstream) fails like OpenAI's "The encrypted
  content ... could not be verified.";
- a ``function_call_output`` (or ``custom_tool_call_output``) whose ``call_id`` matches no earlier call;
- a ``previous_response_id`` at all (the proxy must never forward one; the fake stores nothing); an
  ``item_reference`` (nothing stored to refer to); a message role or item type the API does not know;
- no ``model`` or no ``input``; an input over ``window`` tokens (a quarter of the characters of the canonical
  JSON of ``instructions``, ``input`` and ``tools``): ``context_length_exceeded``, as Codex recognises it.

A function call replayed without the reasoning item that preceded it in the fake's own answer is accepted (the
real API accepts it too, at some cost to the model). Requests without ``Authorization: Bearer`` get a 401.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import itertools
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.fakes import Recorded

_SECRET = b"lcm-proxy fake openai responses signing key"
ITEM_TYPES = frozenset({"message", "reasoning", "function_call", "function_call_output", "custom_tool_call",
                        "custom_tool_call_output"})  # fmt: skip
CALLS = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}
ROLES = ("assistant", "system", "developer", "user")
CONTEXT_MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."


@dataclass
class RReply:
    text: str = ""
    function_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments", "call_id"?}
    reasoning: str | None = None  # a reasoning item first, with this summary text
    status: int = 200
    error_code: str | None = None
    error_message: str = ""
    error_type: str = "invalid_request_error"  # a 5xx: "server_error"
    usage: dict[str, Any] | None = None  # overrides of the computed usage fields
    delay: float = 0.0  # seconds before answering (headers included)
    error_mid_stream: bool = False  # streaming: created, in_progress, then ``response.failed`` with this error
    headers: dict[str, str] | None = None  # extra response headers (``retry-after``...)


class Invalid(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def count_tokens(body: dict[str, Any]) -> int:
    whole = {k: body.get(k) for k in ("instructions", "input", "tools")}
    return max(1, len(canon(whole)) // 4)


def sign_reasoning(item_id: str, summary: Any) -> str:
    """The encrypted content the fake issues for a reasoning item: bound to its id and summary."""
    mac = hmac.digest(_SECRET, canon({"id": item_id, "summary": summary}).encode(), "sha256")
    return "gAAAA" + base64.urlsafe_b64encode(mac).decode()


def error_body(message: str, param: str | None = None, code: str | None = None,
               kind: str = "invalid_request_error") -> dict[str, Any]:  # fmt: skip
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict) and "text" in p)


def last_user_text(body: dict[str, Any]) -> str:
    given = body.get("input")
    if isinstance(given, str):
        return given
    for item in reversed(given if isinstance(given, list) else []):
        if isinstance(item, dict) and item.get("type", "message") == "message" and item.get("role") == "user":
            return _text(item.get("content"))
    return ""


def _pieces(text: str) -> list[str]:
    """A text as it streams: word by word, each word but the first with its leading space."""
    return [w if j == 0 else " " + w for j, w in enumerate(text.split(" ") if text else [])]


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


class FakeResponses:
    def __init__(self, window: int | None = None) -> None:
        self.requests: list[Recorded] = []
        self.script: deque[RReply] = deque()
        # Called with the request body when the script is empty; returns the reply (e.g. a scripted model).
        self.responder: Callable[[dict[str, Any]], RReply] | None = None
        self.window = window  # a counted input over this many tokens is refused as too long
        self._ids = itertools.count(1)
        self.app = Starlette(routes=[Route("/v1/responses", self.responses, methods=["POST"])])

    def enqueue(self, *replies: RReply) -> None:
        self.script.extend(replies)

    @property
    def last(self) -> Recorded:
        return self.requests[-1]

    def reset(self) -> None:
        self.requests.clear()
        self.script.clear()
        self.responder = None

    def _id(self, prefix: str) -> str:
        return f"{prefix}_fake{next(self._ids):06d}"

    # --- receiving and validating ---------------------------------------------------------------------------

    async def _receive(self, request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        self.requests.append(
            Recorded(body=body if isinstance(body, dict) else {}, headers=dict(request.headers), path=path)
        )
        if not request.headers.get("authorization", "").lower().startswith("bearer "):
            raise Invalid("You didn't provide an API key. You need to provide your API key in an Authorization "
                          "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).", status=401)  # fmt: skip
        if not isinstance(body, dict):
            raise Invalid("We could not parse the JSON body of your request.")
        self.validate(body)
        return body

    def validate(self, body: dict[str, Any]) -> None:
        """Raise ``Invalid`` as the real API would answer 400 for this body."""
        for name in ("model", "input"):
            if body.get(name) is None:
                raise Invalid(f"Missing required parameter: '{name}'.", name, "missing_required_parameter")
        if body.get("previous_response_id") is not None:
            raise Invalid(f"Previous response with id '{body['previous_response_id']}' not found.",
                          "previous_response_id", "previous_response_not_found")  # fmt: skip
        items = body["input"] if isinstance(body["input"], list) else []
        if not isinstance(body["input"], str | list):
            raise Invalid("Invalid type for 'input': expected a string or an array.", "input", "invalid_type")
        calls: set[tuple[str, str]] = set()
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise Invalid(f"Invalid type for 'input[{i}]': expected an object.", f"input[{i}]", "invalid_type")
            kind = item.get("type", "message" if "role" in item else None)
            if kind in ("compaction", "compaction_trigger"):
                shown = str(item.get("encrypted_content") or kind)[:24]
                raise Invalid(f"The encrypted content {shown}... could not be verified. Reason: Encrypted content "
                              "could not be decrypted or parsed.", None, "invalid_encrypted_content")  # fmt: skip
            if kind == "item_reference":
                raise Invalid(f"Item with id '{item.get('id')}' not found.", f"input[{i}]", "item_not_found")
            if kind not in ITEM_TYPES:
                raise Invalid(f"Invalid value: '{kind}'.", f"input[{i}].type", "invalid_value")
            if kind == "message" and item.get("role") not in ROLES:
                raise Invalid(f"Invalid value: '{item.get('role')}'. Supported values are: 'assistant', 'system', "
                              "'developer', and 'user'.", f"input[{i}].role", "invalid_value")  # fmt: skip
            if kind == "reasoning":
                self._check_reasoning(item, i)
            if kind in ("function_call", "custom_tool_call"):
                calls.add((kind, str(item.get("call_id"))))
            if kind in CALLS and (CALLS[kind], str(item.get("call_id"))) not in calls:
                raise Invalid(f"No tool call found for {kind.replace('_', ' ')} with call_id {item.get('call_id')}.",
                              "input")  # fmt: skip
        if self.window is not None and count_tokens(body) > self.window:
            raise Invalid(CONTEXT_MESSAGE, "input", "context_length_exceeded")

    @staticmethod
    def _check_reasoning(item: dict[str, Any], i: int) -> None:
        content = item.get("encrypted_content")
        if not isinstance(content, str):
            raise Invalid(f"Item with id '{item.get('id')}' not found. Items are not persisted when `store` is set "
                          "to false. Try again with `store` set to true, or remove this item from your input.",
                          f"input[{i}]", "item_not_found")  # fmt: skip
        expected = sign_reasoning(str(item.get("id")), item.get("summary"))
        if not hmac.compare_digest(content, expected):
            raise Invalid(f"The encrypted content for item {item.get('id')} could not be verified. Reason: "
                          "Encrypted content could not be decrypted or parsed.", None,
                          "invalid_encrypted_content")  # fmt: skip

    # --- answering ------------------------------------------------------------------------------------------

    def _reply_for(self, body: dict[str, Any]) -> RReply:
        if self.script:
            return self.script.popleft()
        if self.responder is not None:
            return self.responder(body)
        return RReply(text=f"echo: {last_user_text(body)[-200:]}")

    def _output(self, body: dict[str, Any], reply: RReply) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = []
        if reply.reasoning is not None:
            item_id = self._id("rs")
            summary = [{"type": "summary_text", "text": reply.reasoning}]
            reasoning: dict[str, Any] = {"type": "reasoning", "id": item_id, "summary": summary}
            if "reasoning.encrypted_content" in (body.get("include") or []):
                reasoning["encrypted_content"] = sign_reasoning(item_id, summary)
            output.append(reasoning)
        if reply.text:
            text = {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}
            output.append({"type": "message", "id": self._id("msg"), "status": "completed", "role": "assistant",
                           "content": [text]})  # fmt: skip
        for call in reply.function_calls:
            arguments = call.get("arguments", {})
            output.append({
                "type": "function_call", "id": self._id("fc"), "call_id": call.get("call_id") or self._id("call"),
                "name": call["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                "status": "completed",
            })  # fmt: skip
        return output

    def _response(self, body: dict[str, Any], reply: RReply, output: list[dict[str, Any]]) -> dict[str, Any]:
        said = canon(output)
        usage: dict[str, Any] = {
            "input_tokens": count_tokens(body),
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": max(1, len(said) // 4),
            "output_tokens_details": {"reasoning_tokens": len(reply.reasoning or "") // 4},
        }
        usage.update(reply.usage or {})
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        return {
            "id": self._id("resp"), "object": "response", "created_at": int(time.time()), "status": "completed",
            "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "model": body["model"], "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "previous_response_id": None,
            "reasoning": body.get("reasoning"), "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0), "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0), "truncation": "disabled", "usage": usage, "user": None,
            "metadata": body.get("metadata") or {},
        }  # fmt: skip

    async def responses(self, request: Request) -> Response:
        try:
            body = await self._receive(request)
        except Invalid as e:
            return JSONResponse(error_body(e.message, e.param, e.code), status_code=e.status)
        reply = self._reply_for(body)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200 and not (reply.error_mid_stream and body.get("stream")):
            error = error_body(reply.error_message, None, reply.error_code, reply.error_type)
            return JSONResponse(error, status_code=reply.status, headers=reply.headers)
        response = self._response(body, reply, self._output(body, reply))
        if not body.get("stream"):
            return JSONResponse(response, headers=reply.headers)
        return StreamingResponse(self._events(response, reply), media_type="text/event-stream", headers=reply.headers)

    @staticmethod
    async def _events(response: dict[str, Any], reply: RReply) -> AsyncIterator[str]:
        numbers = itertools.count()

        def event(kind: str, **fields: Any) -> str:
            return _sse({"type": kind, "sequence_number": next(numbers), **fields})

        start = {**response, "status": "in_progress", "output": [], "usage": None}
        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        if reply.error_mid_stream:
            error = {"code": reply.error_code or "server_error", "message": reply.error_message}
            yield event("response.failed", response={**start, "status": "failed", "error": error})
            return
        for index, item in enumerate(response["output"]):
            at = {"item_id": item["id"], "output_index": index}
            if item["type"] == "message":
                yield event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "content": []})  # fmt: skip
                part = item["content"][0]
                yield event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
                for piece in _pieces(part["text"]):
                    yield event("response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[])
                yield event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[])
                yield event("response.content_part.done", **at, content_index=0, part=part)
            elif item["type"] == "function_call":
                yield event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "arguments": ""})  # fmt: skip
                whole = item["arguments"]
                half = max(1, len(whole) // 2)
                for piece in (whole[:half], whole[half:]):
                    yield event("response.function_call_arguments.delta", **at, delta=piece)
                yield event("response.function_call_arguments.done", **at, name=item["name"], arguments=whole)
            else:
                added = {k: v for k, v in item.items() if k != "encrypted_content"}
                yield event("response.output_item.added", output_index=index, item={**added, "summary": []})
            yield event("response.output_item.done", output_index=index, item=item)
        yield event("response.completed", response=response)


RESPONSES_KEY = "sk-openai-upstream-secret-7"


def responses_models(responses_url: str, upstream_url: str, window: int = 200_000) -> list[dict[str, Any]]:
    """Two models for a proxy's config: ``gpt-5-codex`` served natively by a ``FakeResponses`` at
    ``responses_url``, ``local-codex`` by the fake OpenAI-compatible upstream at ``upstream_url`` (translated)."""
    return [
        {
            "model_name": "gpt-5-codex",
            "litellm_params": {
                "model": "openai/responses/gpt-5-codex",
                "api_base": f"{responses_url}/v1",
                "api_key": RESPONSES_KEY,
            },
            "model_info": {"max_input_tokens": window, "supports_function_calling": True},
        },
        {
            "model_name": "local-codex",
            "litellm_params": {"model": "openai/fake-model", "api_base": f"{upstream_url}/v1", "api_key": "sk-local"},
            "model_info": {"max_input_tokens": window, "supports_function_calling": True},
        },
    ]
