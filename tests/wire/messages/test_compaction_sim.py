"""The compaction simulation's Messages counterpart: a long Claude-Code-like session through the real proxy, on a
native model served by the strict fake Anthropic API, with a window small enough that the proxy compacts many
times.

The client sends what Claude Code sends: a two-block ``system`` (the billing line first), tools, its
session-id header, ``<system-reminder>`` blocks (CLAUDE.md opening the first user message, others now and then),
extended thinking, a cache breakpoint on the system and on the newest message; every fifth turn is a tool round
trip (sometimes two parallel calls), every fourth request streamed. Every request the proxy forwarded for the
session is checked: the fake accepted it (its own rules replayed on the body), within the window less
``max_tokens`` as the fake counts, tool uses paired with their results, roles alternating from the user, at
most four breakpoints, the system unchanged. Prefix stability and the cache share are printed. At the end the
admin API's export gives back the client's messages as the client sent them.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import re
from pathlib import Path
from typing import Any

import anthropic
import httpx

from proxy.engine.export import export_conversation
from proxy.store.location import Location
from tests.support.fake_anthropic import AReply, FakeAnthropic, count_tokens, last_user_text

WINDOW = 5_000
MAX_TOKENS = 1_100
TURNS = 60
MODEL = "claude-sonnet-4-5"
THINKING = {"type": "enabled", "budget_tokens": 1024}
BETA = "interleaved-thinking-2025-05-14"
SESSION = "sim-session-0001"
LCM = {
    "fresh_tail_count": 6,
    "leaf_chunk_tokens": 900,
    "leaf_target_tokens": 150,
    "condensed_target_tokens": 250,
    "leaf_min_fanout": 4,
    "condensed_min_fanout": 3,
    "tool_result_token_threshold": 300,
    "background_yields": "never",
}
EPHEMERAL = {"type": "ephemeral"}


def _native_model(anthropic_url: str) -> dict[str, Any]:
    """``claude-sonnet-4-5`` on the fake Anthropic API with the small window (tests import no conftest)."""
    return {
        "model_name": MODEL,
        "litellm_params": {"model": f"anthropic/{MODEL}", "api_base": anthropic_url, "api_key": "sk-ant-sim-42"},
        "model_info": {"max_input_tokens": WINDOW, "supports_function_calling": True},
    }


SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.330; cc_entrypoint=sdk-cli;"},
    {
        "type": "text",
        "text": "You are Claude Code, an interactive CLI tool that helps users with software engineering tasks. "
        "Be concise; use the tools to read the code before changing it.",
        "cache_control": EPHEMERAL,
    },
]
TOOLS = [
    {
        "name": "Read",
        "description": "Read a file from the local filesystem.",
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
    },
    {
        "name": "Grep",
        "description": "Search file contents with a regular expression.",
        "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}}},
    },
]
CLAUDE_MD = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following context:\n# claudeMd\n"
    "Contents of /repo/CLAUDE.md (project instructions, checked into the codebase):\n\n"
    "- Run the tests with make test before committing.\n- Never edit generated files under gen/.\n"
    "</system-reminder>"
)


def _strip_hints(value: Any) -> Any:
    """``value`` without ``cache_control`` (a transport hint: Claude Code moves its breakpoint every request)."""
    if isinstance(value, dict):
        return {k: _strip_hints(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_hints(v) for v in value]
    return value


def _with_breakpoint(message: dict[str, Any]) -> dict[str, Any]:
    """The message with a cache breakpoint on its last block, as Claude Code marks the newest message."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    blocks[-1] = {**blocks[-1], "cache_control": EPHEMERAL}
    return {**message, "content": blocks}


def _user_turn(turn: int) -> dict[str, Any]:
    words = f"Turn {turn}: next step for the parser module, detail {turn * 37 % 101}. " * 4
    if turn % 5 == 2:
        words += f"Please use tools to inspect src/mod{turn}.py."
    blocks: list[dict[str, Any]] = []
    if turn == 0:
        blocks.append({"type": "text", "text": CLAUDE_MD})
    blocks.append({"type": "text", "text": words})
    if turn % 3 == 1:
        reminder = f"<system-reminder>\nThe user opened the file src/mod{turn}.py in the IDE.\n</system-reminder>"
        blocks.append({"type": "text", "text": reminder})
    if len(blocks) == 1 and turn % 2:
        return {"role": "user", "content": words}  # Claude Code sends some turns as a plain string
    return {"role": "user", "content": blocks}


def _tool_results(uses: list[dict[str, Any]], turn: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for use in uses:
        lines = "".join(f"{i:4d}\tdef handler_{turn}_{i}(): return {i * 7 % 13}\n" for i in range(25))
        result: Any = lines if use["name"] == "Read" else [{"type": "text", "text": f"src/mod{turn}.py:3: match"}]
        content.append({"type": "tool_result", "tool_use_id": use["id"], "content": result})
    if turn % 10 == 2:
        content.append({"type": "text", "text": "<system-reminder>\nTodo list is empty.\n</system-reminder>"})
    return {"role": "user", "content": content}


class Model:
    """The fake's answers: the session's turns think (and call tools when asked); the proxy's summariser calls
    (no ``thinking``) get a short text."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.summaries = 0

    def __call__(self, body: dict[str, Any]) -> AReply:
        if not body.get("thinking"):
            self.summaries += 1
            words = re.findall(r"[A-Za-z0-9_]+", last_user_text(body))[:40]
            return AReply(text="Summary: " + " ".join(words))
        last = body["messages"][-1]
        content = last["content"] if isinstance(last["content"], list) else []
        if content and content[0].get("type") == "tool_result":
            return AReply(thinking="The results answer it.", text="I read the code; the change is ready.")
        if "use tools" in last_user_text(body):
            n = next(self.ids)
            uses = [{"id": f"toolu_sim{n:03d}a", "name": "Read", "input": {"file_path": f"src/mod{n}.py"}}]
            if n % 2:
                uses.append({"id": f"toolu_sim{n:03d}b", "name": "Grep", "input": {"pattern": f"handler_{n}"}})
            return AReply(thinking="I should look at the file first.", tool_uses=uses)
        return AReply(thinking="Planning the next step of the parser.", text="Noted; continuing with the plan.")


def _check_pairing(messages: list[dict[str, Any]]) -> None:
    for n, message in enumerate(messages):
        content = message["content"] if isinstance(message["content"], list) else []
        if message["role"] == "assistant":
            uses = [b["id"] for b in content if b.get("type") == "tool_use"]
            after = messages[n + 1]["content"] if n + 1 < len(messages) else []
            after = after if isinstance(after, list) else []
            leading = list(itertools.takewhile(lambda b: b.get("type") == "tool_result", after))
            assert sorted(b["tool_use_id"] for b in leading) == sorted(uses), f"messages.{n}: unanswered tool uses"
            continue
        before = messages[n - 1]["content"] if n else []
        calls = {b["id"] for b in before if isinstance(b, dict) and b.get("type") == "tool_use"}
        for block in content:
            if block.get("type") == "tool_result":
                assert block["tool_use_id"] in calls, f"messages.{n}: orphan tool_result {block['tool_use_id']}"


def _marked(block: Any) -> int:
    """``cache_control`` markers on a block (a tool result's content blocks included)."""
    if not isinstance(block, dict):
        return 0
    inner = block.get("content") if block.get("type") == "tool_result" else None
    return ("cache_control" in block) + (sum(_marked(b) for b in inner) if isinstance(inner, list) else 0)


def _breakpoints(body: dict[str, Any]) -> int:
    system = body["system"] if isinstance(body.get("system"), list) else []
    found = sum(_marked(b) for b in system) + sum(_marked(t) for t in body.get("tools") or [])
    found += sum(_marked(b) for m in body["messages"] if isinstance(m["content"], list) for b in m["content"])
    return found + bool(body.get("cache_control"))


def _blocks_of(content: Any) -> list[Any]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _comparable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as the cache compares them (no breakpoints; a string is one text block), up to the one
    carrying the auto-recall block."""
    out = []
    for message in messages:
        content = _strip_hints(_blocks_of(message["content"]))
        if any(str(b.get("text", "")).startswith("<recalled_history ") for b in content):
            break
        out.append({**message, "content": content})
    return out


def _why(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> str:
    """Why ``b`` does not extend ``a``: a new summary (the first message changed), a thinking block dropped."""
    n = _common(a, b)
    if n == 0 and "<summary" in str(b[0]):
        return "summary changed"
    if n < len(b) and a[n]["role"] == "assistant":
        without = [x for x in a[n]["content"] if x.get("type") != "thinking"]
        if without == b[n]["content"]:
            return "thinking dropped"
    return f"other, at message {n}"


def _common(a: list[Any], b: list[Any]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def test_a_long_claude_code_session_stays_within_anthropics_rules_and_exports_as_sent(
    proxy_factory: Any,
    fake_anthropic_server: tuple[FakeAnthropic, str],
    fake_anthropic: FakeAnthropic,
) -> None:
    proxy = proxy_factory(lcm=LCM, models=[_native_model(fake_anthropic_server[1])])
    fake_anthropic.window = WINDOW - MAX_TOKENS
    judge = FakeAnthropic(window=WINDOW - MAX_TOKENS)  # the fake's rules, replayed on each recorded body
    model = Model()
    fake_anthropic.responder = model
    sdk = anthropic.Anthropic(base_url=proxy.url, api_key="sk-client", max_retries=0, timeout=60)
    headers = {"x-claude-code-session-id": SESSION, "anthropic-beta": BETA}

    transcript: list[dict[str, Any]] = []  # the client's messages, without breakpoints
    first_sent: list[dict[str, Any]] = []  # each message as the request that first carried it had it
    conversation: str | None = None
    forwarded: list[dict[str, Any]] = []  # the session's forwarded bodies, in order
    usage = {"input": 0, "created": 0, "read": 0}
    requests = 0
    last_sent: list[dict[str, Any]] = []

    def send() -> anthropic.types.Message:
        nonlocal conversation, requests, last_sent
        sent = [*transcript[:-1], _with_breakpoint(transcript[-1])]
        first_sent.extend(sent[len(first_sent) :])
        last_sent = sent
        before = len(fake_anthropic.requests)
        kwargs: dict[str, Any] = dict(
            model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, tools=TOOLS, thinking=THINKING, messages=sent,
            extra_headers=headers,
        )  # fmt: skip
        requests += 1
        if requests % 4 == 0:
            with sdk.messages.stream(**kwargs) as stream:
                answer = stream.get_final_message()
                got = stream.response.headers.get("x-lcm-conversation-id")
        else:
            raw = sdk.messages.with_raw_response.create(**kwargs)
            answer, got = raw.parse(), raw.headers.get("x-lcm-conversation-id")
        assert got, "no conversation id header"
        conversation = conversation or got
        assert got == conversation
        session = [r for r in fake_anthropic.requests[before:] if r.body.get("thinking")]
        assert len(session) == 1, f"request {requests}: {len(session)} session requests reached the fake"
        forwarded.append(session[0].body)
        betas = {b.strip() for b in session[0].headers.get("anthropic-beta", "").split(",") if b.strip()}
        judge.validate(session[0].body, betas)  # raises as the fake refused it
        usage["input"] += answer.usage.input_tokens
        usage["created"] += answer.usage.cache_creation_input_tokens or 0
        usage["read"] += answer.usage.cache_read_input_tokens or 0
        return answer

    for turn in range(TURNS):
        transcript.append(_user_turn(turn))
        for _round in range(3):
            answer = send()
            blocks = [b.model_dump(exclude_none=True) for b in answer.content]
            assert blocks[0]["type"] == "thinking"
            transcript.append({"role": "assistant", "content": blocks})
            uses = [b for b in blocks if b["type"] == "tool_use"]
            if not uses:
                break
            transcript.append(_tool_results(uses, turn))

    # Every forwarded request of the session, checked.
    for i, body in enumerate(forwarded):
        messages = body["messages"]
        assert count_tokens(body) <= WINDOW - MAX_TOKENS, (i, count_tokens(body))
        assert messages[0]["role"] == "user"
        assert all(a["role"] != b["role"] for a, b in itertools.pairwise(messages)), i
        _check_pairing(messages)
        assert _breakpoints(body) <= 4, i
        assert body["system"][0] == SYSTEM[0]
        assert body["system"] == SYSTEM
        assert body["tools"] == TOOLS
    compacted = [b for b in forwarded if "<summary" in str(b["messages"][0])]
    assert len(compacted) > len(forwarded) // 2, "the proxy compacted early and kept compacting"
    assert model.summaries >= 5, model.summaries

    # Prefix stability, as the cache reads it (breakpoints and string-vs-block spelling aside), up to the message
    # carrying the auto-recall block (it goes with the newest message only), and the cache share: reported.
    plain = [_comparable(b["messages"]) for b in forwarded]
    pairs = list(itertools.pairwise(plain))
    extends = sum(b[: len(a)] == a for a, b in pairs) / len(pairs)
    kept = sum(_common(a, b) / len(a) for a, b in pairs) / len(pairs)
    breaks = [_why(a, b) for a, b in pairs if b[: len(a)] != a]
    total = usage["input"] + usage["created"] + usage["read"]
    cached = usage["read"] / total
    print(
        f"\n{len(forwarded)} requests, {len(compacted)} compacted, {model.summaries} summariser calls;"
        f" requests extending the previous one: {extends:.3f}; mean share of the previous request's messages"
        f" kept as prefix: {kept:.3f}; breaks: {dict(collections.Counter(breaks))};"
        f" cache read share of input tokens: {cached:.3f}"
        f" (read {usage['read']}, written {usage['created']}, uncached {usage['input']})"
    )
    assert extends > 0.5 and kept > 0.5 and cached > 0.2
    assert set(breaks) <= {"summary changed", "thinking dropped"}

    # The export gives back the client's messages as they were sent: ``lcm-proxy export`` (the system as the
    # leading instruction, then each message as the request that first carried it had it, the newest answer
    # too), and the admin API's page, whose values stored out of line read as their ``[file_…]`` references.
    assert conversation is not None
    sent = [*first_sent, transcript[-1]]
    assert _comparable(sent) == _comparable([*last_sent, transcript[-1]])  # the same messages, spelt as first sent
    exported = asyncio.run(_export(Path(str(proxy.config.general_settings.data_dir)), conversation))
    assert exported == [{"role": "system", "content": SYSTEM}, *sent]
    page = httpx.get(f"{proxy.url}/lcm/conversations/{conversation}/messages?limit=2000", timeout=30).json()
    assert page["next"] is None
    assert len(page["data"]) == len(sent)
    for row, message in zip(page["data"], sent, strict=True):
        assert _same(row["message"], message, set(row["files"])), (row["seq"], row["message"], message)
    assert any(row["files"] for row in page["data"])  # the long tool results were stored out of line


FILE_REF = re.compile(r"\[(file_[0-9a-f]{16})\]")


def _same(stored: Any, sent: Any, files: set[str]) -> bool:
    """``stored`` (the admin API's view) is ``sent``, a value stored out of line shown as its file reference."""
    if isinstance(stored, str) and isinstance(sent, str) and (ref := FILE_REF.fullmatch(stored)):
        return ref.group(1) in files
    if isinstance(stored, dict) and isinstance(sent, dict):
        return stored.keys() == sent.keys() and all(_same(stored[k], sent[k], files) for k in stored)
    if isinstance(stored, list) and isinstance(sent, list):
        return len(stored) == len(sent) and all(_same(a, b, files) for a, b in zip(stored, sent, strict=True))
    return bool(stored == sent)


async def _export(data_dir: Path, conversation: str) -> list[dict[str, Any]]:
    store, files = Location(data_dir).stores()
    await store.open()
    try:
        return await export_conversation(store, files, None, conversation)
    finally:
        await store.close()
