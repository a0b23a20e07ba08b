"""OpenAI Responses: the items of a request's ``input``.

Items: ``message`` (``role``, ``content`` as a string or ``input_text`` / ``output_text`` / ``input_image`` /
``input_file`` / ``refusal`` parts; the ``type`` may be left out), ``function_call`` (``call_id``, ``name``,
``arguments``) and ``custom_tool_call`` (``input``), their ``*_output`` items (``call_id``, ``output``),
``reasoning`` (``summary`` parts, ``encrypted_content``) and ``compaction`` (Codex's remote compaction: an
``encrypted_content`` replayed verbatim).

Each item is one stored message. Roles: a message item's own role; ``"tool_call"`` for a call, ``"tool"``
for its output, ``"reasoning"``, ``"compaction"``. No cut falls before an output (its call is earlier), nor
between a reasoning item and what it produced (further reasoning, a preamble message, the calls after it):
providers refuse a ``function_call`` replayed without its reasoning item, and GPT-5 models write a preamble
message between the two. Reasoning is never text for summaries; its encrypted content is forwarded as
it was sent. The top-level ``instructions`` field is the door's business; leading ``system`` / ``developer``
message items (Codex sends its base prompt so) are instructions, and so are the user messages right after them
that carry Codex's project rules (``PROJECT_RULES``: AGENTS.md and its environment context, sent as user
messages before the user's first words): forwarded verbatim on every request, never summarised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy import tokens
from proxy.dialects.base import Site, ToolCall
from proxy.types import Message

INSTRUCTION_ROLES = ("system", "developer")
CALLS = ("function_call", "custom_tool_call", "local_shell_call")
OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text")
# How Codex opens the user messages that carry standing context rather than the user's words (FIELD-NOTES,
# Codex 0.169): its AGENTS.md (older versions: ``<user_instructions>``) and its environment context.
PROJECT_RULES = ("# AGENTS.md instructions for ", "<user_instructions>", "<environment_context>")


def kind(item: Message) -> str:
    return str(item.get("type") or ("message" if "role" in item else ""))


def _parts_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    pieces: list[str] = []
    for part in value if isinstance(value, list) else []:
        if not isinstance(part, dict):
            continue
        if part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
            pieces.append(f"(refused) {part['refusal']}")
        elif part.get("type") == "input_image":
            pieces.append("[image]")
        elif part.get("type") == "input_file":
            pieces.append(f"[file: {part.get('filename') or 'attachment'}]")
    return "\n".join(pieces)


def _cost(value: Any) -> int:
    """Tokens of an item's value: images at their billed size, encrypted content at its length (it stands
    for reasoning the model reads), everything else as JSON values."""
    if isinstance(value, list):
        return sum(_cost(v) for v in value)
    if not isinstance(value, dict):
        return tokens.count_value(value)
    if value.get("type") == "input_image":
        return tokens.IMAGE_TOKENS
    if value.get("type") == "input_file" and isinstance(value.get("file_data"), str):
        return max(1, len(value["file_data"]) * 3 // 4 // 16)
    total = 0
    for key, item in value.items():
        if key == "encrypted_content":
            total += len(str(item)) // 4
        elif key not in ("type", "id", "index", "status"):
            total += _cost(item)
    return total


class ResponsesDialect:
    name = "responses"

    def role(self, message: Message) -> str:
        item = kind(message)
        if item == "message":
            return str(message.get("role"))
        if item in CALLS:
            return "tool_call"
        if item in OUTPUTS:
            return "tool"
        return item

    def continues(self, previous: str, role: str) -> bool:
        if role == "tool":
            return True  # an output, after its call
        if role == "tool_call":
            return previous in ("reasoning", "tool_call", "assistant")  # a call, with the turn that made it
        return previous == "reasoning" and role != "user"  # what a reasoning item produced, preamble included

    def user_turn(self, role: str) -> bool:
        return role == "user"

    def instruction_count(self, messages: Sequence[Message]) -> int:
        i = 0
        while i < len(messages) and kind(messages[i]) == "message" and self._instruction(messages[i]):
            i += 1
        return i

    def _instruction(self, message: Message) -> bool:
        if message.get("role") in INSTRUCTION_ROLES:
            return True
        return message.get("role") == "user" and _parts_text(message.get("content")).lstrip().startswith(PROJECT_RULES)

    def question(self, message: Message) -> str:
        return self.text(message)

    def text(self, message: Message) -> str:
        item = kind(message)
        if item == "message":
            return _parts_text(message.get("content"))
        if item in OUTPUTS:
            return _parts_text(message.get("output"))
        return ""  # calls are read as calls; reasoning and compaction items are not the conversation's words

    def search_text(self, message: Message) -> list[str]:
        text = self.text(message)
        return ([text] if text else []) + [f"{c.name}({c.arguments})" for c in self.tool_calls(message)]

    def header(self, message: Message) -> str:
        role = self.role(message)
        if role == "tool":
            return f"tool result ({message.get('call_id', '')})"
        return "assistant" if role == "tool_call" else role

    def tool_calls(self, message: Message) -> list[ToolCall]:
        if kind(message) not in CALLS:
            return []
        arguments = message.get("arguments", message.get("input", ""))
        return [ToolCall(str(message.get("call_id")), str(message.get("name", "?")), str(arguments))]

    def result_ids(self, message: Message) -> list[str]:
        return [str(message.get("call_id"))] if kind(message) in OUTPUTS else []

    def count(self, message: Message) -> int:
        return tokens.MESSAGE_OVERHEAD + _cost({k: v for k, v in message.items() if k != "role"})

    def payload_sites(self, message: Message) -> list[Site]:
        item = kind(message)
        if item in OUTPUTS:
            if not isinstance(message.get("output"), str):
                return []  # outputs made of parts stay inline
            return [Site("tool_result", ["output"], ["output"], str(message.get("call_id")))]
        content = message.get("content") if item == "message" else None
        if isinstance(content, str):
            return [Site("text", ["content"])]
        sites: list[Site] = []
        for i, part in enumerate(content if isinstance(content, list) else []):
            if not isinstance(part, dict):
                continue
            if part.get("type") in ("input_text", "output_text") and isinstance(part.get("text"), str):
                sites.append(Site("text", ["content", i, "text"]))
            elif part.get("type") == "input_image" and isinstance(part.get("image_url"), str):
                sites.append(Site("base64", ["content", i, "image_url"], name="image"))
            elif part.get("type") == "input_file" and isinstance(part.get("file_data"), str):
                sites.append(Site("base64", ["content", i, "file_data"], name=str(part.get("filename") or "file")))
        return sites

    def summary_message(self, text: str) -> Message:
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}

    def prepend(self, message: Message, text: str) -> Message:
        content = message.get("content")
        if isinstance(content, list):
            return {**message, "content": [{"type": "input_text", "text": text}, *content]}
        if isinstance(content, str) and content:
            return {**message, "content": f"{text}\n\n{content}"}
        return {**message, "content": [{"type": "input_text", "text": text}]}

    def append(self, message: Message, text: str) -> Message:
        """After a call's output (its ``output`` string, or a part after its parts), or after a message's content."""
        key = "output" if kind(message) in OUTPUTS else "content"
        value = message.get(key)
        part = {"type": "input_text", "text": text}
        if isinstance(value, list):
            return {**message, key: [*value, part]}
        if isinstance(value, str) and value:
            return {**message, key: f"{value}\n\n{text}"}
        return {**message, key: text if key == "output" else [part]}


RESPONSES = ResponsesDialect()
