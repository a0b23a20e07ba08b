"""Anthropic's Messages API spoken to an OpenAI-compatible upstream: a Claude Code client (``/v1/messages``)
served by llama.cpp, vLLM or OpenRouter (``/v1/chat/completions``). Pure functions over JSON dicts; nothing
here does I/O, and the input is never mutated (every structure sent on is built anew).

What maps to what, request side (``messages_to_chat``):

* ``system`` (a string or text blocks, joined by a blank line) -> a leading ``system`` message; a ``system``
  message inside ``messages`` (Claude Code sends some mid-conversation) -> a ``system`` message in its place.
* User blocks: ``text`` -> a text part, ``image`` -> an ``image_url`` part (a ``data:`` URL for base64),
  a text ``document`` -> a text part headed by its title, any other ``document`` (a PDF) -> a ``file`` part.
  One lone text part becomes a plain string (llama.cpp prefers them).
* ``tool_result`` blocks -> ``tool`` messages, placed *before* the rest of their user message: OpenAI wants
  the results right after the assistant's ``tool_calls``. ``is_error`` prefixes ``Error: ``.
* Assistant blocks: ``text`` -> ``content`` (concatenated, so a history this module streamed reproduces the
  upstream's own text, byte for byte, for its prompt cache), ``tool_use`` -> ``tool_calls``; thinking and
  server-tool blocks are dropped.
* ``tools`` -> functions (Anthropic's server tools, any ``type`` but ``custom``, are dropped);
  ``tool_choice`` auto/any/tool/none -> "auto"/"required"/a function/"none";
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``; ``stop_sequences`` -> ``stop``;
  ``stream`` asks for usage in the stream. ``cache_control``, ``metadata`` (user ids stay here), ``top_k``,
  ``thinking`` and every other Anthropic-only field are dropped.

Answer side: ``chat_to_messages`` maps a whole answer, ``ChatToMessagesStream`` a stream chunk by chunk into
the SSE event sequence Claude Code consumes (``message_start``; per block ``content_block_start``, deltas,
``content_block_stop``, one block open at a time, indexes from 0; ``message_delta``; ``message_stop``).
``reasoning_content`` is dropped: a thinking block would need a signature no upstream here can give.
``finish_reason`` stop/length/tool_calls/content_filter -> ``stop_reason`` end_turn/max_tokens/tool_use/refusal,
and any tool call makes it ``tool_use``. Usage: cached prompt tokens are ``cache_read_input_tokens``, the
rest ``input_tokens``, and the ``cache_creation`` detail is always present (Claude Code breaks without it).
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import orjson

from proxy.types import ChatBody, JSONObject, Message, Messages
from proxy.upstream.sse_events import sse_bytes as sse_bytes  # the Messages door's name for it

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "content_filter": "refusal", "tool_calls": "tool_use"}
STOP_REASONS["function_call"] = "tool_use"  # OpenAI's legacy name
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
KEPT_PARAMS = ("max_tokens", "temperature", "top_p")
DELTA_USAGE = ("output_tokens", "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def anthropic_error(status: int, message: str) -> JSONObject:
    """Anthropic's error body for an HTTP status: 5xx is ``api_error`` (only 529 is ``overloaded_error``), an
    unlisted 4xx ``invalid_request_error``."""
    kind = ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _obj(value: Any) -> JSONObject:
    return value if isinstance(value, dict) else {}


def _first(choices: Any) -> JSONObject:
    """The first choice of an answer or chunk ({} when there is none): the only one a Messages client sees."""
    return _obj(choices[0]) if isinstance(choices, list) and choices else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_to_anthropic(usage: dict[str, Any] | None) -> JSONObject:
    """Chat usage as Anthropic usage: cached prompt tokens are read from cache, the others are input."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return {
        "input_tokens": max(0, _int(usage.get("prompt_tokens")) - cached),
        "output_tokens": _int(usage.get("completion_tokens")),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
    }


def stop_reason(finish_reason: Any, used_tools: bool) -> str:
    """Anthropic's ``stop_reason`` for a Chat ``finish_reason``; any tool call makes it ``tool_use``."""
    if used_tools:
        return "tool_use"
    return STOP_REASONS.get(finish_reason, "end_turn") if isinstance(finish_reason, str) else "end_turn"


# --- Request: Messages -> Chat Completions ---


def _blocks(content: Any) -> list[JSONObject]:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [block for block in content if isinstance(block, dict)] if isinstance(content, list) else []


def _texts(content: Any) -> list[str]:
    return [b["text"] for b in _blocks(content) if b.get("type") == "text" and isinstance(b.get("text"), str)]


def _data_url(source: JSONObject, default_type: str) -> str:
    return f"data:{source.get('media_type') or default_type};base64,{source.get('data', '')}"


def _user_part(block: JSONObject) -> JSONObject | None:
    """One user block as a Chat content part, or None when it has none."""
    kind = block.get("type")
    source = _obj(block.get("source"))
    if kind == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
    if kind == "image":
        if source.get("type") == "url":
            return {"type": "image_url", "image_url": {"url": str(source.get("url", ""))}}
        if source.get("type") == "base64":
            return {"type": "image_url", "image_url": {"url": _data_url(source, "image/png")}}
    if kind == "document":
        title = block.get("title")
        if source.get("type") == "text":
            return {"type": "text", "text": f"{title or 'document'}:\n{source.get('data', '')}"}
        if source.get("type") == "base64":
            file = {"filename": title or "document.pdf", "file_data": _data_url(source, "application/pdf")}
            return {"type": "file", "file": file}
    return None


def _result_text(block: JSONObject) -> str:
    """A ``tool_result``'s content as the text of a ``tool`` message."""
    content = block.get("content")
    if isinstance(content, str):
        text = content
    else:
        pieces: list[str] = []
        for item in _blocks(content):
            if item.get("type") == "text":
                pieces.append(str(item.get("text", "")))
            elif item.get("type") in ("image", "document"):
                pieces.append(f"[{item['type']}]")
        text = "\n".join(pieces)
    if block.get("is_error") and not text.startswith("Error: "):
        text = "Error: " + text
    return text


def _user_messages(content: Any) -> Messages:
    """A user message as its ``tool`` messages (one per ``tool_result``) then the user message of the rest."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: Messages = []
    parts: list[JSONObject] = []
    for block in _blocks(content):
        if block.get("type") == "tool_result":
            call_id = str(block.get("tool_use_id", ""))
            out.append({"role": "tool", "tool_call_id": call_id, "content": _result_text(block)})
        elif (part := _user_part(block)) is not None:
            parts.append(part)
    if len(parts) == 1 and parts[0]["type"] == "text":
        out.append({"role": "user", "content": parts[0]["text"]})
    elif parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant_message(content: Any) -> Message:
    text = "".join(_texts(content))
    calls = [
        {
            "id": str(block.get("id", "")),
            "type": "function",
            "function": {
                "name": str(block.get("name", "")),
                "arguments": orjson.dumps(_obj(block.get("input"))).decode(),
            },
        }
        for block in _blocks(content)
        if block.get("type") == "tool_use"
    ]
    message: Message = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any) -> list[JSONObject]:
    """Client tools as functions; Anthropic's server tools (a ``type`` other than ``custom``) are dropped."""
    out: list[JSONObject] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict) or tool.get("type", "custom") not in ("custom", None):
            continue
        function: JSONObject = {"name": tool.get("name", "")}
        if tool.get("description"):
            function["description"] = tool["description"]
        schema = tool.get("input_schema")
        function["parameters"] = copy.deepcopy(schema) if isinstance(schema, dict) else {"type": "object"}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: JSONObject) -> Any:
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    return TOOL_CHOICES.get(kind) if isinstance(kind, str) else None


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request body -> an OpenAI Chat Completions body (same model string)."""
    messages: Messages = []
    system = body.get("system")
    if system_text := "\n\n".join(_texts(system)):
        messages.append({"role": "system", "content": system_text})
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        if role == "assistant":
            messages.append(_assistant_message(content))
        elif role == "system":
            messages.append({"role": "system", "content": "\n\n".join(_texts(content))})
        else:
            messages.extend(_user_messages(content))
    chat: ChatBody = {"model": body.get("model"), "messages": messages}
    chat.update({key: body[key] for key in KEPT_PARAMS if body.get(key) is not None})
    stops = body.get("stop_sequences")
    if isinstance(stops, list) and stops:
        chat["stop"] = list(stops)
    if tools := _tools(body.get("tools")):
        chat["tools"] = tools
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            if (mapped := _tool_choice(choice)) is not None:
                chat["tool_choice"] = mapped
            if choice.get("disable_parallel_tool_use") is True:
                chat["parallel_tool_calls"] = False
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# --- Answer: Chat Completions -> Messages ---


def _message_id(chat_id: Any) -> str:
    if isinstance(chat_id, str) and chat_id:
        return chat_id if chat_id.startswith("msg_") else "msg_" + chat_id
    return "msg_" + uuid.uuid4().hex


def _message(
    message_id: str, model: str, content: list[JSONObject], reason: str | None, usage: JSONObject
) -> JSONObject:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": None,
        "usage": usage,
    }


def _tool_input(arguments: Any) -> JSONObject:
    """A tool call's arguments as ``tool_use.input``: {} when empty, the raw text kept when not a JSON object."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"_raw_arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"_raw_arguments": arguments}


def chat_to_messages(result: dict[str, Any], model: str) -> dict[str, Any]:
    """A Chat Completions answer (non-streamed) -> an Anthropic Messages answer."""
    choice = _first(result.get("choices"))
    message = _obj(choice.get("message"))
    content: list[JSONObject] = []
    if text := "".join(_texts(message.get("content"))):
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        function = _obj(call.get("function"))
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or "toolu_" + uuid.uuid4().hex),
                "name": str(function.get("name") or ""),
                "input": _tool_input(function.get("arguments")),
            }
        )
    reason = stop_reason(choice.get("finish_reason"), any(block["type"] == "tool_use" for block in content))
    usage = usage_to_anthropic(result.get("usage"))
    return _message(_message_id(result.get("id")), model, content or [{"type": "text", "text": ""}], reason, usage)


class ChatToMessagesStream:
    """One streamed Chat answer as Anthropic SSE events: ``feed`` each chunk, then ``finish`` once."""

    def __init__(self, model: str, message_id: str | None = None, input_tokens: int = 0) -> None:
        self.model = model
        self.message_id = message_id
        self.input_tokens = input_tokens
        self.started = False
        self.finished = False
        self.blocks = 0  # blocks started so far: the next block's index
        self.open: str | None = None  # "text" or "tool_use": the kind of the open block, at index blocks - 1
        self.open_call: Any = None  # the Chat index of the tool call whose block is open
        self.call_ids: dict[Any, str] = {}  # Chat index -> the id of the last call started at that index
        self.used_tools = False
        self.usage: JSONObject | None = None
        self.finish_reason: Any = None

    def _start(self, chat_id: Any = None) -> list[JSONObject]:
        if self.started:
            return []
        self.started = True
        usage = usage_to_anthropic(None)
        usage["input_tokens"] = self.input_tokens
        message = _message(self.message_id or _message_id(chat_id), self.model, [], None, usage)
        return [{"type": "message_start", "message": message}]

    def _close(self) -> list[JSONObject]:
        if self.open is None:
            return []
        self.open, self.open_call = None, None
        return [{"type": "content_block_stop", "index": self.blocks - 1}]

    def _open(self, kind: str, block: JSONObject) -> list[JSONObject]:
        events = self._close()
        events.append({"type": "content_block_start", "index": self.blocks, "content_block": block})
        self.blocks += 1
        self.open = kind
        return events

    def _delta(self, delta: JSONObject) -> JSONObject:
        return {"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}

    def _tool_call(self, position: int, call: JSONObject) -> list[JSONObject]:
        events: list[JSONObject] = []
        index = call.get("index", position)
        function = _obj(call.get("function"))
        call_id = call.get("id")
        # A new index is a new call; so is a new id at a known index (some providers number every call 0).
        if index not in self.call_ids or (isinstance(call_id, str) and call_id and call_id != self.call_ids[index]):
            self.call_ids[index] = call_id = str(call_id or "toolu_" + uuid.uuid4().hex)
            self.used_tools = True
            block = {"type": "tool_use", "id": call_id, "name": str(function.get("name") or ""), "input": {}}
            events += self._open("tool_use", block)
            self.open_call = index
        elif not (self.open == "tool_use" and self.open_call == index):
            return []  # more of a call whose block is already closed: nowhere to put it
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """One Chat chunk -> zero or more Anthropic events."""
        if self.finished:
            return []
        events = self._start(chunk.get("id"))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choice = _first(chunk.get("choices"))
        delta = _obj(choice.get("delta"))
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self.open != "text":
                events += self._open("text", {"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": text}))
        calls = delta.get("tool_calls")
        for position, call in enumerate(calls if isinstance(calls, list) else []):
            if isinstance(call, dict):
                events += self._tool_call(position, call)
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        return events

    def finish(self) -> list[dict[str, Any]]:
        """The closing events: the open block's stop, ``message_delta``, ``message_stop``. Idempotent."""
        if self.finished:
            return []
        events = self._start()
        self.finished = True
        events += self._close()
        usage = usage_to_anthropic(self.usage)
        if self.usage is None:
            usage["input_tokens"] = self.input_tokens
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(self.finish_reason, self.used_tools), "stop_sequence": None},
                "usage": {key: usage[key] for key in DELTA_USAGE},
            }
        )
        events.append({"type": "message_stop"})
        return events
