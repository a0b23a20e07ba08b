"""A scripted model and a realistic client for compaction simulations against the real proxy."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from proxy import tokens
from tests.support.fakes import Reply

SUMMARY_MARKERS = ("You compress part of a conversation", "You merge", "You describe documents")


def is_summary_request(body: dict[str, Any]) -> bool:
    first = body["messages"][0]
    return first.get("role") == "system" and any(str(first.get("content", "")).startswith(m) for m in SUMMARY_MARKERS)


@dataclass
class ScriptedModel:
    """Chat turns: a short answer, or parallel tool calls when the user asks for tools. Summaries: the first
    words of each source section, well under the target size."""

    summary_calls: int = 0
    chat_calls: int = 0
    summary_words: int = 60
    fail_summaries_with: int | None = None  # an HTTP status to answer summary requests with

    def __call__(self, body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            self.summary_calls += 1
            if self.fail_summaries_with is not None:
                return Reply(status=self.fail_summaries_with, error_message="summarizer unavailable")
            source = body["messages"][-1]["content"]
            words = re.findall(r"[A-Za-z0-9_]+", source)[: self.summary_words]
            return Reply(content="Summary: " + " ".join(words))
        self.chat_calls += 1
        last = body["messages"][-1]
        if last.get("role") == "user" and "use tools" in str(last.get("content")):
            n = self.chat_calls
            calls = [
                {
                    "id": f"call_{n}_a",
                    "type": "function",
                    "function": {"name": "search", "arguments": f'{{"q": "topic {n}"}}'},
                },
                {
                    "id": f"call_{n}_b",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": f'{{"path": "f{n}.txt"}}'},
                },
            ]
            return Reply(content=None, tool_calls=calls)
        return Reply(content=f"Answer number {self.chat_calls}: noted, continuing with the plan.")


def check_tool_pairing(messages: list[dict[str, Any]]) -> None:
    """Every tool result follows its call; every call has all its results; nothing orphaned."""
    pending: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            assert message["tool_call_id"] in pending, f"orphan tool result at {i}"
            pending.discard(message["tool_call_id"])
            continue
        assert not pending, f"dangling tool calls {pending} before message {i}"
        for call in message.get("tool_calls") or []:
            pending.add(call["id"])
    assert not pending, f"dangling tool calls {pending} at the end"


@dataclass
class Stats:
    forwarded: list[list[dict[str, Any]]] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)

    def _comparable(self) -> list[list[dict[str, Any]]]:
        """Each request's messages before the one carrying the auto-recall block (the newest user message):
        everything before the block is what must stay byte-identical (docs/architecture.md, "Prefix stability")."""
        out = []
        for messages in self.forwarded:
            cut = len(messages)
            for i, message in enumerate(messages):
                if "<recalled_history " in str(message.get("content")):
                    cut = i
                    break
            out.append(messages[:cut])
        return out

    def breaks(self) -> list[int]:
        forwarded = self._comparable()
        return [i + 1 for i, (a, b) in enumerate(itertools.pairwise(forwarded)) if b[: len(a)] != a]

    def prefix_stability(self) -> float:
        forwarded = self._comparable()
        pairs = list(itertools.pairwise(forwarded))
        if not pairs:
            return 1.0
        extends = sum(1 for a, b in pairs if b[: len(a)] == a)
        return extends / len(pairs)


def forwarded_tokens(body: dict[str, Any]) -> int:
    total = tokens.count_messages(body["messages"])
    if body.get("tools"):
        import orjson

        total += tokens.count_text(orjson.dumps(body["tools"]).decode())
    return total


# What the proxy may place before a message's own text: the summaries (merged into the first raw user message,
# for strict user/assistant alternation) and the auto-recall block (in the newest user message).
SUMMARIES = re.compile(r"\A(?:<summary id=\"sum_[0-9a-f]{16}\"[^>]*>\n.*?\n</summary>\n?)+(?:\n|\Z)", re.S)
RECALL_BLOCK = re.compile(r"\A<recalled_history [^>]*>\n.*?\n</recalled_history>(?:\n\n|\Z)", re.S)


def without_recall(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` without the summaries and the auto-recall block the proxy may place before its text."""
    content = message.get("content")
    if isinstance(content, str):
        content = SUMMARIES.sub("", content, count=1)
        return {**message, "content": RECALL_BLOCK.sub("", content, count=1)}
    if isinstance(content, list):
        parts = [p for p in content[:2] if str(p.get("text", "")).startswith(("<summary id=", "<recalled_history "))]
        return {**message, "content": content[len(parts) :]}
    return message
