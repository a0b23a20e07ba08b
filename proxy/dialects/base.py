"""What the engine may ask of a stored message, whatever wire format it came in.

Messages are stored in the client's own JSON and forwarded byte-identical; the engine never rewrites them. It
only needs to *read* them (roles, text, tool pairs, token costs) and to *write* its own blocks (summaries,
recalled excerpts) in the same format. A ``Dialect`` is that reading and writing for one wire format:

    Dialect
    ├── ChatDialect        OpenAI Chat Completions messages          (proxy.dialects.chat)
    ├── MessagesDialect    Anthropic Messages: content blocks        (proxy.dialects.messages)
    └── ResponsesDialect   OpenAI Responses: input items             (proxy.dialects.responses)

What each method answers:

* ``role``: the role the store keeps for a message (its ``messages.role`` column). The engine's cut rules work
  on this sequence of strings alone, so every dialect names a tool result ``"tool"``-like role of its own and
  says with ``continues`` which roles must stay with the message before them.
* ``continues(previous, role)``: no cut (fresh-tail boundary, compaction chunk, eviction) may fall between a
  message of role ``previous`` and the next one of role ``role``: tool results after their call, a call
  after the reasoning it came from.
* ``user_turn(role)``: the user's own words (not a tool result): where the newest exchange starts.
* ``instruction_count``: how many leading messages are instructions (forwarded verbatim, outside identity).
  Top-level fields such as Messages' ``system`` or Responses' ``instructions`` are the door's business.
* ``text``: the words of a message for summaries, search and facts, with structured reasoning (thinking
  blocks, reasoning items) left out; inline ``<think>`` tags are stripped by the engine, as for every format.
* ``question``: what a user message asks, for auto-recall's search: its text, less what a client adds around
  the user's words (Claude Code's reminders and command notes open its messages; the words come last).
* ``search_text``: the pieces the full-text index keeps of a message.
* ``header``: how a message is labelled in a flat transcript (summarizer input, recall output).
* ``tool_calls`` / ``result_ids``: the calls a message makes and the call ids whose results it carries.
* ``count``: its token cost as forwarded.
* ``payload_sites``: the strings interception may move out of line (``proxy.engine.intercept``).
* ``summary_message`` / ``prepend`` / ``append``: the proxy's own blocks, as a user message of the format,
  placed before the text of a user message, or after the content of the request's last message (a tool
  result: where a block that changes every request splits no cached prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple, Protocol

from proxy.types import Message

Path = list[str | int]


class ToolCall(NamedTuple):
    id: str
    name: str
    arguments: str


class Site(NamedTuple):
    """A string of a message that interception may store out of line (a site names only a string the message
    holds: a part sent by reference, such as a chat file part with only a ``file_id``, has none).

    ``text``: text the client wrote (a pasted file); ``tool_result``: a tool's output at ``path``, replaced
    as a whole at ``replace`` by its stub, ``name`` being the id of the call it answers; ``base64``: encoded
    bytes (an optional ``data:`` prefix) at ``path``, stored under file name ``name`` with type ``mime``."""

    kind: Literal["text", "tool_result", "base64"]
    path: Path
    replace: Path | None = None
    name: str = ""
    mime: str | None = None


class Dialect(Protocol):
    name: str  # stored with each conversation; "chat" for every conversation made before dialects existed

    def role(self, message: Message) -> str: ...
    def continues(self, previous: str, role: str) -> bool: ...
    def user_turn(self, role: str) -> bool: ...
    def instruction_count(self, messages: Sequence[Message]) -> int: ...
    def text(self, message: Message) -> str: ...
    def question(self, message: Message) -> str: ...
    def search_text(self, message: Message) -> list[str]: ...
    def header(self, message: Message) -> str: ...
    def tool_calls(self, message: Message) -> list[ToolCall]: ...
    def result_ids(self, message: Message) -> list[str]: ...
    def count(self, message: Message) -> int: ...
    def payload_sites(self, message: Message) -> list[Site]: ...
    def summary_message(self, text: str) -> Message: ...
    def prepend(self, message: Message, text: str) -> Message: ...
    def append(self, message: Message, text: str) -> Message: ...


def split_instructions(dialect: Dialect, messages: list[Message]) -> tuple[list[Message], list[Message]]:
    """(leading instructions, the transcript after them)."""
    i = dialect.instruction_count(messages)
    return messages[:i], messages[i:]


def count_messages(dialect: Dialect, messages: Sequence[Message]) -> int:
    """Tokens of a list of messages: each one's cost, plus the reply's priming (as ``tokens.count_messages``)."""
    return sum(dialect.count(m) for m in messages) + 3


def cut_allowed(dialect: Dialect, roles: Sequence[str], index: int) -> bool:
    """Whether a cut may fall right before ``roles[index]`` (always at either end of the sequence)."""
    return index <= 0 or index >= len(roles) or not dialect.continues(roles[index - 1], roles[index])
