"""Load run: many concurrent clients over a few shared conversations, then a message-by-message audit.

``python -m bench load``: 64 clients over 20 conversations, a few thousand requests: SQLite with one and two
proxy worker processes, then PostgreSQL with one, two and three proxy replicas, and three with one of them
SIGKILLed mid-run. ``python -m bench load --replicas 3 --database postgresql://...`` runs only the PostgreSQL
rows (three replicas, then three with one killed) on that server. ``run_load`` is what tests/test_load.py and
tests/store/test_replicas.py run at a bounded size.

Setup: the real proxy process (``python -m proxy serve``) in front of a fake upstream process (this module's
``upstream`` entry point: tests/support/fakes.py's FakeUpstream with a scripted model that answers chat turns,
calls the client's tools when told to, writes short summaries and document descriptions), on loopback. The
model's context window (``model_info.max_input_tokens``) is small and the soft threshold close to it, so
background and inline compaction, leaf and condensed summaries, tool-result stubs and file interception all
happen during the run.

Sharing model. Each conversation has a shared opening (a system prompt and three messages); the clients are
dealt over the conversations round-robin (64 over 20: three or four each). Every client first sends the
opening itself, so the first requests of a conversation race to create it; then each client continues its
*own branch* from the opening, like several chat tabs (or devices) that branched one conversation. This is
the model under which all clients are truly in flight at once: clients of one conversation taking turns
would serialise them (20 in flight at most) and never exercise the identity rules under contention. Per the
identity rules the first branch to extend the opening appends to the stored conversation, every other branch
forks it, and from then on each branch is found by its longest stored prefix. Clients behave like real
ones: half of their requests stream (they hang up right after ``[DONE]``); they send their tool schemas
every time and answer the model's tool calls (some results large enough to be stubbed); they sometimes
paste a file big enough to be intercepted, retry (hang up on the first attempt, maybe mid-stream, then send
the same transcript again), regenerate an earlier answer (re-send the earlier point, then continue from the
new answer: a fork), edit their last message (a fork), or double-submit (the same continuation twice at
once); and a quarter of them pin their branch with ``X-LCM-Conversation-Id`` (the id the proxy returned
for it).

The audit. Every client keeps an exact record of each acknowledged request: the transcript it sent and the
conversation the proxy reported for it (``X-LCM-Conversation-Id``). Afterwards (proxy stopped, through the
operator API), for every reported conversation its export must start with every transcript acknowledged on
it and equal the longest one, message for message: messages a client sent that are missing are *lost*,
extra or repeated ones *duplicated*; and for every client, the conversation reported for its last request
must hold exactly the transcript it last sent. Every stored conversation must have been reported to some
client; there must be exactly one root conversation per shared opening (the racing first requests created
one); and the number of forks must equal what the clients' actions imply: one per extra branch of an
opening, one per regenerate-then-continue, one per edit, none for retries and double submits. The fake
upstream checks every forwarded chat request against the window (docs/architecture.md's "Bounded") and for paired
tool calls. Then doctor (which includes the store's own integrity checks). Errors are any non-200 answer, an
SSE error event, a transport error, or an ERROR (or "database is locked") line in a proxy's log; none is
expected.

Replicas (PostgreSQL). Several ``python -m proxy serve`` processes, each on its own port, with the same config
(``general_settings.database_url``), start at once (they race to migrate the schema). Every client sends each
request to the next replica, round-robin, so every conversation's requests, a double submit's two halves
included, land on different replicas: the identity and append decisions are made by whichever replica gets
the request, under the store's transaction locks. Every run gets a database of its own, created for it and
dropped afterwards: on the server ``--database`` names (its role needs CREATEDB), else on a throwaway cluster
(tests/support/pg_cluster.py). With one replica killed: once half of the requests are sent, one replica is SIGKILLed.
A request it had in flight is not acknowledged (the client saw a transport error, or a stream without
``[DONE]``); the client sends it again to the next live replica, as a client behind a load balancer retries,
and carries on there. Such failures are counted apart (``cut``), not as errors; the audit is the same, over the
acknowledged requests, and whatever the killed replica had committed must fit it exactly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson

REPO = Path(__file__).resolve().parent.parent
MODEL = "load"
MAX_TOKENS = 200
VOCABULARY = (
    "plan schema index cache migration latency budget review deploy rollback queue worker shard replica "
    "token window summary branch merge fixture parser socket stream buffer retry backoff quota tenant "
    "invoice report metric alert dashboard cluster region bucket archive ledger vector matrix kernel"
)
WORDS = VOCABULARY.split()
CLIENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the project.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the project.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
]
LCM_SETTINGS = {
    "context_threshold": 0.85,  # close to the budget: some requests find it exceeded (inline compaction)
    "fresh_tail_count": 8,
    "leaf_chunk_tokens": 800,
    "leaf_target_tokens": 250,  # summaries that outgrow their room: condensed passes run under load too
    "condensed_target_tokens": 200,
    "leaf_min_fanout": 2,
    "condensed_min_fanout": 2,
    "large_file_token_threshold": 1500,
    "tool_result_token_threshold": 200,
    "max_summarizer_calls_per_hour": 1000,
}
WINDOW = 4000  # model_info.max_input_tokens: ~3,200 tokens for messages once tools and max_tokens are taken


# --------------------------------------------------------------------------------------------------------
# The fake upstream process


class LoadModel:
    """Chat answers (unique, 5-30 words), client tool calls when the last user message says "use tools",
    summaries (the first words of the source) and document descriptions."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.rng = random.Random(1)
        self.counts: Counter[str] = Counter()

    def __call__(self, body: dict[str, Any]) -> Any:
        from tests.support.fakes import Reply

        messages = body["messages"]
        system = str(messages[0].get("content", "")) if messages[0].get("role") == "system" else ""
        if system.startswith("You describe documents"):
            self.counts["explore"] += 1
            return Reply(content="A markdown document: notes of a planning session, with a list of decisions.")
        if system.startswith(("You compress part of a conversation", "You merge")):
            self.counts["summary"] += 1
            found = re.findall(r"[A-Za-z0-9_]+", str(messages[-1]["content"]))[:40]
            return Reply(content="Summary: " + " ".join(found))
        self.counts["chat"] += 1
        n = self.counts["chat"]
        self.check(body)
        last = messages[-1]
        if last.get("role") == "user" and "use tools" in str(last.get("content")):
            self.counts["tool_calls"] += 1
            calls = [
                {
                    "id": f"call_{n}_a",
                    "type": "function",
                    "function": {"name": "search", "arguments": f'{{"q": "t{n}"}}'},
                },
                {
                    "id": f"call_{n}_b",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": f'{{"path": "f{n}.py"}}'},
                },
            ]
            return Reply(content=None, tool_calls=calls)
        text = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(5, 30)))
        return Reply(content=f"Answer {n}: {text}.")

    def check(self, body: dict[str, Any]) -> None:
        """The "Bounded" and "Tool pairing" invariants (docs/architecture.md), on every forwarded chat request."""
        from proxy.tokens import count_messages, count_text

        messages = body["messages"]
        size = count_messages(messages) + int(body.get("max_tokens") or 0)
        if body.get("tools"):
            size += count_text(orjson.dumps(body["tools"]).decode())
        self.counts["largest_request_tokens"] = max(self.counts["largest_request_tokens"], size)
        if size > self.window:
            self.counts["over_window"] += 1
        pending: set[str] = set()
        for message in messages:
            if message.get("role") == "tool":
                if message.get("tool_call_id") not in pending:
                    self.counts["unpaired_tool_calls"] += 1  # a result without its call
                pending.discard(message.get("tool_call_id"))
                continue
            if pending:
                self.counts["unpaired_tool_calls"] += 1  # a call without all of its results
                pending.clear()
            pending.update(call["id"] for call in message.get("tool_calls") or [])
        if pending:
            self.counts["unpaired_tool_calls"] += 1


def serve_upstream(port: int, window: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from tests.support.fakes import FakeUpstream

    fake = FakeUpstream()
    model = LoadModel(window)

    def respond(body: dict[str, Any]) -> Any:
        fake.requests.clear()  # the fake records every body; a long run must not keep them all
        return model(body)

    fake.responder = respond

    async def stats(request: Request) -> Response:
        return JSONResponse(dict(model.counts))

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", fake.chat, methods=["POST"]),
            Route("/stats", stats),
            Route("/healthz", healthz),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --------------------------------------------------------------------------------------------------------
# Processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Command = tuple[list[str], int, Path]  # argv, the port it serves on, its log file (stderr)


@contextlib.contextmanager
def processes(commands: list[Command]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start every command at once, yield once each answers ``/healthz``; SIGTERM (graceful) on the way out
    to those still running (a SIGKILLed replica is gone already)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LCM_")}
    env.update(PYTHONPATH=str(REPO), LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("OPENAI_API_KEY", None)
    children: list[subprocess.Popen[bytes]] = []
    try:
        for args, _, log in commands:
            with log.open("wb") as stderr:
                children.append(subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr))
        deadline = time.monotonic() + 90
        for child, (args, port, log) in zip(children, commands, strict=True):
            while True:
                if child.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{args} did not start: {log.read_text()[-2000:]}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
        yield children
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@contextlib.contextmanager
def fresh_database(server: str | None) -> Iterator[str]:
    """The URL of a new, empty database for one run, dropped afterwards: on the server of ``server`` (a
    PostgreSQL URL; its role needs CREATEDB), else on a throwaway cluster started for it."""
    import psycopg
    from psycopg import sql

    with contextlib.ExitStack() as stack:
        if server is None:
            from tests.support.pg_cluster import Cluster  # plain psycopg and the server binaries: no pytest

            server = stack.enter_context(Cluster()).dsn("postgres")
        admin_url = re.sub(r"^(\w+)\+\w+://", r"\1://", server)  # postgresql+psycopg:// is the proxy's spelling
        name = f"lcm_load_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
        finally:
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# --------------------------------------------------------------------------------------------------------
# Clients

Message = dict[str, Any]


@dataclass
class Ack:
    conversation_id: str
    transcript: list[Message]
    answer: Message | None = None  # what the proxy relayed for it (stored as the conversation's newest message)


@dataclass
class Answer:
    status: int
    conversation_id: str | None = None
    message: Message | None = None
    compaction: str = ""
    error: str = ""


@dataclass
class ClientState:
    index: int
    group: int
    pinned: bool
    rng: random.Random
    acks: list[Ack] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    compactions: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    sent: int = 0
    cut: int = 0  # requests whose replica was SIGKILLed under them (sent again to the next one)
    forks_expected: int = 0  # forks this client's own actions cause (regenerate + continue, edit)
    key: str | None = None  # the branch id a pinned client sends back
    replica: int = 0  # the replica its next request goes to


@dataclass
class Proxies:
    """The proxy processes the clients talk to. Each client sends each request to the next live one
    (round-robin from its own starting point); ``kill_at``: once that many requests are sent, ``kill`` one."""

    http: httpx.AsyncClient
    urls: list[str]
    kill_at: int = 0
    kill: Callable[[], int] | None = None  # SIGKILLs a replica, returns its index
    dead: set[int] = field(default_factory=set)
    sent: int = 0

    def pick(self, client: ClientState) -> int:
        self.sent += 1
        if self.kill is not None and self.sent == self.kill_at:
            self.dead.add(self.kill())  # marked at once: a request failing on it from now on was cut by the kill
        for _ in self.urls:
            replica, client.replica = client.replica, (client.replica + 1) % len(self.urls)
            if replica not in self.dead:
                return replica
        raise RuntimeError("no live replica left")


def opening(group: int) -> list[Message]:
    return [
        {"role": "system", "content": f"You are the planning assistant of project {group}. Be brief."},
        {"role": "user", "content": f"Project {group}: we are planning the storage migration. Here is the context."},
        {"role": "assistant", "content": f"Understood, project {group}. What should we start with?"},
        {"role": "user", "content": f"Project {group}: list the risks of the migration first."},
    ]


def words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def user_message(client: ClientState, turn: int) -> Message:
    rng = client.rng
    text = f"[client {client.index} turn {turn}] {words(rng, 10, 110)}"
    if rng.random() < 0.015:  # a pasted file big enough to be intercepted (stubbed even in the tail)
        body = "\n".join(f"- item {i}: {words(rng, 6, 12)}" for i in range(220))
        text += f'\n<file name="notes-{client.index}-{turn}.md" mime="text/markdown">\n{body}\n</file>'
    return {"role": "user", "content": text}


def tool_results(client: ClientState, calls: list[Message], turn: int) -> list[Message]:
    out = []
    for call in calls:
        if call["function"]["name"] == "read_file" and client.rng.random() < 0.6:
            content = "\n".join(f"def f{i}(x):  # {words(client.rng, 3, 6)}" for i in range(40))  # ~350 tokens
        else:
            content = f"{turn}: " + words(client.rng, 5, 20)
        out.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    return out


async def send(proxies: Proxies, client: ClientState, transcript: list[Message], abort: bool = False) -> Answer:
    """One chat request, streamed or not; ``abort``: hang up early (a client-side timeout before a retry). A
    request cut by the kill of its replica is sent again to the next one."""
    stream = client.rng.random() < 0.5
    body: dict[str, Any] = {"model": MODEL, "messages": transcript, "max_tokens": MAX_TOKENS, "tools": CLIENT_TOOLS}
    if stream:
        body["stream"] = True
        if client.rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    headers = {"content-type": "application/json"}
    if client.pinned and client.key:
        headers["x-lcm-conversation-id"] = client.key
    while True:
        replica = proxies.pick(client)
        url = f"{proxies.urls[replica]}/v1/chat/completions"
        client.sent += 1
        if abort:
            post = _post(proxies.http, url, body, headers, stream, abort=True)
            try:
                early = await asyncio.wait_for(post, client.rng.uniform(0, 0.05))
            except (TimeoutError, httpx.HTTPError):
                return Answer(status=0)  # hung up: whatever the proxy does with it, nobody hears it
            if (early.status != 200 or early.error) and replica in proxies.dead:
                client.cut += 1
                return Answer(status=0)  # its replica died before the hang-up: the same to the client
            if early.status != 200 or early.error:  # it answered before the hang-up, with an error
                client.errors.append(f"client {client.index} request {client.sent}: {early.status} {early.error[:300]}")
            return early
        started = time.perf_counter()
        try:
            answer = await _post(proxies.http, url, body, headers, stream)
        except httpx.HTTPError as error:
            answer = Answer(status=0, error=f"{type(error).__name__}: {error}")
        if (answer.status != 200 or answer.error) and replica in proxies.dead:
            client.cut += 1  # not acknowledged; the client sends it again, to the next live replica
            continue
        break
    if answer.status == 200 and not answer.error:
        client.latencies.append(time.perf_counter() - started)
        client.compactions[answer.compaction] += 1
        if answer.conversation_id is None:
            answer.error = "no X-LCM-Conversation-Id header"
    if answer.status != 200 or answer.error:
        client.errors.append(f"client {client.index} request {client.sent}: {answer.status} {answer.error[:300]}")
    return answer


async def _post(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str], stream: bool, abort: bool = False
) -> Answer:
    if not stream:
        response = await http.post(url, content=orjson.dumps(body), headers=headers)
        if response.status_code != 200:
            return Answer(response.status_code, error=response.text)
        choice = orjson.loads(response.content)["choices"][0]["message"]
        message: Message = {"role": "assistant", "content": choice.get("content")}
        if choice.get("tool_calls"):
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": c["type"],
                    "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                }
                for c in choice["tool_calls"]
            ]
        return Answer(
            200, response.headers.get("x-lcm-conversation-id"), message, response.headers.get("x-lcm-compaction", "")
        )
    async with http.stream("POST", url, content=orjson.dumps(body), headers=headers) as response:
        if response.status_code != 200:
            return Answer(response.status_code, error=(await response.aread()).decode(errors="replace"))
        answer = Answer(
            200, response.headers.get("x-lcm-conversation-id"), None, response.headers.get("x-lcm-compaction", "")
        )
        content: list[str] = []
        calls: dict[int, Message] = {}
        done = False
        async for line in response.aiter_lines():
            if abort:
                return answer  # hang up after the first line
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break  # and hang up at once, like real clients
            chunk = orjson.loads(data)
            if "error" in chunk:
                answer.error = f"SSE error event: {data}"
                return answer
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    content.append(delta["content"])
                for tc in delta.get("tool_calls") or []:
                    call = calls.setdefault(
                        tc["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    call["id"] = tc.get("id") or call["id"]
                    fn = tc.get("function") or {}
                    call["function"]["name"] += fn.get("name") or ""
                    call["function"]["arguments"] += fn.get("arguments") or ""
        if not done:
            answer.error = "stream ended without [DONE]"
        answer.message = {"role": "assistant", "content": "".join(content) or None}
        if calls:
            answer.message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return answer


async def run_client(proxies: Proxies, client: ClientState, quota: int, start: asyncio.Event) -> None:
    """Send about ``quota`` requests on this client's branch (actions are atomic, so it may overshoot a little)."""
    await start.wait()
    rng = client.rng
    history = [opening(client.group)]  # transcripts of this branch, each stored in the proxy when sent

    async def ask(transcript: list[Message], *, remember: bool = True) -> Answer | None:
        answer = await send(proxies, client, transcript)
        if answer.status != 200 or answer.error or answer.conversation_id is None or answer.message is None:
            return None
        client.acks.append(Ack(answer.conversation_id, transcript, answer.message))
        if transcript is not history[0]:  # pin the branch, not the opening every branch shares
            client.key = answer.conversation_id
        if remember:
            history.append(transcript)
        return answer

    def follow_up(base: list[Message], answer: Message, turn: int) -> list[Message]:
        """The next transcript after ``answer``: the results of its tool calls, or a new user message."""
        if answer.get("tool_calls"):
            return [*base, answer, *tool_results(client, answer["tool_calls"], turn)]
        if rng.random() < 0.08:
            client.actions["tools"] += 1
            text = f"[client {client.index} turn {turn}] use tools: {words(rng, 3, 10)}"
            return [*base, answer, {"role": "user", "content": text}]
        return [*base, answer, user_message(client, turn)]

    last = await ask(history[0], remember=False)
    turn = 0
    while last is not None and client.sent < quota:
        turn += 1
        current, answer = history[-1], last.message
        assert answer is not None  # ask() returns only answers with a message
        roll = rng.random()
        if answer.get("tool_calls"):
            last = await ask(follow_up(current, answer, turn))
        elif roll < 0.05 and len(history) > 1:
            # Retry: hang up on the first attempt (maybe mid-stream), then send the same transcript again.
            client.actions["retry"] += 1
            await send(proxies, client, current, abort=True)
            last = await ask(current, remember=False)
        elif roll < 0.10 and len(history) > 2:
            # Regenerate the previous answer: re-send the earlier point, then continue from the new answer.
            client.actions["regenerate"] += 1
            del history[-1]
            earlier = await ask(history[-1], remember=False)
            if earlier is None or earlier.message is None:
                return
            client.forks_expected += 1
            last = await ask(follow_up(history[-1], earlier.message, turn))
        elif roll < 0.14 and len(history) > 1 and current[-1]["role"] == "user":
            # Edit the last user message: the transcript diverges from the stored one, a fork.
            client.actions["edit"] += 1
            client.forks_expected += 1
            edited = {"role": "user", "content": f"{current[-1]['content']} (edited: {words(rng, 2, 6)})"}
            history[-1] = [*current[:-1], edited]
            last = await ask(history[-1], remember=False)
        elif roll < 0.18:
            # Double submit: the same continuation twice at once (a double click, or a client-side retry
            # racing the original). One of them appends, the other finds it stored: nothing twice.
            client.actions["double"] += 1
            following = follow_up(current, answer, turn)
            first, last = await asyncio.gather(ask(following, remember=False), ask(following))
            if first is None:
                return
        else:
            client.actions["continue"] += 1
            last = await ask(follow_up(current, answer, turn))


# --------------------------------------------------------------------------------------------------------
# The run and the audit


@dataclass
class LoadResult:
    clients: int
    conversations: int
    workers: int  # worker processes of the one SQLite proxy; 1 for each PostgreSQL replica
    replicas: int = 0  # PostgreSQL: proxy processes on one database; 0: SQLite
    killed: bool = False  # one replica SIGKILLed mid-run
    requests: int = 0
    cut: int = 0  # requests in flight on the killed replica (not acknowledged; sent again to another)
    acknowledged: int = 0
    errors: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0
    mismatched: list[str] = field(default_factory=list)  # audit failures beyond counts (order, identity)
    forks: int = 0
    forks_expected: int = 0
    roots: int = 0
    stored_conversations: int = 0
    stored_messages: int = 0
    doctor: list[str] = field(default_factory=list)
    integrity: str = ""
    compaction_headers: Counter[str] = field(default_factory=Counter)
    summaries: Counter[str] = field(default_factory=Counter)
    upstream: dict[str, int] = field(default_factory=dict)
    actions: Counter[str] = field(default_factory=Counter)

    @property
    def label(self) -> str:
        if not self.replicas:
            return f"SQLite, {self.workers} worker{'s' * (self.workers > 1)}"
        killed = ", one SIGKILLed mid-run" if self.killed else ""
        return f"PostgreSQL, {self.replicas} replica{'s' * (self.replicas > 1)}{killed}"

    @property
    def rps(self) -> float:
        return self.requests / self.elapsed if self.elapsed else 0.0

    def percentile(self, q: float) -> float:
        values = sorted(self.latencies)
        return values[min(len(values) - 1, int(len(values) * q))] * 1000 if values else 0.0

    @property
    def ok(self) -> bool:
        return not (
            self.errors
            or self.log_errors
            or self.lost
            or self.duplicated
            or self.mismatched
            or self.doctor
            or self.integrity != "ok"
            or self.forks != self.forks_expected
            or self.roots != self.conversations
            or self.upstream.get("over_window", 0)
            or self.upstream.get("unpaired_tool_calls", 0)
        )


def log_errors(log: str) -> list[str]:
    """ERROR records of the proxy's log (with their tracebacks), any "database is locked", and any worker
    process that had to be replaced (cutting what it had in flight)."""
    out: list[str] = []
    inside = False
    for line in log.splitlines():
        if re.match(r"\d{4}-\d\d-\d\d ", line):  # a new record
            inside = " ERROR " in line or "database is locked" in line or "died or stopped answering" in line
            if inside:
                out.append(line)
        elif inside:
            out[-1] += "\n" + line
        elif "database is locked" in line:
            out.append(line)
    return out


def write_config(path: Path, upstream: str, port: int, data_dir: Path, window: int, database: str | None) -> None:
    general: dict[str, Any] = {"port": port, "data_dir": str(data_dir), "log_level": "warning", "request_timeout": 60}
    if database is not None:
        general["database_url"] = database
    config = {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {"model": f"openai/{MODEL}", "api_base": f"{upstream}/v1", "api_key": "k-12345678"},
                "model_info": {"max_input_tokens": window},
            }
        ],
        "general_settings": general,
        "lcm_settings": LCM_SETTINGS,
    }
    # JSON is YAML. 0600: a database URL may carry a password.
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        out.write(orjson.dumps(config))


def _key(message: Message) -> bytes:
    return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)


def _answer_key(message: Message) -> bytes:
    """An answer as the proxy stores it when it relays it: role, content and tool calls."""
    stored: Message = {"role": "assistant", "content": message.get("content") or None}
    if message.get("tool_calls"):
        stored["tool_calls"] = [
            {"id": c.get("id"), "type": c.get("type") or "function", "function": c["function"]}
            for c in message["tool_calls"]
        ]
    return _key(stored)


async def audit(config_path: Path, clients: list[ClientState], result: LoadResult) -> None:
    """Through the operator API and doctor only, so that it reads either store the same way."""
    from proxy.cli.operator import Operator
    from proxy.config.loading import load_config
    from proxy.engine.doctor import check_database
    from proxy.engine.errors import NotFound

    config = load_config(str(config_path))
    async with Operator(config.general_settings.location()) as op:
        integrity = await op.store.integrity()
        result.integrity = "; ".join(integrity) or "ok"
        result.doctor = await check_database(op.store, op.files)
        stored = await op.store.read.conversations(None, limit=1_000_000)
        result.stored_conversations = len(stored)
        result.stored_messages = sum(c.message_count for c in stored)
        result.roots = sum(1 for c in stored if c.parent_id is None)
        result.forks = len(stored) - result.roots
        result.summaries = await count_summaries(op.store.read, [c.id for c in stored])

        acks: dict[str, list[Ack]] = {}
        for client in clients:
            for ack in client.acks:
                acks.setdefault(ack.conversation_id, []).append(ack)
        for c in stored:
            if c.id not in acks:
                result.mismatched.append(f"{c.id}: stored ({c.message_count} messages) but never reported to a client")
                result.duplicated += c.message_count - (c.fork_seq or 0)
        exports: dict[str, list[bytes]] = {}
        for conversation_id, on_it in acks.items():
            try:
                exports[conversation_id] = exported = [_key(m) for m in await op.export(conversation_id, None)]
            except NotFound:
                exports[conversation_id] = exported = []
            longest = max(on_it, key=lambda a: len(a.transcript)).transcript
            wanted = [_key(m) for m in longest]
            # The proxy stores the answer it relayed for the newest transcript before the client sends it back.
            relayed = {_answer_key(a.answer) for a in on_it if a.answer and len(a.transcript) == len(longest)}
            if len(exported) == len(wanted) + 1 and exported[-1] in relayed:
                exported = exported[:-1]
            have, want = Counter(exported), Counter(wanted)
            result.lost += sum((want - have).values())
            result.duplicated += sum((have - want).values())
            if exported != wanted:
                result.mismatched.append(
                    f"{conversation_id}: export differs from the longest transcript acknowledged on it"
                )
            if any([_key(m) for m in ack.transcript] != exported[: len(ack.transcript)] for ack in on_it):
                result.mismatched.append(f"{conversation_id}: an acknowledged transcript is not a prefix of its export")
        # The same from each client's side: the conversation reported for its last request holds exactly
        # the transcript it last sent (its branch), message for message.
        for client in clients:
            if client.acks and len(client.acks[-1].transcript) > len(opening(client.group)):
                last = client.acks[-1]
                exported = exports[last.conversation_id]
                if (
                    exported[: len(last.transcript)] != [_key(m) for m in last.transcript]
                    or len(exported) > len(last.transcript) + 1
                ):
                    result.mismatched.append(
                        f"client {client.index}: {last.conversation_id} is not its last transcript"
                    )


async def count_summaries(read: Any, conversation_ids: list[str]) -> Counter[str]:
    """Summaries by kind (and fallbacks: escalation 2) reachable from the conversations' contexts, each once
    (forks share their parent's)."""
    seen: dict[str, Any] = {}
    stack = [s for cid in conversation_ids for s in await read.context_summaries(cid)]
    while stack:
        summary = stack.pop()
        if summary.id not in seen:
            seen[summary.id] = summary
            stack += await read.child_summaries(summary.id)
    counts: Counter[str] = Counter(s.kind for s in seen.values())
    counts["fallback"] = sum(1 for s in seen.values() if s.escalation == 2)
    return counts


async def drive(
    urls: list[str], clients: list[ClientState], quota: int, kill: Callable[[], int] | None = None
) -> float:
    """Run every client to its quota; ``kill`` (() -> replica index) is called once half the requests are sent."""
    limits = httpx.Limits(max_connections=len(clients) * 2, max_keepalive_connections=len(clients))
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        proxies = Proxies(http, urls, kill_at=len(clients) * quota // 2, kill=kill)
        for client in clients:
            client.replica = client.index % len(urls)
        start = asyncio.Event()
        tasks = [asyncio.create_task(run_client(proxies, client, quota, start)) for client in clients]
        started = time.perf_counter()
        start.set()
        await asyncio.gather(*tasks)
        return time.perf_counter() - started


def run_load(
    clients: int = 64,
    conversations: int = 20,
    requests: int = 3000,
    *,
    workers: int = 1,
    replicas: int = 0,
    database: str | None = None,
    kill_one: bool = False,
    window: int = WINDOW,
    seed: int = 0,
    workdir: Path | None = None,
) -> LoadResult:
    """Run the load against fresh proxies and audit the store; ``requests`` is the total to aim for.

    ``replicas`` 0: one proxy on SQLite with ``workers`` worker processes. Otherwise that many proxy processes
    on one PostgreSQL database, made for this run on the server ``database`` names (a URL), or on a throwaway
    cluster when None; ``kill_one``: SIGKILL the last of them once half the requests are sent."""
    if kill_one and replicas < 2:
        raise ValueError("killing a replica needs at least two")
    result = LoadResult(clients, conversations, workers if not replicas else 1, replicas, kill_one)
    states = [
        ClientState(index=i, group=i % conversations, pinned=i % 4 == 3, rng=random.Random(seed * 100_003 + i))
        for i in range(clients)
    ]
    quota = max(2, -(-requests // clients))
    with tempfile.TemporaryDirectory(dir=workdir) as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        url = stack.enter_context(fresh_database(database)) if replicas else None
        upstream_port, ports = free_port(), [free_port() for _ in range(max(1, replicas))]
        upstream_args = [sys.executable, "-m", "bench.load", "upstream", str(upstream_port), str(window)]
        logs = [root / f"proxy{i}.log" for i in range(len(ports))]
        with processes([(upstream_args, upstream_port, root / "upstream.log")]):
            upstream = f"http://127.0.0.1:{upstream_port}"
            config = root / "proxy.yaml"
            write_config(config, upstream, ports[0], root / "data", window, url)
            serve = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--workers"]
            commands = [
                ([*serve, str(result.workers), "--port", str(port)], port, log)
                for port, log in zip(ports, logs, strict=True)
            ]
            with processes(commands) as children:

                def kill() -> int:
                    children[-1].kill()  # SIGKILL
                    return len(children) - 1

                urls = [f"http://127.0.0.1:{port}" for port in ports]
                result.elapsed = asyncio.run(drive(urls, states, quota, kill if kill_one else None))
            result.upstream = httpx.get(f"{upstream}/stats", timeout=10).json()
        for log in logs:
            result.log_errors += log_errors(log.read_text(errors="replace"))
        asyncio.run(audit(config, states, result))
    for state in states:
        result.requests += state.sent
        result.cut += state.cut
        result.acknowledged += len(state.acks)
        result.errors += state.errors
        result.latencies += state.latencies
        result.compaction_headers += state.compactions
        result.actions += state.actions
        result.forks_expected += state.forks_expected
    # One fork for every branch of a shared opening beyond the first.
    groups = Counter(state.group for state in states)
    result.forks_expected += sum(n - 1 for n in groups.values())
    return result


def table(results: list[LoadResult]) -> str:
    lines = [
        "| store, proxy processes | requests | errors | cut by the kill | req/s | p50 ms | p95 ms | p99 ms | lost"
        " | duplicated | forks found (expected) | doctor | compaction (scheduled / inline / evicted)"
        " | summaries (leaf / condensed / fallback) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in results:
        doctor = "ok" if not r.doctor and r.integrity == "ok" else f"{len(r.doctor)} problem(s), {r.integrity}"
        h, s = r.compaction_headers, r.summaries
        lines.append(
            f"| {r.label} | {r.requests} | {len(r.errors) + len(r.log_errors)} | {r.cut} | {r.rps:.0f}"
            f" | {r.percentile(0.5):.1f} | {r.percentile(0.95):.1f} | {r.percentile(0.99):.1f} | {r.lost}"
            f" | {r.duplicated} | {r.forks} ({r.forks_expected}) | {doctor}"
            f" | {h['scheduled']} / {h['inline']} / {h['evicted']} | {s['leaf']} / {s['condensed']} / {s['fallback']} |"
        )
    return "\n".join(lines)


def details(r: LoadResult) -> str:
    actions = ", ".join(f"{k} {v}" for k, v in sorted(r.actions.items()))
    upstream = ", ".join(f"{k} {v}" for k, v in sorted(r.upstream.items()))
    cut = f", {r.cut} cut by the kill and sent again" if r.killed else ""
    out = [
        f"- {r.label}: {r.requests} requests ({r.acknowledged} acknowledged{cut}, the rest hung up on purpose"
        f" before a retry) in {r.elapsed:.1f} s; client actions: {actions}; upstream calls: {upstream};"
        f" stored: {r.stored_conversations} conversations ({r.roots} roots), {r.stored_messages} messages",
    ]
    out += [f"  - {line}" for line in (r.errors + r.log_errors + r.mismatched + r.doctor)[:20]]
    return "\n".join(out)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench load", description=__doc__.split("\n\n")[1])
    parser.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="only the PostgreSQL rows: N proxy replicas, then (N >= 2) N with one SIGKILLed mid-run",
    )
    parser.add_argument(
        "--database",
        metavar="URL",
        help="a PostgreSQL server (postgresql://USER@HOST:PORT/DB) on which each run creates and drops a database"
        " of its own (the role needs CREATEDB); default: a throwaway cluster (tests/support/pg_cluster.py)",
    )
    parser.add_argument("--requests", type=int, metavar="N", help="requests per run (default 6000; --quick 1800)")
    args = parser.parse_args(argv)
    if args.replicas is not None and args.replicas < 1:
        parser.error("--replicas must be at least 1")
    return args


def main(quick: bool = False, argv: list[str] | None = None) -> None:
    args = parse_args(argv or [])
    # Quick: the size of tests/test_load.py (about 28 requests per client: enough to reach compaction).
    requests = args.requests or (1800 if quick else 6000)
    runs: list[tuple[int, int, bool]]  # (replicas: 0 is SQLite, workers, one replica killed)
    if args.replicas is not None:
        runs = [(args.replicas, 1, False)] + ([(args.replicas, 1, True)] if args.replicas > 1 else [])
    elif quick:
        runs = [(0, 2, False), (3, 1, True)]
    else:
        runs = [(0, 1, False), (0, 2, False), (1, 1, False), (2, 1, False), (3, 1, False), (3, 1, True)]
    cores = os.cpu_count() or 1
    print(
        f"\n## load: 64 concurrent clients over 20 conversations, {requests} requests aimed for per run, "
        f"{WINDOW}-token window (compaction during the run)\n"
    )
    print(
        f"This machine has {cores} core{'s' * (cores > 1)}. Every process of a run shares them: the proxy replicas,"
        " PostgreSQL, the fake upstream and the 64 clients. More replicas cannot add throughput here, they"
        " compete for the same cores; the PostgreSQL rows show that several replicas on one database stay"
        " correct (nothing lost, nothing duplicated, the expected forks), not how they scale on more machines.\n"
    )
    header, rule = table([]).splitlines()
    print(header, rule, sep="\n", flush=True)
    results: list[LoadResult] = []
    with contextlib.ExitStack() as stack:
        server = args.database
        if server is None and any(replicas for replicas, _, _ in runs):
            from tests.support.pg_cluster import Cluster

            server = stack.enter_context(Cluster()).dsn("postgres")  # one cluster, a database per run
        for n, w, k in runs:
            results.append(
                run_load(64, 20, requests, workers=w, replicas=n, database=server if n else None, kill_one=k)
            )
            print(table(results[-1:]).splitlines()[-1], flush=True)  # each row as soon as it is measured
    print()
    for r in results:
        print(details(r))


if __name__ == "__main__":
    if sys.argv[1:2] == ["upstream"]:
        serve_upstream(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main(quick="--quick" in sys.argv, argv=[a for a in sys.argv[1:] if a != "--quick"])
