"""A coding-agent session for compaction and cache measurements: one instruction per turn, then many tool
rounds, each returning a large output (a file read, a test log, grep output) of 1,000 to 6,000 tokens, so a
single turn outgrows an 8,000-token window."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from proxy import tokens
from tests.support.fakes import Reply
from tests.support.sim import ScriptedModel, is_summary_request

OUTPUT_TOKENS = (1200, 3400, 6000, 1000, 4500, 2200, 5200, 1600)  # cycled, one per tool call
ROUNDS = 6  # tool rounds per turn before the agent answers

AGENT_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("read_file", "run_tests", "grep")
]


def instruction(turn: int) -> dict[str, Any]:
    return {
        "role": "user",
        "content": f"Task {turn}: fix the failing check in module {turn} of the billing service, run the tests,"
        " and tell me what you changed.",
    }


@dataclass
class AgentModel(ScriptedModel):
    """Answers summary requests as ``ScriptedModel`` does; a chat request after the user's instruction starts
    ``rounds`` rounds of one tool call each, cycling through the tools, then a short answer."""

    rounds: int = ROUNDS
    _round: int = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            return super().__call__(body)
        self.chat_calls += 1
        if body["messages"][-1].get("role") == "user":
            self._round = 0
        if self._round == self.rounds:
            return Reply(content=f"Done with step {self.chat_calls}: the check passes now; tests are green.")
        self._round += 1
        name = AGENT_TOOLS[self.chat_calls % len(AGENT_TOOLS)]["function"]["name"]
        call = {
            "id": f"call_{self.chat_calls}",
            "type": "function",
            "function": {"name": name, "arguments": f'{{"target": "item {self.chat_calls}"}}'},
        }
        return Reply(content=None, tool_calls=[call])


def _lines(name: str, n: int) -> str:
    if name == "read_file":
        return f"def handler_{n}(request, account):\n    return charge(account, request.amount * {n % 7 + 1})\n"
    if name == "run_tests":
        return f"tests/test_billing.py::test_invoice_case_{n} PASSED{' ' * (n % 3)} [{n % 100:3d}%]\n"
    return f"src/billing/module_{n % 23}.py:{n * 7}:    total = apply_discount(invoice_{n}, rate={n % 9})\n"


def tool_output(call: dict[str, Any], index: int) -> dict[str, Any]:
    """The result of the ``index``-th tool call of the session: distinct text of ``OUTPUT_TOKENS[index]``
    tokens, give or take a line."""
    name = call["function"]["name"]
    target = OUTPUT_TOKENS[index % len(OUTPUT_TOKENS)]
    lines, total = [], 0
    for n in itertools.count(index * 1000):
        if total >= target:
            break
        line = _lines(name, n)
        lines.append(line)
        total += tokens.count_text(line)
    return {"role": "tool", "tool_call_id": call["id"], "content": "".join(lines)}
