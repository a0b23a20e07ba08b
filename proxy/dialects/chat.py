"""OpenAI Chat Completions messages: ``{"role", "content", "tool_calls", "tool_call_id", ...}``.

The first dialect, and the one every conversation stored before dialects existed is read with: each answer
here is what the engine computed from chat fields directly before, so that existing databases, chain hashes
and token counts read the same. A tool call is an assistant message's ``tool_calls`` entry; its results are
the ``tool`` (or legacy ``function``) messages after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy import tokens
from proxy.dialects.base import Path, Site, ToolCall
from proxy.types import Message

INSTRUCTION_ROLES = ("system", "developer")
RESULT_ROLES = ("tool", "function")


def content_text(content: Any) -> str:
    """The readable text of a chat ``content`` (a string or parts), non-text parts as short markers."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            pieces.append(f"(refused) {part['refusal']}")
        elif kind == "image_url":
            url = str((part.get("image_url") or {}).get("url", ""))
            pieces.append("[image]" if url.startswith("data:") else f"[image: {url[:200]}]")
        elif kind == "file":
            pieces.append(f"[file: {(part.get('file') or {}).get('filename', 'attachment')}]")
        elif kind == "input_audio":
            pieces.append("[audio]")
    return "\n".join(pieces)


def prepend_text(message: Message, text: str) -> Message:
    """``message`` with ``text`` before its content, as one message (never two user messages in a row)."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [{"type": "text", "text": text}, *content]}
    if isinstance(content, str) and content:
        return {**message, "content": f"{text}\n\n{content}"}
    return {**message, "content": text}


def append_text(message: Message, text: str) -> Message:
    """``message`` with ``text`` after its content (a text part when the content is a list of parts)."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [*content, {"type": "text", "text": text}]}
    if isinstance(content, str) and content:
        return {**message, "content": f"{content}\n\n{text}"}
    return {**message, "content": text}


def _function(call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    return fn if isinstance(fn, dict) else {}


class ChatDialect:
    name = "chat"

    def role(self, message: Message) -> str:
        return str(message.get("role"))

    def continues(self, previous: str, role: str) -> bool:
        return role in RESULT_ROLES

    def user_turn(self, role: str) -> bool:
        return role == "user"

    def instruction_count(self, messages: Sequence[Message]) -> int:
        i = 0
        while i < len(messages) and messages[i].get("role") in INSTRUCTION_ROLES:
            i += 1
        return i

    def question(self, message: Message) -> str:
        return self.text(message)

    def text(self, message: Message) -> str:
        return content_text(message.get("content"))

    def search_text(self, message: Message) -> list[str]:
        parts: list[str] = []
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    continue
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif isinstance(part.get("refusal"), str):
                    parts.append(part["refusal"])
        for call in message.get("tool_calls") or []:
            fn = _function(call)
            parts.append(f"{fn.get('name', '')}({fn.get('arguments', '')})")
        return parts

    def header(self, message: Message) -> str:
        role = str(message.get("role"))
        if role == "tool":
            return f"tool result ({message.get('name') or message.get('tool_call_id', '')})"
        return role

    def tool_calls(self, message: Message) -> list[ToolCall]:
        out: list[ToolCall] = []
        for call in message.get("tool_calls") or []:
            fn = _function(call)
            call_id = str(call.get("id")) if isinstance(call, dict) else ""
            out.append(ToolCall(call_id, str(fn.get("name", "?")), str(fn.get("arguments", ""))))
        return out

    def result_ids(self, message: Message) -> list[str]:
        if message.get("role") == "tool":
            return [str(message.get("tool_call_id"))]
        return []

    def count(self, message: Message) -> int:
        return tokens.count_message(message)

    def payload_sites(self, message: Message) -> list[Site]:
        content = message.get("content")
        if message.get("role") == "tool":
            call_id = str(message.get("tool_call_id"))
            if isinstance(content, str):
                return [Site("tool_result", ["content"], ["content"], call_id)]
            if (
                isinstance(content, list)
                and len(content) == 1
                and isinstance(content[0], dict)
                and isinstance(content[0].get("text"), str)
            ):
                return [Site("tool_result", ["content", 0, "text"], ["content"], call_id)]
            return []  # multi-part tool results are rare; they stay inline
        if isinstance(content, str):
            return [Site("text", ["content"])]
        sites: list[Site] = []
        for i, part in enumerate(content if isinstance(content, list) else []):
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                sites.append(Site("text", ["content", i, "text"]))
            elif kind == "image_url" and _has_string(part.get("image_url"), "url"):
                sites.append(Site("base64", ["content", i, "image_url", "url"], name="image"))
            elif kind == "file" and _has_string(part.get("file"), "file_data"):  # not one sent by file_id alone
                name = str(part["file"].get("filename") or "file")
                sites.append(Site("base64", ["content", i, "file", "file_data"], name=name))
            elif kind == "input_audio" and _has_string(part.get("input_audio"), "data"):
                fmt = str(part["input_audio"].get("format") or "wav")
                path: Path = ["content", i, "input_audio", "data"]
                sites.append(Site("base64", path, name=f"audio.{fmt}", mime=f"audio/{fmt}"))
        return sites

    def summary_message(self, text: str) -> Message:
        return {"role": "user", "content": text}

    def prepend(self, message: Message, text: str) -> Message:
        return prepend_text(message, text)

    def append(self, message: Message, text: str) -> Message:
        return append_text(message, text)


def _has_string(value: Any, key: str) -> bool:
    """Whether ``value`` is an object holding a string at ``key``: the only parts a site may name."""
    return isinstance(value, dict) and isinstance(value.get(key), str)


CHAT = ChatDialect()
