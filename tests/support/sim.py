"""A scripted model and a realistic client for compaction simulations against the real proxy: a small-window
model, the settings that make it compact often, and the turns a session sends."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxy import tokens
from tests.support.fakes import Reply

if TYPE_CHECKING:  # bench/ imports this module without the test servers
    from tests.support.proxies import RunningProxy

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


def extends(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> bool:
    """Whether ``after`` repeats ``before`` byte for byte, recall blocks included (True), or gave way only the
    newest recall blocks ``before`` held: equal up to the first of them, the same messages without their blocks
    from there on (False; ``proxy.engine.held``). Anything else fails."""
    if after[: len(before)] == before:
        return True
    k = next(i for i, (a, b) in enumerate(zip(after, before, strict=False)) if a != b)
    assert "<recalled_history " in str(before[k].get("content")), f"message {k} changed, not a recall block"
    assert [without_recall(m) for m in after[k : len(before)]] == [without_recall(m) for m in before[k:]]
    return False


def forwarded_tokens(body: dict[str, Any]) -> int:
    total = tokens.count_messages(body["messages"])
    if body.get("tools"):
        import orjson

        total += tokens.count_text(orjson.dumps(body["tools"]).decode())
    return total


# What the proxy may place around a message's own text: the summaries before it (merged into the first raw user
# message, for strict user/assistant alternation) and the auto-recall block after it (at the end of the request).
SUMMARIES = re.compile(r"\A(?:<summary id=\"sum_[0-9a-f]{16}\"[^>]*>\n.*?\n</summary>\n?)+(?:\n|\Z)", re.S)
RECALL_BLOCK = re.compile(r"\A<recalled_history [^>]*>\n.*?\n</recalled_history>(?:\n\n|\Z)", re.S)
TRAILING_RECALL = re.compile(
    r"\n\n<recalled_history [^>]*>\n(?:(?!</recalled_history>).)*\n</recalled_history>\Z", re.S
)


def without_recall(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` without the summaries and the auto-recall block the proxy may place around its text."""
    content = message.get("content")
    if isinstance(content, str):
        content = SUMMARIES.sub("", content, count=1)
        content = RECALL_BLOCK.sub("", content, count=1)  # before the question (an assistant prefill follows)
        return {**message, "content": TRAILING_RECALL.sub("", content, count=1)}
    if isinstance(content, list):
        parts = [p for p in content[:2] if str(p.get("text", "")).startswith(("<summary id=", "<recalled_history "))]
        content = content[len(parts) :]
        if content and str(content[-1].get("text", "")).startswith("<recalled_history "):
            content = content[:-1]
        return {**message, "content": content}
    return message


WINDOW = 8000


MAX_TOKENS = 400


SMALL_MODEL = {
    "model_name": "small",
    "litellm_params": {"model": "openai/small"},
    "model_info": {"max_input_tokens": WINDOW, "supports_function_calling": True},
}


SIM_LCM = {
    "fresh_tail_count": 8,
    "leaf_chunk_tokens": 1500,
    "leaf_target_tokens": 150,
    "condensed_target_tokens": 250,
    "leaf_min_fanout": 4,
    "condensed_min_fanout": 3,
    "tool_result_token_threshold": 300,
    "large_file_token_threshold": 2500,
    "fallback_max_tokens": 200,
    # The fake upstream is on loopback only because it is a test: this session models a hosted model, whose
    # background summaries run alongside the chat requests (tests/relay/test_priority.py covers local servers).
    "background_yields": "never",
}


TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]


def start_sim_proxy(proxy_factory: Any, upstream_url: str, **lcm: Any) -> RunningProxy:
    model = {
        **SMALL_MODEL,
        "litellm_params": {**SMALL_MODEL["litellm_params"], "api_base": f"{upstream_url}/v1", "api_key": "k-12345678"},
    }
    return proxy_factory(lcm={**SIM_LCM, **lcm}, models=[model])  # type: ignore[no-any-return]


def user_turn(turn: int) -> dict[str, Any]:
    if turn % 25 == 7:  # a pasted file, large enough to be stubbed even in the fresh tail
        body = "".join(f"record {turn}-{i}: value {i * 13 % 97} status ok\n" for i in range(900))
        return {
            "role": "user",
            "content": f'Look at this file <file name="data{turn}.txt" mime="text/plain">{body}</file> please.',
        }
    if turn % 6 == 3:
        return {"role": "user", "content": f"Turn {turn}: use tools to look up topic {turn}."}
    return {
        "role": "user",
        "content": f"Turn {turn}: here is my next thought about the project, detail {turn * 31 % 101}. " * 3,
    }


def tool_result(call: dict[str, Any], turn: int) -> dict[str, Any]:
    big = call["function"]["name"] == "read_file"
    text = "".join(f"line {i} of result for turn {turn}\n" for i in range(90 if big else 5))
    return {"role": "tool", "tool_call_id": call["id"], "content": text}
