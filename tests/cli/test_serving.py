"""What only a serving process does at startup: warm LiteLLM up without reaching anything, then freeze the
startup heap so full garbage collections stop walking LiteLLM's ~370,000 long-lived objects. And
``lcm-proxy serve`` itself: logging in every worker, "listening on" only once bound."""

from __future__ import annotations

import gc
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from proxy import __version__
from proxy.app import create_app
from tests.support.cli import Served, free_port
from tests.support.fakes import FakeUpstream
from tests.support.proxies import make_config


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield None
    gc.unfreeze()  # the rest of the suite keeps collecting normally


def test_serving_app_freezes_its_startup_heap_after_a_silent_warm_up(
    fake_upstream: FakeUpstream, upstream_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], unfrozen: None
) -> None:
    gc.unfreeze()
    config = make_config(upstream_url, tmp_path / "data", None, None)
    with TestClient(create_app(config, serving=True)) as client:
        frozen, tracked = gc.get_freeze_count(), len(gc.get_objects())
        assert frozen > 0 and frozen > tracked  # the startup heap is out of the collector's sight
        assert fake_upstream.requests == []  # the warm-up reached no upstream
        response = client.post(
            "/v1/chat/completions", json={"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert response.status_code == 200, response.text
    assert len(fake_upstream.requests) == 1
    printed = capfd.readouterr()
    assert "warm-up" not in printed.out + printed.err and "Traceback" not in printed.out + printed.err


def test_apps_built_for_tests_do_not_freeze(upstream_url: str, tmp_path: Path) -> None:
    gc.unfreeze()
    with TestClient(create_app(make_config(upstream_url, tmp_path / "data", None, None))) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() == 0


# --- lcm-proxy serve, as a real process -------------------------------------------------------------------


def serve_config(tmp_path: Path, port: int) -> Path:
    config = tmp_path / "serve.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: local\n"
        "    litellm_params: {model: openai/local-model, api_base: 'http://127.0.0.1:9/v1', api_key: os.environ/UP_KEY}\n"
        f"general_settings: {{port: {port}, data_dir: '{tmp_path / 'data'}'}}\n"
    )
    return config


@pytest.fixture
def serve_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "LCM_"))}
    return {**env, "UP_KEY": "sk-upstream-never-logged-42"}


def test_every_worker_logs_and_listening_is_said_once_bound(tmp_path: Path, serve_env: dict[str, str]) -> None:
    """``--workers 2``: each worker process logs its startup lines and its requests' lines in the proxy's
    format; "listening on" comes once the socket is bound; each model's upstream is named, never its key."""
    port = free_port()
    served = Served(serve_config(tmp_path, port), serve_env, "--workers", "2")
    try:
        started = served.wait_for("Application startup complete", count=2)
        assert sum("Application startup complete" in line for line in started) == 2, started
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "local", "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        assert response.status_code == 502
        served.wait_for("lcm_proxy.upstream")
    finally:
        log = served.stop()
    startup = [line for line in log.splitlines() if "lcm_proxy: model local -> " in line]
    assert len(startup) == 2, log  # one per worker
    assert all(line.endswith("model local -> openai/local-model at http://127.0.0.1:9/v1") for line in startup)
    assert any(" INFO lcm_proxy.upstream: " in line for line in log.splitlines()), log  # a request's line
    listening = [i for i, line in enumerate(log.splitlines()) if f"listening on http://127.0.0.1:{port}" in line]
    bound = [i for i, line in enumerate(log.splitlines()) if "Uvicorn running on" in line]
    assert len(listening) == 1 and bound and bound[0] < listening[0], log
    assert "sk-upstream-never-logged-42" not in log


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_never_says_listening(tmp_path: Path, serve_env: dict[str, str], workers: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        served = Served(serve_config(tmp_path, port), serve_env, "--workers", workers)
        served.wait_for("<exited>")
        log = served.stop()
    assert served.process.returncode != 0
    assert "address already in use" in log.lower(), log
    assert "listening on" not in log, log


def test_single_process_says_listening_after_the_bind(tmp_path: Path, serve_env: dict[str, str]) -> None:
    port = free_port()
    served = Served(serve_config(tmp_path, port), serve_env)
    try:
        lines = served.wait_for("listening on")
    finally:
        log = served.stop()
    bound = next(i for i, line in enumerate(lines) if "Uvicorn running on" in line)
    listening = next(
        i for i, line in enumerate(lines) if f"lcm-proxy {__version__} listening on http://127.0.0.1:{port}" in line
    )
    assert bound < listening, log
    assert "model local -> openai/local-model at http://127.0.0.1:9/v1" in log


def test_a_dead_worker_is_replaced_and_said_at_warning(tmp_path: Path, serve_env: dict[str, str]) -> None:
    """``--workers 2``: a worker process that dies (here SIGKILLed) is replaced, the proxy goes on serving,
    and the log says so at WARNING, which an operator at the default level sees (uvicorn says it at INFO)."""
    port = free_port()
    served = Served(serve_config(tmp_path, port), serve_env, "--workers", "2")
    try:
        lines = served.wait_for("Application startup complete", count=2)
        pids = [int(line.split("[")[1].split("]")[0]) for line in lines if "Started server process [" in line]
        assert len(pids) == 2, lines
        try:
            os.kill(pids[0], signal.SIGKILL)
        except ProcessLookupError:
            raise AssertionError("\n".join(lines)) from None
        lines = served.wait_for("died or stopped answering")
        replaced = [line for line in lines if "died or stopped answering" in line]
        assert len(replaced) == 1 and " WARNING " in replaced[0] and f"process {pids[0]} " in replaced[0], lines
        served.wait_for("Application startup complete", count=3)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    finally:
        served.stop()
