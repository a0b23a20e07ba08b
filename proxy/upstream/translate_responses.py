"""OpenAI's Responses API spoken to a deployment that only speaks Chat Completions: a Codex client
(``/v1/responses``) served by llama.cpp, vLLM, OpenRouter or any LiteLLM provider. Pure functions over JSON
dicts; nothing here does I/O, and the input is never mutated (every structure sent on is built anew). The
stream is translated by ``proxy.upstream.translate_responses_stream``.

What maps to what, request side (``responses_to_chat``):

* ``instructions`` -> a leading ``system`` message. ``input`` (a string is one user message) item by item:
  ``message`` -> a chat message (``developer`` becomes ``system``: every OpenAI-compatible server knows it);
  parts ``input_text``/``output_text``/``refusal`` -> text, ``input_image`` -> an ``image_url`` part (one given
  only by ``file_id`` -> a ``file`` part with that id), ``input_file`` -> a ``file`` part, ``input_audio`` ->
  ``input_audio``. System and assistant content become one string; a lone user text part a plain string.
* ``function_call`` -> an assistant ``tool_calls`` entry: consecutive calls, and the assistant message right
  before them, make ONE assistant message (chat wants the calls of a turn together, before their results).
  ``custom_tool_call`` -> a call of the function the custom tool became, arguments ``{"input": <input>}``.
  ``function_call_output`` / ``custom_tool_call_output`` -> ``tool`` messages (parts as text).
* ``reasoning`` items are dropped: chat has no place for them (and the upstream did not issue them).
* Anything chat cannot carry (``compaction``, ``item_reference``, built-in tools' calls, unknown items or parts,
  ``previous_response_id``) raises ``Untranslatable`` naming where (``input[3]``): the door's 400. Dropping it
  would silently lose history.
* ``tools``: ``function`` -> chat functions; ``custom`` (free-form input, like Codex's ``apply_patch``) -> a
  function with one string parameter ``input``; built-in tools (web_search, local_shell, ...) are dropped.
  ``tool_choice`` auto/none/required/a function -> the same in chat; ``max_output_tokens`` -> ``max_tokens``;
  ``text.format`` json_schema/json_object -> ``response_format``; ``reasoning.effort`` -> ``reasoning_effort``;
  ``temperature``, ``top_p``, ``parallel_tool_calls``, ``user``, ``metadata`` as they are; ``stream`` asks for
  usage in the stream. ``store``, ``include``, ``prompt_cache_key``, ``truncation`` and the rest are dropped.

Answer side (``chat_to_response``): a whole Responses object as OpenAI's SDK parses it: a ``message`` item for
the text (and refusal), a ``function_call`` item per tool call (a custom tool's call back as a
``custom_tool_call`` with its ``input``), ``status`` ``incomplete`` (with ``incomplete_details``) when the
answer stopped at its length or a content filter, usage in Responses' names, and the request's settings echoed.
``reasoning_content`` is dropped: a ``reasoning`` item the client replays would come back with nothing to verify.
"""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

import orjson

from proxy.types import ChatBody, JSONObject, Message, Messages

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text")
KEPT_PARAMS = ("temperature", "top_p", "parallel_tool_calls", "user", "metadata")
TOOL_CHOICES = ("auto", "none", "required")
CUSTOM_PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's input, as free-form text."}},
    "required": ["input"],
    "additionalProperties": False,
}
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


class Untranslatable(Exception):
    """A part of a Responses request that Chat Completions cannot carry; ``param`` says where (``input[3]``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _obj(value: Any) -> JSONObject:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


# --- Request: Responses -> Chat Completions ---


def _part(part: Any, where: str) -> JSONObject:
    """One content part of an input message as a chat content part."""
    kind = _obj(part).get("type")
    if kind in TEXT_PARTS:
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind == "refusal":
        return {"type": "text", "text": str(part.get("refusal", ""))}
    if kind == "input_image":
        if isinstance(part.get("image_url"), str):
            image: JSONObject = {"url": part["image_url"]}
            if part.get("detail") in ("low", "high", "auto"):
                image["detail"] = part["detail"]
            return {"type": "image_url", "image_url": image}
        if isinstance(part.get("file_id"), str):
            return {"type": "file", "file": {"file_id": part["file_id"]}}
    if kind == "input_file":
        file = {k: part[k] for k in ("file_data", "file_id", "filename") if isinstance(part.get(k), str)}
        if "file_data" in file or "file_id" in file:
            return {"type": "file", "file": file}
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": copy.deepcopy(_obj(part.get("input_audio")))}
    raise Untranslatable(f"Content of type {kind!r} cannot be sent to this model (Chat Completions).", where)


def _parts(content: Any, where: str) -> list[JSONObject]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise Untranslatable("A message's content must be a string or a list of parts.", where)
    return [_part(part, f"{where}[{j}]") for j, part in enumerate(content)]


def _text(parts: list[JSONObject]) -> str:
    return "".join(p["text"] for p in parts if p["type"] == "text")


def _message(item: JSONObject, where: str) -> Message:
    role = ROLES.get(str(item.get("role")))
    if role is None:
        raise Untranslatable(f"A message's role must be one of {', '.join(ROLES)}.", f"{where}.role")
    parts = _parts(item.get("content"), f"{where}.content")
    if role != "user":
        return {"role": role, "content": _text(parts)}
    if len(parts) == 1 and parts[0]["type"] == "text":
        return {"role": "user", "content": parts[0]["text"]}
    return {"role": "user", "content": parts}


def _output_text(output: Any, where: str) -> str:
    """A tool call's output as the text of a ``tool`` message (images and files named, not sent)."""
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        raise Untranslatable("A tool call's output must be a string or a list of parts.", where)
    pieces = []
    for part in output:
        kind = _obj(part).get("type")
        pieces.append(str(part.get("text", "")) if kind in TEXT_PARTS else f"[{str(kind).removeprefix('input_')}]")
    return "\n".join(pieces)


def _call(item: JSONObject, custom: bool) -> JSONObject:
    arguments = orjson.dumps({"input": str(item.get("input", ""))}).decode() if custom else item.get("arguments")
    function = {"name": str(item.get("name", "")), "arguments": arguments if isinstance(arguments, str) else ""}
    return {"id": str(item.get("call_id", "")), "type": "function", "function": function}


def _add_call(messages: Messages, call: JSONObject, merge: bool) -> None:
    """A tool call into the assistant message before it (when ``merge``), else a new assistant message."""
    if merge and messages and messages[-1].get("role") == "assistant":
        last = messages[-1]
        last["tool_calls"] = [*(last.get("tool_calls") or []), call]
        if last.get("content") == "":
            last["content"] = None
        return
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _items(items: list[Any]) -> Messages:
    messages: Messages = []
    merge = False  # whether the previous translated item was an assistant message or call (reasoning skipped)
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise Untranslatable("An input item must be an object.", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            continue
        if kind == "message":
            messages.append(_message(item, where))
            merge = messages[-1]["role"] == "assistant"
        elif kind in ("function_call", "custom_tool_call"):
            _add_call(messages, _call(item, kind == "custom_tool_call"), merge)
            merge = True
        elif kind in ("function_call_output", "custom_tool_call_output"):
            text = _output_text(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text})
            merge = False
        else:
            raise Untranslatable(
                f"An input item of type {kind!r} cannot be sent to this model (Chat Completions).", where
            )
    return messages


def _tools(tools: Any) -> list[JSONObject]:
    """Function and custom tools as chat functions; built-in tools are dropped."""
    out: list[JSONObject] = []
    for tool in tools if isinstance(tools, list) else []:
        kind = _obj(tool).get("type")
        if kind not in ("function", "custom"):
            continue
        function: JSONObject = {"name": str(tool.get("name", ""))}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        if kind == "custom":
            function["parameters"] = copy.deepcopy(CUSTOM_PARAMETERS)
        else:
            schema = tool.get("parameters")
            function["parameters"] = copy.deepcopy(schema) if isinstance(schema, dict) else {"type": "object"}
            if isinstance(tool.get("strict"), bool):
                function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out


def custom_tools(request: JSONObject) -> set[str]:
    """The names of the request's custom (free-form) tools, whose calls go back as ``custom_tool_call``."""
    return {str(t.get("name")) for t in request.get("tools") or [] if _obj(t).get("type") == "custom"}


def _tool_choice(choice: Any) -> Any:
    if choice in TOOL_CHOICES:
        return choice
    if _obj(choice).get("type") in ("function", "custom") and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return None


def _response_format(text: Any) -> JSONObject | None:
    form = _obj(_obj(text).get("format"))
    if form.get("type") == "json_object":
        return {"type": "json_object"}
    if form.get("type") == "json_schema":
        keys = ("name", "schema", "strict", "description")
        return {"type": "json_schema", "json_schema": {k: copy.deepcopy(form[k]) for k in keys if k in form}}
    return None


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request body -> a Chat Completions body (same model string); ``Untranslatable`` for what
    chat cannot carry."""
    if body.get("previous_response_id") is not None:
        raise Untranslatable("previous_response_id cannot be sent to this model (Chat Completions).",
                             "previous_response_id")  # fmt: skip
    messages: Messages = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions is not None and not isinstance(instructions, str):
        raise Untranslatable("instructions must be a string for this model (Chat Completions).", "instructions")
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        messages += _items(given)
    chat: ChatBody = {"model": body.get("model"), "messages": messages}
    chat.update({key: copy.deepcopy(body[key]) for key in KEPT_PARAMS if body.get(key) is not None})
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if tools := _tools(body.get("tools")):
        chat["tools"] = tools
        if (choice := _tool_choice(body.get("tool_choice"))) is not None:
            chat["tool_choice"] = choice
    else:
        chat.pop("parallel_tool_calls", None)  # chat refuses it without tools
    if (form := _response_format(body.get("text"))) is not None:
        chat["response_format"] = form
    effort = _obj(body.get("reasoning")).get("effort")
    if isinstance(effort, str):
        chat["reasoning_effort"] = effort
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# --- Answer: Chat Completions -> Responses ---


def usage_to_responses(usage: Any) -> JSONObject:
    """Chat usage in Responses' names (cached prompt tokens are part of ``input_tokens``, as in chat)."""
    usage = _obj(usage)
    prompt, completion = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
    cached = _int(_obj(usage.get("prompt_tokens_details")).get("cached_tokens"))
    reasoning = _int(_obj(usage.get("completion_tokens_details")).get("reasoning_tokens"))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": _int(usage.get("total_tokens")) or prompt + completion,
    }


def incomplete_details(finish_reason: Any) -> JSONObject | None:
    reason = INCOMPLETE.get(finish_reason) if isinstance(finish_reason, str) else None
    return {"reason": reason} if reason else None


def response_object(
    request: JSONObject, response_id: str, created_at: float, status: str, output: list[JSONObject],
    usage: JSONObject | None = None, incomplete: JSONObject | None = None,
) -> JSONObject:  # fmt: skip
    """A Responses object with the request's settings echoed, as OpenAI's SDK expects every field."""
    text = request.get("text") if isinstance(request.get("text"), dict) else {"format": {"type": "text"}}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": str(request.get("model") or ""),
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": request.get("reasoning") if isinstance(request.get("reasoning"), dict) else None,
        "store": request.get("store", True),
        "temperature": request.get("temperature"),
        "text": copy.deepcopy(text),
        "tool_choice": copy.deepcopy(request.get("tool_choice", "auto")),
        "tools": copy.deepcopy(request.get("tools") or []),
        "top_p": request.get("top_p"),
        "truncation": request.get("truncation", "disabled"),
        "usage": usage,
        "user": request.get("user"),
        "metadata": copy.deepcopy(request.get("metadata") or {}),
    }


def message_item(item_id: str, text: str, refusal: str | None = None, status: str = "completed") -> JSONObject:
    content: list[JSONObject] = []
    if text or refusal is None:
        content.append({"type": "output_text", "text": text, "annotations": []})
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_item(call_id: str, name: str, arguments: str, custom: bool, item_id: str | None = None) -> JSONObject:
    """A chat tool call as an output item: ``function_call``, or ``custom_tool_call`` for a custom tool."""
    if not custom:
        return {"type": "function_call", "id": item_id or new_id("fc_"), "call_id": call_id, "name": name,
                "arguments": arguments, "status": "completed"}  # fmt: skip
    try:
        parsed = orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        parsed = None
    value = parsed.get("input") if isinstance(parsed, dict) else None
    given = value if isinstance(value, str) else arguments  # a model that sent the text itself
    return {"type": "custom_tool_call", "id": item_id or new_id("ctc_"), "call_id": call_id, "name": name,
            "input": given}  # fmt: skip


def chat_to_response(answer: dict[str, Any], request: dict[str, Any], response_id: str) -> dict[str, Any]:
    """A Chat Completions answer (non-streamed) -> a Responses object for ``request``."""
    choices = answer.get("choices")
    choice = _obj(choices[0]) if isinstance(choices, list) and choices else {}
    message = _obj(choice.get("message"))
    content = message.get("content")
    text = content if isinstance(content, str) else "".join(
        str(p.get("text", "")) for p in content or [] if _obj(p).get("type") == "text"
    )  # fmt: skip
    refusal = message.get("refusal") if isinstance(message.get("refusal"), str) else None
    output: list[JSONObject] = []
    if text or refusal:
        output.append(message_item(new_id("msg_"), text, refusal))
    custom = custom_tools(request)
    for call in message.get("tool_calls") or []:
        function = _obj(_obj(call).get("function"))
        name, arguments = str(function.get("name") or ""), function.get("arguments")
        call_id = str(call.get("id") or new_id("call_"))
        output.append(call_item(call_id, name, arguments if isinstance(arguments, str) else "", name in custom))
    incomplete = incomplete_details(choice.get("finish_reason"))
    created = answer.get("created")
    return response_object(
        request, response_id, created if isinstance(created, int | float) else time.time(),
        "incomplete" if incomplete else "completed", output, usage_to_responses(answer.get("usage")), incomplete,
    )  # fmt: skip
