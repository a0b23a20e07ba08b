"""Upstream faults, end to end: a real proxy (uvicorn, SQLite, LiteLLM) against a fake upstream scripted to fail.

The chat call's own errors are covered by ``test_upstream_errors.py``; here are the faults it leaves out (a
read timeout and a hard connection drop in the middle of a stream, a non-streamed body cut off, a failure
that recovers on the proxy's own retry) and, mainly, faults of the *summary model* while the proxy compacts
(inline, over the hard budget; in the background, over the soft threshold) and while it explores a large
pasted file or tool output. Whatever the summary model does, the client gets its answer, nothing stored is
lost or left unreachable, the fallback the design specifies is what gets stored, failures are not retried
beyond the documented escalation and call cap, and once the upstream recovers the LLM is used again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.engine.doctor import check_database
from proxy.engine.ingest import export_conversation
from proxy.engine.summarize import FALLBACK_MARKER
from proxy.store.files import FileStore
from proxy.store.sqlite.store import SQLiteStore
from tests.support.fakes import FakeUpstream, Reply, wait_for
from tests.support.proxies import UPSTREAM_KEY, RunningProxy
from tests.support.servers import serve_in_thread
from tests.support.sim import SIM_LCM, check_tool_pairing, forwarded_tokens, is_summary_request, without_recall

WINDOW = 8000
MAX_TOKENS = 400
SUMMARY_MODEL = "small"  # no summary_model configured: summaries use the request's model
HANG = 3.0  # seconds a hanging upstream waits before answering: longer than HANG_TIMEOUT
HANG_TIMEOUT = 1.0  # summary_timeout for the tests whose summary model hangs
LCM: dict[str, Any] = {**SIM_LCM, "leaf_chunk_tokens": 3000, "summary_timeout": 15.0}
EXPLORE_MARKER = "You describe documents"
LLM_EXPLORATION = "An LLM exploration: meeting notes about the launch plan."

# --- a fake upstream that can also break connections --------------------------------------------------------

BROKEN = b"\x00broken-response:"


def broken(after_events: int = 0, stall: float = 0.0) -> Reply:
    """A reply that breaks off mid-response. Not streaming: half a JSON body, then the connection closes.
    Streaming: ``after_events`` content events, then (``stall``) a silence of that many seconds before a
    proper end, or (no stall) the connection closes with the chunked body never terminated."""
    return Reply(raw_body=BROKEN + f"{after_events}:{stall}".encode())


def _event(model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


class _Broken(Response):
    def __init__(self, stream: bool, events: int, stall: float, model: str) -> None:
        super().__init__()
        self.stream, self.events, self.stall, self.model = stream, events, stall, model

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def body(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        if not self.stream:
            headers = [(b"content-type", b"application/json"), (b"content-length", b"4096")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await body(b'{"id": "chatcmpl-fake", "object": "chat.comp')
            return  # an ASGI app that returns without completing its response: uvicorn closes the connection
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await body(_event(self.model, {"role": "assistant", "content": ""}))
        for i in range(self.events):
            await body(_event(self.model, {"content": f"w{i} "}))
        if self.stall:
            await asyncio.sleep(self.stall)
            await body(_event(self.model, {}, "stop"))
            await body(b"data: [DONE]\n\n", more=False)


class FaultyUpstream(FakeUpstream):
    """``FakeUpstream`` that also plays ``broken()`` replies."""

    async def chat(self, request: Request) -> Response:
        response = await super().chat(request)
        raw = getattr(response, "body", b"")
        if isinstance(raw, bytes) and raw.startswith(BROKEN):
            body = json.loads(await request.body())
            events, stall = raw[len(BROKEN) :].decode().split(":")
            return _Broken(bool(body.get("stream")), int(events), float(stall), str(body.get("model")))
        return response


@pytest.fixture(scope="module")
def faulty_server() -> Iterator[tuple[FaultyUpstream, str]]:
    fake = FaultyUpstream()
    with serve_in_thread(fake.app) as url:
        yield fake, url


@pytest.fixture
def faulty(faulty_server: tuple[FaultyUpstream, str]) -> FaultyUpstream:
    fake, _ = faulty_server
    fake.requests.clear()
    fake.script.clear()
    fake.responder = None
    return fake


# --- the summary model and its faults ----------------------------------------------------------------------

FAULTS: dict[str, Reply] = {
    "429": Reply(status=429, error_message="Rate limit reached for requests", error_type="requests"),
    "500": Reply(status=500, error_message="The server had an error", error_type="server_error"),
    "503": Reply(status=503, error_message="Service overloaded", error_type="server_error"),
    "timeout": Reply(content="Too late.", delay=HANG),
    "drop": broken(),
    "malformed": Reply(raw_body=b'{"choices": [{"message": {"content": "Sum'),
    "empty": Reply(content=""),
    "401": Reply(status=401, error_message="Incorrect API key provided", error_type="invalid_request_error"),
    "403": Reply(status=403, error_message="Forbidden", error_type="permission_error"),
    # "overlong" echoes its whole input back (built per request)
}
TRANSIENT = ["429", "500", "503", "timeout", "drop", "malformed"]  # the call fails: no second attempt
GARBAGE = ["empty", "overlong"]  # the call answers unusably: the aggressive prompt is tried once more
ALL_FAULTS = TRANSIENT + GARBAGE


def calls_per_fallback(fault: str) -> int:
    return 2 if fault in GARBAGE else 1


def lcm_for(fault: str | None, **extra: Any) -> dict[str, Any]:
    return {**LCM, **({"summary_timeout": HANG_TIMEOUT} if fault == "timeout" else {}), **extra}


@dataclass
class Model:
    """The fake upstream's brain: numbered chat answers; summaries and explorations that fail as scripted
    (``fault`` while set; with ``fail_next``, only that many more calls fail)."""

    fault: str | None = None
    fail_next: int | None = None
    summary_calls: list[str] = field(default_factory=list)  # "leaf" | "condensed" | "explore", in order
    systems: list[str] = field(default_factory=list)  # the system prompt of each summary call
    tasks: list[str] = field(default_factory=list)  # the task closing each summary call's user message
    chat_calls: int = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not is_summary_request(body):
            self.chat_calls += 1
            return Reply(content=f"Answer {self.chat_calls}.")
        system = str(body["messages"][0]["content"])
        explore = system.startswith(EXPLORE_MARKER)
        self.summary_calls.append("explore" if explore else "condensed" if system.startswith("You merge") else "leaf")
        self.systems.append(system)
        source = str(body["messages"][-1]["content"])
        self.tasks.append(source.rsplit("\n\n", 1)[-1])
        if self.fault is not None and (self.fail_next is None or self.fail_next > 0):
            if self.fail_next is not None:
                self.fail_next -= 1
            if self.fault == "overlong":
                return Reply(content=source + " And more." * 50)
            return FAULTS[self.fault]
        if explore:
            return Reply(content=LLM_EXPLORATION)
        return Reply(content="LLM summary: " + " ".join(re.findall(r"[A-Za-z0-9_]+", source)[:40]))


# --- the client side -----------------------------------------------------------------------------------------


def start(
    proxy_factory: Any, url: str, lcm: dict[str, Any], litellm: dict[str, Any] | None = None, **general: Any
) -> RunningProxy:
    model = {
        "model_name": "small",
        "litellm_params": {
            "model": "openai/small",
            "api_base": f"{url}/v1",
            "api_key": UPSTREAM_KEY,
            **(litellm or {}),
        },
        # The histories below are sized in o200k tokens (over the soft threshold, under the budget): no margin.
        "model_info": {"max_input_tokens": WINDOW, "token_margin": 1.0},
    }
    return proxy_factory(lcm=lcm, models=[model], **general)  # type: ignore[no-any-return]


def turns(first: int, count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(first, first + count):
        out.append({"role": "user", "content": f"Question {i}: " + "tell me more about the design of the system. " * 8})
        out.append(
            {"role": "assistant", "content": f"Answer {i}: " + "the design has several layers and invariants. " * 8}
        )
    return out


def history(count: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Be helpful."}, *turns(0, count), {"role": "user", "content": "What now?"}]


def notes(tag: str) -> str:
    """Free text of ~3,200 tokens: over large_file_token_threshold, so it is stored and explored by the LLM."""
    return "".join(f"Meeting {tag} note {i}: Alice and Bob went over the launch plan, item {i}.\n" for i in range(200))


def post(proxy: RunningProxy, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{proxy.base_url}/chat/completions",
        json={"model": "small", "messages": messages, "max_tokens": MAX_TOKENS, **extra},
        timeout=60,
    )


class Background:
    """Counts the proxy's finished background compactions: its ``after_response`` also awaits the sweep."""

    def __init__(self, proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch) -> None:
        engine = proxy.app.state.lcm.engine
        original = engine.after_response
        self.scheduled = 0
        self.finished = 0

        async def after_response(prepared: Any, summarizer: Any) -> bool:
            started: bool = await original(prepared, summarizer)
            await engine.wait_idle()
            self.finished += 1
            return started

        monkeypatch.setattr(engine, "after_response", after_response)

    def settle(self, response: httpx.Response) -> None:
        """Wait for the background compaction this response scheduled, if any."""
        if response.headers.get("x-lcm-compaction") == "scheduled":
            self.scheduled += 1
        assert wait_for(lambda: self.finished >= self.scheduled, timeout=30)


@dataclass
class Stored:
    exported: list[dict[str, Any]]
    unreachable: set[int]
    problems: list[str]
    summaries: list[dict[str, Any]]  # every summary of the conversation, oldest first
    files: list[dict[str, Any]]  # every stored file, oldest first


def inspect(proxy: RunningProxy, conversation_id: str) -> Stored:
    """Read the proxy's database from outside while it runs (WAL: other connections are plain readers)."""
    data_dir = Path(str(proxy.config.general_settings.data_dir))

    def rows(sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with contextlib.closing(sqlite3.connect(f"file:{data_dir / 'lcm.sqlite3'}?mode=ro", uri=True)) as conn:
            conn.row_factory = sqlite3.Row
            return [dict(row) for row in conn.execute(sql, args)]

    async def unreachable(store: SQLiteStore) -> set[int]:
        """Stored messages the active context does not reach through the summary DAG."""
        q = store.read
        conversation = await q.conversation(None, conversation_id)
        assert conversation is not None
        seqs = {m.seq for m in await q.messages(conversation_id)}
        reached = {seq for seq in seqs if seq >= conversation.summarized_upto}
        stack = await q.context_summaries(conversation_id)
        while stack:
            summary = stack.pop()
            stack += await q.child_summaries(summary.id)
            reached |= {m.seq for m in await q.source_messages(summary.id)}
        return seqs - reached

    async def read() -> Stored:
        store = SQLiteStore(data_dir)
        await store.open()
        files = FileStore(data_dir)
        try:
            return Stored(
                exported=await export_conversation(store, files, None, conversation_id),
                unreachable=await unreachable(store),
                problems=await check_database(store, files),
                summaries=[],
                files=[],
            )
        finally:
            await store.close()

    stored = asyncio.run(read())
    stored.summaries = rows(
        "SELECT id, kind, depth, start_seq, end_seq, escalation, summarizer_model, content, token_count"
        " FROM summaries WHERE conversation_id = ? ORDER BY pk",
        (conversation_id,),
    )
    stored.files = rows("SELECT id, kind, name, exploration FROM files ORDER BY created_at")
    return stored


@dataclass
class Session:
    """One client conversation: re-sends its whole transcript each time and appends the answers."""

    proxy: RunningProxy
    fake: FaultyUpstream
    model: Model
    background: Background
    transcript: list[dict[str, Any]]
    conversation_id: str = ""
    headers: list[str] = field(default_factory=list)  # x-lcm-compaction of each response

    def send(self, *new: dict[str, Any]) -> dict[str, Any]:
        """Send the transcript (plus ``new``); the client gets the chat model's answer. Returns the forwarded body."""
        self.transcript += new
        before = len(self.fake.requests)
        response = post(self.proxy, self.transcript)
        assert response.status_code == 200, response.text
        message = response.json()["choices"][0]["message"]
        assert message["content"] == f"Answer {self.model.chat_calls}."
        self.transcript.append({"role": "assistant", "content": message["content"]})
        self.conversation_id = self.conversation_id or response.headers["x-lcm-conversation-id"]
        assert response.headers["x-lcm-conversation-id"] == self.conversation_id
        self.headers.append(response.headers["x-lcm-compaction"])
        self.background.settle(response)
        chats = [r.body for r in self.fake.requests[before:] if not is_summary_request(r.body)]
        assert len(chats) == 1
        sent = chats[0]
        # Bounded, tools paired, instructions first.
        assert forwarded_tokens(sent) + MAX_TOKENS <= WINDOW
        check_tool_pairing(sent["messages"])
        assert sent["messages"][0] == self.transcript[0]
        return sent

    def stored(self) -> Stored:
        return inspect(self.proxy, self.conversation_id)

    def check_intact(self) -> Stored:
        """Doctor passes, export is exactly what the client sent and was answered (the last answer, which the
        client has not sent back yet, was stored as the proxy relayed it), and the summary DAG reaches every
        stored message."""
        stored = self.stored()
        assert stored.problems == []
        assert stored.exported == self.transcript
        assert stored.unreachable == set()
        return stored


@pytest.fixture
def session(
    proxy_factory: Any,
    faulty_server: tuple[FaultyUpstream, str],
    faulty: FaultyUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., Session]:
    def open_session(model: Model, lcm: dict[str, Any], transcript: list[dict[str, Any]], **general: Any) -> Session:
        faulty.responder = model
        proxy = start(proxy_factory, faulty_server[1], lcm, **general)
        return Session(proxy, faulty, model, Background(proxy, monkeypatch), transcript)

    return open_session


def is_summary(message: dict[str, Any]) -> bool:
    return str(message.get("content", "")).startswith('<summary id="sum_')


def assert_fallback(summary: dict[str, Any]) -> None:
    """What the design stores when the summary model fails: a bounded, marked deterministic truncation."""
    assert summary["escalation"] == 2 and summary["summarizer_model"] is None
    assert summary["content"].endswith(FALLBACK_MARKER)
    assert summary["token_count"] <= LCM["fallback_max_tokens"]
    assert "LLM summary" not in summary["content"] and "And more." not in summary["content"]


def assert_llm(summary: dict[str, Any], escalation: int = 0) -> None:
    assert summary["escalation"] == escalation and summary["summarizer_model"] == SUMMARY_MODEL
    assert summary["content"].startswith("LLM summary: ")


# --- (a) inline compaction, over the hard budget ------------------------------------------------------------


@pytest.mark.parametrize("fault", ALL_FAULTS)
def test_inline_compaction_falls_back_when_the_summary_model_fails(session: Callable[..., Session], fault: str) -> None:
    s = session(Model(fault=fault), lcm_for(fault), history(60))  # ~10k tokens for a 7k message budget
    sent = s.send()
    assert s.headers == ["inline"]  # the fallbacks alone brought it under the budget: nothing evicted
    assert is_summary(sent["messages"][1]) and without_recall(sent["messages"][-1]) == s.transcript[-2]
    stored = s.stored()
    assert len(stored.summaries) >= 2
    for summary in stored.summaries:
        assert_fallback(summary)
        assert summary["content"] in sent["messages"][1]["content"]  # forwarded as stored, in one message
    # No retry beyond the escalation: one call per summary, two when the answer was unusable.
    assert s.model.summary_calls == ["leaf"] * (len(stored.summaries) * calls_per_fallback(fault))
    # The conversation goes on from the fallback summaries.
    sent = s.send({"role": "user", "content": "And then?"})
    assert is_summary(sent["messages"][1]) and without_recall(sent["messages"][-1]) == s.transcript[-2]
    s.check_intact()


# --- (b) background compaction, over the soft threshold ---------------------------------------------------


@pytest.mark.parametrize("fault", ALL_FAULTS)
def test_background_compaction_falls_back_when_the_summary_model_fails(
    session: Callable[..., Session], fault: str
) -> None:
    s = session(Model(fault=fault), lcm_for(fault), history(36))  # over the soft threshold, under the budget
    sent = s.send()
    assert s.headers == ["scheduled"]
    assert sent["messages"] == s.transcript[:-1]  # this request itself went out unchanged
    stored = s.stored()
    # The sweep summarises the oldest messages until the context is back under its target, fallbacks or not.
    assert [x["kind"] for x in stored.summaries] == ["leaf"] * len(stored.summaries) and len(stored.summaries) >= 1
    sent_count = len(s.transcript) - 2  # the instructions and the answer are not stored messages
    assert 0 < stored.summaries[-1]["end_seq"] <= sent_count - LCM["fresh_tail_count"]
    for summary in stored.summaries:
        assert_fallback(summary)
    assert s.model.summary_calls == ["leaf"] * (len(stored.summaries) * calls_per_fallback(fault))
    # The next request finds the smaller context, built from the fallbacks.
    sent = s.send({"role": "user", "content": "And then?"})
    assert s.headers[-1] == "none"
    forwarded = [m["content"] for m in sent["messages"] if is_summary(m)]
    assert len(forwarded) == 1  # all summaries in one message
    assert all(x["content"] in forwarded[0] for x in stored.summaries)
    s.check_intact()


# --- (c) exploration summaries of large pasted files and tool outputs ---------------------------------------


def paste(tag: str) -> dict[str, Any]:
    return {"role": "user", "content": f'Please read <file name="notes-{tag}.txt">{notes(tag)}</file> and advise.'}


def tool_exchange(tag: str) -> list[dict[str, Any]]:
    call = {"id": f"call_{tag}", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "n"}'}}
    return [
        {"role": "user", "content": "Read my notes file."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{tag}", "content": notes(tag)},
    ]


def exploration_in(message: dict[str, Any]) -> str:
    content = str(message["content"])
    assert "[LCM File: file_" in content or "[LCM Tool Output: file_" in content, content[:200]
    return content.split("Exploration Summary:\n", 1)[1].split("\n(Stored out of line by lcm-proxy.", 1)[0]


@pytest.mark.parametrize("fault", [None, "500"])
def test_a_tool_output_is_described_from_its_own_lines_never_by_the_summary_model(
    session: Callable[..., Session], fault: str | None
) -> None:
    """An agent's tool outputs come by the dozen: describing each with the summary model would cost a call with
    the whole output as input. They get the deterministic excerpts, healthy model or not."""
    s = session(Model(fault=fault), lcm_for(fault or "500"), [{"role": "system", "content": "Be helpful."}])
    sent = s.send(*tool_exchange("A"))
    exploration = exploration_in(sent["messages"][-1])
    assert exploration.startswith("Kind: text (excerpts)") and "Meeting A note 0" in exploration
    assert s.model.summary_calls == []
    assert [f["exploration"].strip() for f in s.stored().files] == [exploration]  # forwarded = stored


@pytest.mark.parametrize("fault", [*ALL_FAULTS, "401"])
def test_exploration_falls_back_when_the_summary_model_fails(session: Callable[..., Session], fault: str) -> None:
    first = [paste("A")]
    s = session(Model(fault=fault), lcm_for(fault), [{"role": "system", "content": "Be helpful."}, *first])
    sent = s.send()
    exploration = exploration_in(sent["messages"][-1])
    assert exploration.startswith("Kind: text (excerpts)") and "Meeting A note 0" in exploration
    assert LLM_EXPLORATION not in exploration and "And more." not in exploration
    assert s.model.summary_calls == ["explore"]  # one attempt, no retry on the request path
    stored = s.stored()
    assert [f["exploration"].strip() for f in stored.files] == [exploration]  # forwarded = stored
    # The upstream recovers: the next new file gets an LLM exploration; the first keeps its stub unchanged.
    s.model.fault = None
    resent = s.send(paste("B"))
    assert resent["messages"][: len(sent["messages"])] == sent["messages"]  # prefix stable
    assert exploration_in(resent["messages"][-1]) == f"Kind: text (LLM summary)\n{LLM_EXPLORATION}"
    assert s.model.summary_calls == ["explore", "explore"]
    assert s.headers == ["none", "none"]
    stored = s.check_intact()  # the pastes are restored exactly on export
    assert stored.summaries == []


# --- faults that flip, breaker, call cap, deadline ---------------------------------------------------------


@pytest.mark.parametrize(("fault", "escalation"), [("500", 2), ("timeout", 2), ("drop", 2), ("empty", 1)])
def test_fault_that_clears_mid_sweep(session: Callable[..., Session], fault: str, escalation: int) -> None:
    """Only the first summarizer call fails: that summary falls back (or, for an empty answer, the aggressive
    prompt succeeds), and the same sweep's next summary uses the LLM."""
    s = session(Model(fault=fault, fail_next=1), lcm_for(fault), history(60))
    s.send()
    assert s.headers == ["inline"]
    first, *rest = s.stored().summaries
    if escalation == 2:
        assert_fallback(first)
        assert s.model.summary_calls == ["leaf"] * (1 + len(rest))
    else:
        assert_llm(first, escalation=1)
        assert "Be brief" in s.model.tasks[1] and "Be brief" not in s.model.tasks[0]
        assert s.model.summary_calls == ["leaf"] * (2 + len(rest))
    assert rest
    for summary in rest:
        assert_llm(summary)
    s.send({"role": "user", "content": "And then?"})
    s.check_intact()


@pytest.mark.parametrize("mode", ["inline", "background"])
def test_llm_is_used_again_once_the_upstream_recovers(session: Callable[..., Session], mode: str) -> None:
    n = 60 if mode == "inline" else 36
    s = session(Model(fault="503"), LCM, history(n))
    s.send()
    outage = s.stored().summaries
    assert outage and all(x["escalation"] == 2 for x in outage)
    calls = len(s.model.summary_calls)
    assert calls == len(outage)
    s.model.fault = None
    # Enough new turns to be over the context again (a sweep stops at half of it) or, background, only over the
    # soft threshold.
    s.send(*turns(n, 30 if mode == "inline" else 27), {"role": "user", "content": "Next?"})
    assert s.headers == ["inline", "inline"] if mode == "inline" else ["scheduled", "scheduled"]
    stored = s.check_intact()
    assert stored.summaries[: len(outage)] == outage  # the fallbacks stay what they were (and linked)
    fresh = stored.summaries[len(outage) :]
    assert fresh
    for summary in fresh:
        assert_llm(summary)
    assert len(s.model.summary_calls) == calls + len(fresh)  # every call after recovery made one good summary


@pytest.mark.parametrize("fault", ["401", "403"])
def test_auth_failure_opens_the_breaker_and_evicts(session: Callable[..., Session], fault: str) -> None:
    """A refused key writes no summary (a fallback would replace history for good) and opens the breaker:
    the burst of over-budget requests that follows makes no further summarizer call, and still gets answers."""
    s = session(Model(fault=fault), LCM, history(60))
    sent = s.send()
    assert s.headers == ["evicted"] and not any(is_summary(m) for m in sent["messages"])
    assert sent["messages"][-1] == s.transcript[-2]
    for i in range(3):
        s.send({"role": "user", "content": f"Still there {i}?"})
    assert s.headers == ["evicted"] * 4
    assert s.model.summary_calls == ["leaf"]
    assert s.check_intact().summaries == []
    # The breaker's five minutes pass and the key works again: compaction uses the LLM.
    guard = s.proxy.app.state.lcm.engine.guard
    assert guard.breaker_open(SUMMARY_MODEL)
    guard.open_until.clear()
    s.model.fault = None
    sent = s.send({"role": "user", "content": "And now?"})
    assert s.headers[-1] == "inline" and is_summary(sent["messages"][1])
    stored = s.check_intact()
    assert stored.summaries and len(s.model.summary_calls) == 1 + len(stored.summaries)
    for summary in stored.summaries:
        assert_llm(summary)


@pytest.mark.parametrize("fault", ["500", "empty"])
def test_call_cap_bounds_a_burst_of_failures(session: Callable[..., Session], fault: str) -> None:
    cap = 3
    s = session(Model(fault=fault), lcm_for(fault, max_summarizer_calls_per_hour=cap), history(60))
    s.send()
    s.send(*turns(60, 30), {"role": "user", "content": "More?"})  # over the context again: a sweep stops at half
    assert len(s.model.summary_calls) == cap  # the cap, not the number of summaries, bounds the calls
    s.model.fault = None  # recovered, but this conversation's budget for the hour is spent
    s.send(*turns(80, 30), {"role": "user", "content": "Even more?"})
    # (The third request may find the context already condensed below its limit: it is then only scheduled.)
    assert s.headers[:2] == ["inline", "inline"] and s.headers[2] in ("inline", "scheduled")
    assert len(s.model.summary_calls) == cap
    stored = s.check_intact()
    assert len(stored.summaries) > cap
    for summary in stored.summaries:
        assert_fallback(summary)


def test_sweep_deadline_bounds_a_hanging_summary_model(session: Callable[..., Session]) -> None:
    """With a hanging summary model an inline sweep stops at its deadline (after the pass under way), keeps
    what it made, and the request is answered from an evicted view instead of waiting for more passes."""
    s = session(Model(fault="timeout"), lcm_for("timeout", sweep_deadline_seconds=0.5), history(60))
    sent = s.send()
    assert s.model.summary_calls == ["leaf"]
    assert s.headers == ["evicted"] and sent["messages"][-1] == s.transcript[-2]
    (fallback,) = s.stored().summaries
    assert_fallback(fallback)
    # The next over-budget request tries the (now recovered) summary model again.
    s.model.fault = None
    sent = s.send({"role": "user", "content": "And then?"})
    assert s.headers[-1] == "inline" and is_summary(sent["messages"][1])
    first, *rest = s.check_intact().summaries
    assert first == fallback and rest
    for summary in rest:
        assert_llm(summary)


def test_nothing_fits_is_context_length_exceeded_without_summary_calls(session: Callable[..., Session]) -> None:
    """The one documented failure: a newest user message that cannot fit is refused before any upstream call,
    so a broken summary model is never even asked, and what the client sent is stored unchanged."""
    s = session(Model(fault="500"), LCM, [])
    chunk = "word " * 2000  # each message under the huge-paste threshold, together over the window
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": chunk} for i in range(5)]
    response = post(s.proxy, messages, max_tokens=7000)  # leaves 1,000 tokens for a 2,000-token message
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "newest user message" in error["message"]
    assert s.fake.requests == []  # neither a summarizer call nor a doomed chat call
    (conversation,) = httpx.get(f"{s.proxy.url}/lcm/conversations").json()["data"]
    stored = inspect(s.proxy, conversation["id"])
    assert stored.exported == messages and stored.summaries == [] and stored.problems == []


# --- chat-path faults that test_upstream_errors.py does not cover -----------------------------------------


def stream_events(proxy: RunningProxy, messages: list[dict[str, Any]]) -> tuple[int, list[Any]]:
    body = {"model": "small", "messages": messages, "stream": True}
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=body, timeout=30) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
        return response.status_code, [e if e == "[DONE]" else json.loads(e) for e in events]


@pytest.mark.parametrize(
    ("stall", "code"), [(HANG, "upstream_timeout"), (0.0, "upstream_stream_truncated")], ids=["read_timeout", "drop"]
)
def test_chat_stream_broken_midway_ends_with_an_error_event(
    proxy_factory: Any, faulty_server: tuple[FaultyUpstream, str], faulty: FaultyUpstream, stall: float, code: str
) -> None:
    proxy = start(proxy_factory, faulty_server[1], LCM, {"timeout": 1.0})
    faulty.enqueue(broken(after_events=3, stall=stall))
    status, events = stream_events(proxy, [{"role": "user", "content": "hi"}])
    assert status == 200
    assert "[DONE]" not in events
    chunks = [e for e in events[:-1] if e.get("choices")]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "w0 w1 w2 "
    assert not any(c["choices"][0].get("finish_reason") for c in chunks)  # no fabricated clean finish
    error = events[-1]["error"]
    assert error["code"] == code and error["type"] == "upstream_error"
    assert UPSTREAM_KEY not in json.dumps(events)


def test_chat_body_cut_off_is_a_bad_gateway_and_the_retry_adds_nothing(
    proxy_factory: Any, faulty_server: tuple[FaultyUpstream, str], faulty: FaultyUpstream
) -> None:
    proxy = start(proxy_factory, faulty_server[1], LCM)
    faulty.enqueue(broken(), Reply(content="Second try."))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    response = post(proxy, messages)
    assert response.status_code == 502, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert response.headers.get("x-should-retry") != "false"  # SDKs may retry a 502, and that is safe:
    response = post(proxy, messages)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "Second try."
    stored = inspect(proxy, response.headers["x-lcm-conversation-id"])
    # The messages stored once, not twice, and only the answer the client received (the 502 stored none).
    assert stored.exported == [*messages, {"role": "assistant", "content": "Second try."}] and stored.problems == []


# (A stream cut after its first chunk is past the point where the proxy may retry: see the test above.)
@pytest.mark.parametrize(
    ("fault", "stream"),
    [
        ("429", False),
        ("503", False),
        ("timeout", False),
        ("drop", False),
        ("429", True),
        ("503", True),
        ("timeout", True),
    ],
)
def test_chat_fault_recovers_on_the_proxys_retry(
    proxy_factory: Any, faulty_server: tuple[FaultyUpstream, str], faulty: FaultyUpstream, fault: str, stream: bool
) -> None:
    """``upstream_retries: 1``: the first chat call fails before any byte reached the client, the retry works."""
    proxy = start(proxy_factory, faulty_server[1], LCM, {"timeout": 1.0}, upstream_retries=1)
    faulty.enqueue(FAULTS[fault], Reply(content="Recovered answer."))
    messages = [{"role": "user", "content": "hi"}]
    if stream:
        status, events = stream_events(proxy, messages)
        assert status == 200 and events[-1] == "[DONE]"
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e.get("choices"))
    else:
        response = post(proxy, messages)
        assert response.status_code == 200, response.text
        text = response.json()["choices"][0]["message"]["content"]
    assert text == "Recovered answer."
    assert len(faulty.requests) == 2
