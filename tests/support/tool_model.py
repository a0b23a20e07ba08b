"""A scripted model for the recall tools: summaries repeat their source's first words, and a chat turn offered
the recall tools calls the ones its test planned."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from proxy.engine.summarize import CONDENSED_PROMPTS, LEAF_PROMPT
from proxy.relay.summarizer import EXPLORE_PROMPT
from tests.support.fakes import Reply

SUMMARY_PROMPTS = tuple(p.split("{", 1)[0] for p in (LEAF_PROMPT, EXPLORE_PROMPT, *CONDENSED_PROMPTS.values()))


def is_summary_request(body: dict[str, Any]) -> bool:
    """The proxy's own summary and exploration calls (not the summary model answering lcm_expand_query)."""
    first = body["messages"][0]
    return first.get("role") == "system" and str(first.get("content")).startswith(SUMMARY_PROMPTS)


@dataclass
class ToolModel:
    """Summaries repeat the first words of their source. A chat turn that is offered the recall tools and has
    a ``plan`` calls them all at once; the next round records the tool results and answers. Requests without
    tools (the summary model answering ``lcm_expand_query``) get their material echoed back."""

    plan: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)
    fail_summaries: Reply | None = None
    fail_answers: Reply | None = None

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        if is_summary_request(body):
            if self.fail_summaries is not None:
                return self.fail_summaries
            words = re.findall(r"\w+", str(messages[-1]["content"]))[:60]
            return Reply(content="Summary: " + " ".join(words))
        last = messages[-1]
        offered = {t["function"]["name"] for t in body.get("tools") or []}
        if last["role"] == "tool":
            self.results.update({m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"})
            return Reply(content="done")
        if self.plan and "lcm_describe" in offered:
            calls = [
                {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for i, (name, args) in enumerate(self.plan)
            ]
            return Reply(content=None, tool_calls=calls)
        if not body.get("tools") and self.fail_answers is not None:
            return self.fail_answers
        return Reply(content="echo: " + str(last.get("content"))[:4000])

    def result(self, index: int) -> str:
        return self.results[f"call_{index}"]
