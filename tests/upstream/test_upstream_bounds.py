"""What an upstream's answer may cost the proxy, and what its failures tell a client (issue 22).

* Embeddings answers are relayed without being parsed on the event loop: ``/healthz`` keeps answering within
  100 ms while an OpenAI-sized batch (2,048 inputs x 1,536 floats, as JSON floats and as base64) is relayed,
  measured over real sockets as ``tests/engine/test_bounded_work.py`` does. A request of more than 2,048 inputs is
  OpenAI's 400 naming ``input``, before any upstream call; an answer over ``max_upstream_response_bytes`` is a
  502 naming the model.
* A large upstream error body is read only in part and redacted off the loop: the client gets a bounded
  message, and ``/healthz`` answers meanwhile.
* No error message names a deployment's internal ``api_base``: refused connection, timeout, malformed
  answer, 5xx.
* An upstream's ``Retry-After`` on a 429 reaches the client (seconds, or an HTTP date turned into seconds,
  bounded), for chat (streamed or not) and the passed-through endpoints.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.app import create_app
from proxy.upstream.errors import MAX_RETRY_AFTER
from tests.support.fakes import FakeUpstream, Reply
from tests.support.proxies import UPSTREAM_KEY, AppProxy, make_config
from tests.support.servers import probe_healthz_while, serve_in_thread

HEALTHZ_BOUND = 0.100  # seconds: the acceptance bound
INPUTS, DIMENSIONS = 2048, 1536


def embeddings_body(encoding: str, inputs: int = INPUTS, dimensions: int = DIMENSIONS) -> bytes:
    """An OpenAI embeddings answer of ``inputs`` vectors, as OpenAI writes it (floats with ~10 digits)."""
    floats = [((i * 7919) % 20011 - 10005) / 1_000_003.0 for i in range(dimensions)]
    if encoding == "base64":
        vector = b'"' + base64.b64encode(struct.pack(f"<{dimensions}f", *floats)) + b'"'
    else:
        vector = orjson.dumps(floats)
    items = b",".join(b'{"object":"embedding","index":%d,"embedding":%s}' % (i, vector) for i in range(inputs))
    usage = b'{"prompt_tokens":%d,"total_tokens":%d}' % (inputs, inputs)
    return b'{"object":"list","data":[' + items + b'],"model":"fake-model","usage":' + usage + b"}"


@pytest.fixture
def served(upstream_url: str, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A proxy served as ``lcm-proxy serve`` serves it (LiteLLM warmed up, the startup heap frozen)."""
    app = create_app(make_config(upstream_url, tmp_path / "data"), serving=True)
    with serve_in_thread(app) as url:
        yield url, app


# --- item 1: embeddings answers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "dimensions"), [("float", 1536), ("base64", 1536), ("float", 3072)], ids=["float", "base64", "3072"]
)
def test_healthz_answers_within_100ms_while_a_2048_input_embeddings_answer_is_relayed(
    served: tuple[str, Any], fake_upstream: FakeUpstream, encoding: str, dimensions: int
) -> None:
    """2,048 vectors of 1,536 floats (65 MB of JSON), the same as base64 (16 MB), and of 3,072 floats (131 MB)."""
    url, _ = served
    answer = embeddings_body(encoding, dimensions=dimensions)
    fake_upstream.enqueue(Reply(raw_body=answer))
    # Serialised up front: the client shares its GIL with the server under test.
    request = orjson.dumps({"model": "test-model", "input": [f"text {i}" for i in range(INPUTS)],
                            **({"encoding_format": "base64"} if encoding == "base64" else {})})  # fmt: skip

    def send() -> dict[str, Any]:
        with httpx.Client(timeout=120) as client:
            headers = {"content-type": "application/json"}
            with client.stream("POST", f"{url}/v1/embeddings", content=request, headers=headers) as response:
                pieces = list(response.iter_raw())  # joined after the measurement: a copy of 65 MB holds the GIL
            return {"status": response.status_code, "pieces": pieces}

    probes, outcome = probe_healthz_while(url, send, lambda: len(fake_upstream.requests) > 0)
    latencies = probes.latencies
    assert latencies, "no /healthz probe ran while the answer was handled"
    assert max(latencies) < HEALTHZ_BOUND, f"/healthz took {max(latencies) * 1000:.0f} ms ({len(latencies)} probes)"
    relayed = b"".join(outcome["pieces"])
    assert outcome["status"] == 200, relayed[:300]
    assert relayed == answer  # relayed byte for byte
    assert fake_upstream.last.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert fake_upstream.last.body["input"][2047] == "text 2047"


def test_a_6_million_input_embeddings_request_is_refused_before_anything_walks_it(
    proxy: Any, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's 6 M-input request (24 MB of JSON): parsed off the loop (``parse_json_in_steps``), its input
    counted in constant time before anything walks the body on the loop (``check_depth`` over 6 M values held
    the loop 4.3 s), refused with OpenAI's 400; the upstream is never asked for 6 M vectors."""
    from proxy.wire.passthrough import routes as passthrough

    walked: list[int] = []
    check_depth = passthrough.check_depth

    def recorded(body: dict[str, Any]) -> None:
        walked.append(len(body))
        check_depth(body)

    monkeypatch.setattr(passthrough, "check_depth", recorded)
    request = orjson.dumps({"model": "test-model", "input": ["a"] * 6_000_000})
    response = httpx.post(
        f"{proxy.base_url}/embeddings", content=request, headers={"content-type": "application/json"}, timeout=300
    )
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["param"] == "input" and "6000000" in error["message"]
    assert walked == [] and fake_upstream.requests == []


def test_more_than_2048_inputs_is_a_400_naming_input_before_any_upstream_call(
    app_proxy: AppProxy, fake_upstream: FakeUpstream
) -> None:
    proxy = app_proxy
    body = {"model": "test-model", "input": ["x"] * (INPUTS + 1)}
    response = proxy.client.post(f"{proxy.base_url}/embeddings", json=body, timeout=20)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input" and error["code"] == "array_above_max_length"
    assert "maximum length 2048" in error["message"] and "2049" in error["message"]
    assert fake_upstream.requests == []
    # Token-id arrays count as inputs too; one array of token ids is one input.
    tokens = proxy.client.post(f"{proxy.base_url}/embeddings", json={**body, "input": [[1]] * (INPUTS + 1)}, timeout=20)
    assert tokens.status_code == 400 and tokens.json()["error"]["param"] == "input"
    one = proxy.client.post(f"{proxy.base_url}/embeddings", json={**body, "input": list(range(INPUTS + 1))}, timeout=20)
    assert one.status_code == 200, one.text


@pytest.mark.parametrize("model", ["test-model", "org"], ids=["relayed", "litellm"])
def test_an_embeddings_answer_over_the_cap_is_a_502_naming_the_model(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, model: str
) -> None:
    params = {"model": "openai/fake-model", "api_base": f"{upstream_url}/v1", "organization": "org-1"}
    proxy = proxy_factory(max_upstream_response_bytes=100_000, models=[{"model_name": "org", "litellm_params": params}])
    fake_upstream.enqueue(Reply(raw_body=embeddings_body("float", inputs=200, dimensions=64)))
    response = httpx.post(f"{proxy.base_url}/embeddings", json={"model": model, "input": "x"}, timeout=20)
    assert response.status_code == 502, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "upstream_response_too_large"
    assert f"model '{model}'" in error["message"] and "100000 bytes" in error["message"]
    small = httpx.post(f"{proxy.base_url}/embeddings", json={"model": model, "input": "x"}, timeout=20)
    assert small.status_code == 200  # the default fake answer is small


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_a_deployment_litellm_calls_answers_embeddings_from_a_worker_thread(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, encoding: str
) -> None:
    """A deployment the relay cannot call as configured (here its ``organization``) is LiteLLM's: the call and
    the serialisation of its answer run in a worker thread, and the client gets OpenAI's JSON all the same."""
    params = {"model": "openai/fake-model", "api_base": f"{upstream_url}/v1", "api_key": UPSTREAM_KEY}
    proxy = proxy_factory(models=[{"model_name": "org", "litellm_params": {**params, "organization": "org-1"}}])
    on_loop: list[bool] = []
    upstream = proxy.app.state.lcm.upstream
    original = upstream._litellm.embedding

    def observed(**kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:  # no event loop runs in this thread
            on_loop.append(False)
        return original(**kwargs)

    upstream._litellm.embedding = observed
    try:
        body = {"model": "org", "input": ["a", "b"], **({"encoding_format": "base64"} if encoding == "base64" else {})}
        response = httpx.post(f"{proxy.base_url}/embeddings", json=body, timeout=30)
    finally:
        upstream._litellm.embedding = original
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    vector = data[1]["embedding"]
    floats = list(struct.unpack("<3f", base64.b64decode(vector))) if encoding == "base64" else vector
    assert len(data) == 2 and floats == [0.25, -0.5, 1.0]
    assert on_loop == [False]  # called once, in a worker thread


def test_held_litellm_embeddings_do_not_starve_the_chat_path(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str
) -> None:
    """LiteLLM's synchronous embeddings calls run in a bounded pool of their own: more of them held upstream
    than the default thread pool has threads (which chat uses: ingest hashing, JSON parsing, file reads) leave
    a chat request its threads, and it completes while they are all still held."""
    params = {"model": "openai/fake-model", "api_base": f"{upstream_url}/v1", "api_key": UPSTREAM_KEY}
    proxy = proxy_factory(models=[{"model_name": "org", "litellm_params": {**params, "organization": "org-1"}}])
    upstream = proxy.app.state.lcm.upstream
    default_threads = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default max_workers
    held_calls = default_threads + 2
    release, entered, lock = threading.Event(), threading.Event(), threading.Lock()
    count = [0]
    original_embedding, original_route = upstream._litellm.embedding, upstream._embedding

    def held(**kwargs: Any) -> Any:  # an upstream that has not answered yet: the calling thread waits
        release.wait()
        return original_embedding(**kwargs)

    async def counted(kwargs: dict[str, Any], name: str) -> Any:
        with lock:
            count[0] += 1
            if count[0] == held_calls:
                entered.set()
        return await original_route(kwargs, name)  # hands the call to a thread before the loop goes on

    upstream._litellm.embedding, upstream._embedding = held, counted
    answers: list[int] = []

    def embed() -> None:
        response = httpx.post(f"{proxy.base_url}/embeddings", json={"model": "org", "input": "x"}, timeout=120)
        answers.append(response.status_code)

    senders = [threading.Thread(target=embed) for _ in range(held_calls)]
    try:
        for sender in senders:
            sender.start()
        assert entered.wait(60)  # every embeddings call is handed to a thread and held
        chat = httpx.post(
            f"{proxy.base_url}/chat/completions",
            json={"model": "test-model", "messages": [{"role": "user", "content": "Still there?"}]},
            timeout=20,  # before the fix: the default pool's threads were all held, and this timed out
        )
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["content"] == "echo: Still there?"
        assert not answers  # the embeddings are all still held: the chat did not wait for them
    finally:
        release.set()
        for sender in senders:
            sender.join(120)
        upstream._litellm.embedding, upstream._embedding = original_embedding, original_route
    assert answers == [200] * held_calls


def test_a_malformed_embeddings_answer_is_a_502(proxy: Any, fake_upstream: FakeUpstream) -> None:
    fake_upstream.enqueue(Reply(raw_body=b"<html>gateway</html>"))
    response = httpx.post(f"{proxy.base_url}/embeddings", json={"model": "test-model", "input": "x"}, timeout=20)
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "upstream_bad_response"


# --- item 2: large error bodies ----------------------------------------------------------------------------

ERROR_BYTES = 5 << 20


def big_error() -> bytes:
    message = ("The server is overloaded; details follow. " * (ERROR_BYTES // 42))[:ERROR_BYTES]
    return orjson.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": "overloaded"}})


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/embeddings", {"model": "test-model", "input": "x"}),
    ],
    ids=["chat", "embeddings"],
)
def test_healthz_answers_within_100ms_while_a_5_mb_error_body_is_handled(
    served: tuple[str, Any], fake_upstream: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    url, _ = served
    warm = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert warm.status_code == 200  # a first call's lazy imports are not what is measured
    fake_upstream.enqueue(Reply(status=503, raw_body=big_error()))
    count = len(fake_upstream.requests)

    def send() -> dict[str, Any]:
        response = httpx.post(f"{url}{path}", json=body, timeout=60)
        return {"status": response.status_code, "json": response.json()}

    probes, outcome = probe_healthz_while(url, send, lambda: len(fake_upstream.requests) > count)
    latencies = probes.latencies
    assert outcome["status"] == 503
    error = outcome["json"]["error"]
    assert error["code"] == "overloaded" and error["message"].startswith("The server is overloaded; details follow.")
    assert len(error["message"]) <= 4100  # bounded, and said to be cut
    assert error["message"].endswith("[truncated]")
    assert latencies, "no /healthz probe ran while the error was handled"
    assert max(latencies) < HEALTHZ_BOUND, f"/healthz took {max(latencies) * 1000:.0f} ms ({len(latencies)} probes)"


# --- item 3: no api_base in client errors -------------------------------------------------------------------

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
PATHS = ("/v1/chat/completions", "/v1/embeddings", "/v1/completions")


FAILURES = [
    *((failure, path) for failure in ("refused", "timeout", "malformed", "5xx") for path in PATHS),
    ("stream-malformed", "/v1/chat/completions"),
]


@pytest.mark.parametrize(("failure", "path"), FAILURES)
def test_upstream_failures_do_not_name_the_api_base(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, path: str, failure: str
) -> None:
    proxy = proxy_factory(request_timeout=1)
    model = "unreachable" if failure == "refused" else "test-model"
    body: dict[str, Any] = {**CHAT, "model": model} if "chat" in path else {"model": model, "input": "x", "prompt": "x"}
    if failure == "timeout":
        fake_upstream.enqueue(Reply(delay=3))
    elif failure in ("malformed", "stream-malformed"):
        fake_upstream.enqueue(Reply(raw_body=b"<html>bad gateway</html>"))
    elif failure == "5xx":
        fake_upstream.enqueue(Reply(status=500, error_message="internal failure"))
    if failure == "stream-malformed":
        body["stream"] = True
    response = httpx.post(f"{proxy.url}{path}", json=body, timeout=30)
    text = response.text
    assert response.status_code >= 400 or "error" in text, text[:300]
    if failure in ("refused", "timeout", "malformed"):  # worded by the proxy: the alias names what failed
        assert "model 'test-model'" in text or "model 'unreachable'" in text, text[:300]
    assert upstream_url not in text and "127.0.0.1" not in text, text[:500]


# --- item 4: Retry-After ------------------------------------------------------------------------------------


def _http_date(seconds: int) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=seconds), usegmt=True)


@pytest.mark.parametrize("call", ["chat", "chat-stream", "embeddings", "completions"])
@pytest.mark.parametrize("form", ["seconds", "date", "huge", "garbage"])
def test_a_429s_retry_after_reaches_the_client(proxy: Any, fake_upstream: FakeUpstream, call: str, form: str) -> None:
    header = {"seconds": "7", "date": _http_date(30), "huge": "99999999", "garbage": "soon"}[form]
    fake_upstream.enqueue(
        Reply(status=429, error_message="Rate limit reached", error_type="requests", headers={"retry-after": header})
    )
    path, body = {
        "chat": ("/chat/completions", CHAT),
        "chat-stream": ("/chat/completions", {**CHAT, "stream": True}),
        "embeddings": ("/embeddings", {"model": "test-model", "input": "x"}),
        "completions": ("/completions", {"model": "test-model", "prompt": "x"}),
    }[call]
    response = httpx.post(f"{proxy.base_url}{path}", json=body, timeout=30)
    assert response.status_code == 429, response.text
    assert "Rate limit reached" in response.json()["error"]["message"]
    if form == "seconds":
        assert response.headers["retry-after"] == "7"
    elif form == "date":
        assert 25 <= int(response.headers["retry-after"]) <= 31
    elif form == "huge":
        assert response.headers["retry-after"] == str(MAX_RETRY_AFTER)
    else:
        assert "retry-after" not in response.headers


def test_the_openai_sdk_reads_the_relayed_retry_after(proxy: Any, fake_upstream: FakeUpstream) -> None:
    import openai

    fake_upstream.enqueue(Reply(status=429, error_message="Slow down", headers={"retry-after": "3"}))
    client = openai.OpenAI(base_url=proxy.base_url, api_key="x", max_retries=0, timeout=20)
    with pytest.raises(openai.RateLimitError) as info:
        client.embeddings.create(model="test-model", input="x")
    assert info.value.response.headers["retry-after"] == "3"
