"""Prompt-cache benchmark (issue 24), part of ``python -m bench compaction``: how much of what the proxy
forwards repeats the previous request's prefix, and what the input costs under Anthropic's and OpenAI's cache
pricing (``tests/support/cache.py`` names the assumptions), beside two baselines computed from the client's
own transcript in the same run: the client sending everything, and client-side compaction the way Claude
Code does it (``tests/support/client_compaction.py``).

Two sessions through the real proxy (8,000-token window, auto-recall on as by default), measured from what
the fake upstream received: the 150-turn session of ``tests/support/sim.py``, and a coding-agent session
whose tool outputs are 1,000 to 6,000 tokens (``tests/support/agent_session.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support import agent_session, fact_session, sim
from tests.support.cache import PRICING_ASSUMPTIONS, CacheUse, serialise, size
from tests.support.client_compaction import claude_code_requests, threshold
from tests.support.fakes import FakeUpstream

DESCRIBE = sim.SUMMARY_MARKERS[2]  # the summariser prompt that describes a stored document


@dataclass
class Session:
    """What one session sent: the client's transcript, how much of it each client request carried, and the
    chat and summariser requests the upstream received from the proxy."""

    name: str
    turns: int
    tools: list[dict[str, Any]]
    transcript: list[dict[str, Any]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    forwarded: list[dict[str, Any]] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)


def run(
    proxy: str,
    fake: FakeUpstream,
    session: Session,
    user: Callable[[int], dict[str, Any]],
    result: Callable[[dict[str, Any], int, int], dict[str, Any]],
    max_rounds: int,
    streamed: Callable[[int], bool] = lambda turn: False,
) -> Session:
    """Drive ``session.turns`` turns: each a user message, then tool rounds until the model answers;
    ``result(call, turn, n)`` is the output of the session's ``n``-th tool call."""
    start = len(fake.requests)
    session.transcript = [{"role": "system", "content": "You are a project assistant."}]
    calls = 0
    with httpx.Client(base_url=f"{proxy}/v1", timeout=120) as client:
        for turn in range(session.turns):
            session.transcript.append(user(turn))
            for _ in range(max_rounds):
                body = {"model": "small", "messages": session.transcript, "tools": session.tools}
                body["max_tokens"] = sim.MAX_TOKENS
                if streamed(turn):
                    message = stream(client, body)
                else:
                    response = client.post("/chat/completions", json=body)
                    assert response.status_code == 200, response.text
                    message = response.json()["choices"][0]["message"]
                session.ends.append(len(session.transcript))
                session.transcript.append({k: v for k, v in message.items() if v is not None})
                if not message.get("tool_calls"):
                    break
                for call in message["tool_calls"]:
                    session.transcript.append(result(call, turn, calls))
                    calls += 1
    received = [r.body for r in fake.requests[start:] if r.path == "/v1/chat/completions"]
    session.forwarded = [b for b in received if not sim.is_summary_request(b)]
    session.summaries = [b for b in received if sim.is_summary_request(b)]
    assert len(session.forwarded) == len(session.ends), "one forwarded request per client request"
    return session


def stream(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """A streamed request, its answer put together from the chunks as a client does."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    with client.stream("POST", "/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    into = calls.setdefault(call["index"], {"id": "", "type": "function",
                                                            "function": {"name": "", "arguments": ""}})  # fmt: skip
                    into["id"] = call.get("id") or into["id"]
                    function = call.get("function") or {}
                    into["function"]["name"] += function.get("name") or ""
                    into["function"]["arguments"] += function.get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


@dataclass(frozen=True)
class Row:
    way: str
    chat: CacheUse
    summary_calls: int
    summary_tokens: int
    anthropic: float
    openai: float


def rows(session: Session) -> tuple[list[Row], list[str]]:
    """The proxy's row and the two baselines' rows; the footnotes: where sending everything stops fitting the
    window, and how much of the proxy's summariser input describes stored documents."""
    proxied = CacheUse.of([serialise(b) for b in session.forwarded])
    summariser = sum(size(serialise(b)) for b in session.summaries)
    bodies = [{"messages": session.transcript[:end], "tools": session.tools} for end in session.ends]
    everything = CacheUse.of([serialise(b) for b in bodies])
    overflow = next((i for i, n in enumerate(everything.sizes) if n + sim.MAX_TOKENS > sim.WINDOW), None)
    limit = threshold(sim.WINDOW, sim.MAX_TOKENS)
    sent = list(claude_code_requests(session.transcript, session.ends, session.tools, limit))
    client = CacheUse.of([s.segments for s in sent if not s.summary])
    stream = CacheUse.of([s.segments for s in sent])
    compactions = [s for s in sent if s.summary]
    table = [
        Row("lcm-proxy³", proxied, len(session.summaries), summariser, proxied.anthropic() + summariser,
            proxied.openai() + summariser),
        Row("client sends everything (baseline)¹", everything, 0, 0, everything.anthropic(), everything.openai()),
        Row(f"client compacts like Claude Code at {limit} tokens (baseline)²", client, len(compactions),
            sum(size(s.segments) for s in compactions), stream.anthropic(), stream.openai()),
    ]  # fmt: skip
    described = [b for b in session.summaries if str(b["messages"][0]["content"]).startswith(DESCRIBE)]
    fits = "always fits" if overflow is None else f"no longer fits from request {overflow + 1} of {len(bodies)} on"
    footnotes = [
        f"¹ Billed as if a large-window model accepted every request; in the {sim.WINDOW}-token window (with"
        f" {sim.MAX_TOKENS} tokens reserved for output) it {fits}.",
        "² Summarisation requests are counted in the summariser columns and billed in the stream of client requests"
        " (their prefix is the previous request's), also when larger than the window (Claude Code would get a"
        " 'prompt is too long' error); the chat columns count chat requests only.",
        f"³ Of the proxy's summariser calls, {len(described)} describe a stored tool output or file"
        f" ({sum(size(serialise(b)) for b in described) / session.turns:.0f} input tokens per turn).",
    ]
    return table, footnotes


def print_table(session: Session) -> None:
    table, footnotes = rows(session)
    print(f"\n## compaction: prompt cache, {session.name} ({session.turns} turns, {sim.WINDOW}-token window)\n")
    print(
        "| way | requests | requests extending the previous | forwarded tokens repeating the previous prefix |"
        " forwarded tokens per turn | summariser calls | summariser input per turn |"
        " billed input per turn, Anthropic | billed input per turn, OpenAI |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in table:
        print(
            f"| {row.way} | {len(row.chat.sizes)} | {row.chat.extending_share * 100:.1f}% |"
            f" {row.chat.repeated_share * 100:.1f}% | {row.chat.tokens / session.turns:.0f} | {row.summary_calls} |"
            f" {row.summary_tokens / session.turns:.0f} | {row.anthropic / session.turns:.0f} |"
            f" {row.openai / session.turns:.0f} |"
        )
    print("\n" + "\n".join(footnotes))


def measure(
    serve: Callable[[str], AbstractContextManager[str]],
    fake: FakeUpstream,
    quick: bool,
    serve_facts: Callable[[str], AbstractContextManager[str]] | None = None,
) -> list[Session]:
    """The sessions, each through its own proxy ``serve(name)`` (served with ``sim.SIM_LCM`` in front of
    ``fake``; ``serve_facts`` with ``fact_session.LCM``), so no background compaction of one session is counted
    in another."""
    fake.responder = sim.ScriptedModel()
    chat = Session("the simulated session of tests/support/sim.py", 40 if quick else 150, sim.TOOLS)
    with serve("chat") as proxy:
        run(proxy, fake, chat, sim.user_turn, lambda call, turn, _: sim.tool_result(call, turn), max_rounds=3)
    fake.responder = agent_session.AgentModel()
    agent = Session("an agent session with tool outputs of 1,000 to 6,000 tokens", 3 if quick else 10,
                    agent_session.AGENT_TOOLS)  # fmt: skip
    output = agent_session.tool_output
    with serve("agent") as proxy:
        run(proxy, fake, agent, agent_session.instruction, lambda call, _, n: output(call, n),
            max_rounds=agent_session.ROUNDS + 1)  # fmt: skip
    sessions = [chat, agent]
    if serve_facts is not None:
        fake.responder = sim.ScriptedModel()
        facts = Session("issue 32's chat: a new fact every turn, tool results every 10th, every 5th streamed",
                        40 if quick else fact_session.TURNS, sim.TOOLS)  # fmt: skip
        with serve_facts("facts") as proxy:
            run(proxy, fake, facts, fact_session.user_turn, lambda call, turn, n: fact_session.tool_result(call, turn, n),
                max_rounds=3, streamed=fact_session.streamed)  # fmt: skip
        sessions.append(facts)
    return sessions


def print_tables(sessions: list[Session]) -> None:
    for session in sessions:
        print_table(session)
    print(f"\n{PRICING_ASSUMPTIONS}")
