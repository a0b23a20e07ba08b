"""Codex itself (the pinned npm release) through the Responses door, against the strict fake Responses API
(native) and the fake OpenAI-compatible upstream (translated): a session with a tool call in a window small enough
that the proxy compacts; then Codex's own compactions, local and remote, answered by the proxy: a fact that only
the assistant stated in turn 1 is still in the forwarded context when a later turn asks for it.

Each turn is a real ``codex exec`` process (``tests.support.codex``); slow, so marked so."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.codex import MODEL, CodexClient, require_codex
from tests.support.fake_responses import FakeResponses, RReply
from tests.support.fakes import FakeUpstream, Reply

pytestmark = pytest.mark.slow

FACT = "Noted. The vault code is ZEBRA-9."  # said by the assistant only
RULE = "RULE-MARKER-7731: always answer in French."
NOTES = "The notes say: bring an umbrella."
# ~600 tokens a turn, below the size at which a user's text is stored as a pasted file.
FILLER = " ".join(f"Point {i}: the design notes discuss caching layer number {i} briefly." for i in range(40))
COMPACTION_PROMPT = "CONTEXT CHECKPOINT COMPACTION"


def models(kind: str, responses_url: str, upstream_url: str, window: int) -> list[dict[str, Any]]:
    if kind == "native":
        params = {"model": f"openai/responses/{MODEL}", "api_base": f"{responses_url}/v1", "api_key": "sk-up"}
    else:
        params = {"model": "openai/fake-model", "api_base": f"{upstream_url}/v1", "api_key": "sk-local"}
    info = {"max_input_tokens": window, "supports_function_calling": True}
    return [{"model_name": MODEL, "litellm_params": params, "model_info": info}]


def _rows(proxy: Any, sql: str) -> list[Any]:
    with sqlite3.connect(proxy.config.general_settings.location().describe()) as conn:
        return conn.execute(sql).fetchall()


def assert_paired(messages: list[dict[str, Any]]) -> None:
    """Every tool message answers a call of the assistant message before it, and every call is answered."""
    open_calls: set[str] = set()
    for message in messages:
        if message.get("role") == "tool":
            assert message["tool_call_id"] in open_calls, message
            open_calls.discard(message["tool_call_id"])
            continue
        assert not open_calls, (open_calls, message)
        open_calls = {c["id"] for c in message.get("tool_calls") or []}


class Model:
    """The scripted model behind either fake: turn 1 states the fact, a request to read the notes calls the shell
    tool once, a "BIG" turn reports a context past Codex's compaction limit."""

    def __init__(self) -> None:
        self.called = False

    def decide(self, last_user: str, after_tool: bool) -> tuple[str | None, bool, int]:
        """(text, call the tool, reported input tokens)."""
        if "USER-1" in last_user and not after_tool:
            return FACT, False, 1000
        if "read notes.txt" in last_user and not after_tool and not self.called:
            self.called = True
            return None, True, 1000
        return "D'accord.", False, (30_000 if "BIG" in last_user else 1000)

    def chat(self, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        users = [m for m in messages if m.get("role") == "user"]
        last = str(users[-1].get("content")) if users else ""
        text, call, used = self.decide(last, messages[-1].get("role") == "tool")
        usage = {"prompt_tokens": used, "completion_tokens": 5, "total_tokens": used + 5}
        if call:
            fn = {"name": "exec_command", "arguments": json.dumps({"cmd": "cat notes.txt"})}
            return Reply(content=None, tool_calls=[{"id": "call_sh1", "type": "function", "function": fn}], usage=usage)
        return Reply(content=text, usage=usage)

    def responses(self, body: dict[str, Any]) -> RReply:
        items = body["input"]
        users = [i for i in items if i.get("type", "message") == "message" and i.get("role") == "user"]
        last = json.dumps(users[-1].get("content")) if users else ""
        text, call, used = self.decide(last, items[-1].get("type") == "function_call_output")
        # Every answer opens with a reasoning item: Codex replays it, and the strict fake checks its signature.
        if call:
            return RReply(
                function_calls=[{"name": "exec_command", "arguments": json.dumps({"cmd": "cat notes.txt"})}],
                usage={"input_tokens": used}, reasoning="the notes are in notes.txt",
            )  # fmt: skip
        return RReply(text=text or "", usage={"input_tokens": used}, reasoning="considering the request")


def forwarded(kind: str, fake_responses: FakeResponses, fake_upstream: FakeUpstream) -> list[str]:
    """Codex's turns as the upstream received them (not the proxy's summariser calls), as JSON text."""
    if kind == "native":
        return [json.dumps(r.body["input"]) for r in fake_responses.requests]
    return [json.dumps(r.body["messages"]) for r in fake_upstream.requests if r.body.get("tools")]


def start(
    kind: str, proxy_factory: Any, servers: tuple[str, str], fakes: tuple[FakeResponses, FakeUpstream], **lcm: Any
) -> Any:
    window = lcm.pop("window", 200_000)
    model = Model()
    fakes[0].responder = model.responses
    fakes[1].responder = model.chat
    return proxy_factory(lcm=lcm or None, models=models(kind, servers[0], servers[1], window))


@pytest.mark.parametrize("kind", ["native", "translated"])
def test_codex_runs_a_session_with_a_tool_call_in_a_window_the_proxy_compacts(
    proxy_factory: Any,
    fake_responses_server: tuple[FakeResponses, str],
    fake_responses: FakeResponses,
    fake_upstream: FakeUpstream,
    upstream_url: str,
    tmp_path: Path,
    kind: str,
) -> None:
    window = 16_000  # Codex's instructions and tools are ~10k tokens: a few long turns fill the rest
    fake_responses.window = window  # every forwarded request must fit the model's window
    proxy = start(
        kind, proxy_factory, (fake_responses_server[1], upstream_url), (fake_responses, fake_upstream),
        window=window, fresh_tail_count=4, leaf_chunk_tokens=1500,
    )  # fmt: skip
    codex = CodexClient(require_codex(), tmp_path, f"{proxy.url}/v1", agents_md=f"# Project rules\n\n{RULE}\n")
    codex.setup()
    (codex.cwd / "notes.txt").write_text(NOTES + "\n")
    done = codex.exec(f"USER-1: hello. {FILLER}")
    assert done.returncode == 0, done.stderr[-3000:]
    done = codex.resume("Now read notes.txt, please.")
    assert done.returncode == 0, done.stderr[-3000:]
    for i in range(7):
        done = codex.resume(f"Turn {i + 2}. More notes to keep in mind: {FILLER}")
        assert done.returncode == 0, done.stderr[-3000:]
    done = codex.resume("What vault code did you tell me at the very start?")
    assert done.returncode == 0, done.stderr[-3000:]
    texts = forwarded(kind, fake_responses, fake_upstream)
    assert len(texts) >= 11  # ten turns, the second a tool round trip
    assert any(NOTES in t for t in texts), "the shell tool's output reached the upstream"
    assert all(RULE in t for t in texts), "AGENTS.md is in every forwarded request"
    if kind == "native":  # reasoning items went back as issued (the strict fake checks their signatures)
        assert any('"type": "reasoning"' in t and "encrypted_content" in t for t in texts)
    assert len(_rows(proxy, "SELECT id FROM conversations")) == 1  # one conversation
    assert _rows(proxy, "SELECT count(*) FROM summaries")[0][0] > 0  # the proxy compacted
    if kind == "translated":  # the strict fake checks these itself for the native kind
        for request in (r for r in fake_upstream.requests if r.body.get("tools")):
            assert_paired(request.body["messages"])
            assert len(json.dumps([request.body["messages"], request.body["tools"]])) // 4 <= window
    assert "ZEBRA-9" in texts[-1]  # a summary, the tail or a recalled excerpt carries the assistant's fact


@pytest.mark.parametrize(
    ("kind", "provider"), [("native", "OpenAI"), ("native", "lcm"), ("translated", "OpenAI"), ("translated", "lcm")]
)
def test_codexs_own_compactions_are_answered_by_the_proxy_and_lose_nothing(
    proxy_factory: Any,
    fake_responses_server: tuple[FakeResponses, str],
    fake_responses: FakeResponses,
    fake_upstream: FakeUpstream,
    upstream_url: str,
    tmp_path: Path,
    kind: str,
    provider: str,
) -> None:
    """``model_auto_compact_token_limit`` below what the upstream reports after a "BIG" turn: Codex compacts
    before the next turn, remotely with a provider named OpenAI, else locally. The proxy answers both itself."""
    proxy = start(kind, proxy_factory, (fake_responses_server[1], upstream_url), (fake_responses, fake_upstream))
    codex = CodexClient(
        require_codex(), tmp_path, f"{proxy.url}/v1", provider_name=provider, auto_compact_limit=20_000,
        agents_md=f"# Project rules\n\n{RULE}\n",
    ).setup()  # fmt: skip
    (codex.cwd / "notes.txt").write_text(NOTES + "\n")
    prompts = [
        "USER-1: hello",
        "USER-2: read notes.txt",
        "USER-3: BIG turn",
        "USER-4: what vault code did you tell me?",
    ]
    prompts += ["USER-5: BIG again", "USER-6: and what did the notes say?"]
    for i, prompt in enumerate(prompts):
        done = codex.exec(prompt) if i == 0 else codex.resume(prompt)
        assert done.returncode == 0, done.stderr[-3000:]
    checkpoints = _rows(proxy, "SELECT conversation_id, position FROM responses WHERE kind = 'checkpoint'")
    assert len(checkpoints) == 2, checkpoints  # Codex compacted twice, each answered by the proxy
    texts = forwarded(kind, fake_responses, fake_upstream)
    # Neither Codex's compaction request nor the proxy's handle or marker ever reached the model.
    assert not any(COMPACTION_PROMPT in t or '"type": "compaction' in t or "lcm_ckpt_" in t for t in texts)
    asked_fact = next(t for t in texts if "USER-4" in t and "USER-5" not in t)
    assert FACT in asked_fact  # the assistant's own words of turn 1, put back after Codex compacted them away
    assert FACT in texts[-1] and NOTES in texts[-1]  # and again after the second compaction, the tool's output too
    assert all(RULE in t for t in texts)
    conversations = _rows(proxy, "SELECT id, parent_id, fork_seq, continued, message_count FROM conversations")
    assert len(conversations) == 1, conversations


def test_codex_applies_a_patch_through_a_chat_upstream(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, tmp_path: Path
) -> None:
    """Codex's apply_patch is a custom tool (free-form grammar input): a chat upstream calls it as a function with
    one string, Codex gets a ``custom_tool_call``, edits the file, and its output comes back paired."""
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hello from the patch\n*** End Patch\n"

    def answer(body: dict[str, Any]) -> Reply:
        if body["messages"][-1].get("role") == "tool":
            return Reply(content="Patched.")
        names = [t["function"]["name"] for t in body.get("tools") or []]
        assert "apply_patch" in names, names
        fn = {"name": "apply_patch", "arguments": json.dumps({"input": patch})}
        return Reply(content=None, tool_calls=[{"id": "call_patch1", "type": "function", "function": fn}])

    fake_upstream.responder = answer
    proxy = proxy_factory(models=models("translated", "http://127.0.0.1:9", upstream_url, 200_000))
    codex = CodexClient(require_codex(), tmp_path, f"{proxy.url}/v1").setup()
    done = codex.exec("create hello.txt")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (codex.cwd / "hello.txt").read_text() == "hello from the patch\n"
    last = fake_upstream.requests[-1].body["messages"]
    assert last[-2]["tool_calls"][0]["id"] == "call_patch1"
    assert last[-1]["role"] == "tool" and last[-1]["tool_call_id"] == "call_patch1"
