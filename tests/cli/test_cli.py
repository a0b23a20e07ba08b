"""The ``lcm-proxy`` command line: in this process (``tests.support.cli.main``) where a process proves nothing
more, the installed console script where it does (its entry point, serving, a closed pipe, fresh imports)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import REPO
from tests.support.cli import console_script, free_port, main, run
from tests.support.proxies import assert_doctor_passes, in_process, make_config


def test_version_and_help() -> None:
    from proxy import __version__

    assert run("--version").stdout.strip() == f"lcm-proxy {__version__}"  # the installed console script
    help_text = main("--help").stdout
    assert "serve" in help_text and "check-config" in help_text
    serve_help = main("serve", "--help").stdout
    for flag in ("--config", "--host", "--port", "--workers"):
        assert flag in serve_help


def test_help_and_import_do_not_load_litellm() -> None:
    # LiteLLM's import costs seconds and may try the network; the CLI's fast paths must never pay it.
    code = (
        "import sys, contextlib, io\n"
        "import proxy, proxy.app, proxy.cli.main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: proxy.cli.main.main(['--help'])\n"
        "    except SystemExit: pass\n"
        "    proxy.cli.main.main(['check-config', 'config/proxy.yaml'])\n"
        "print(sorted(m for m in ('litellm', 'openai', 'tiktoken') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_python_dash_m_entry_point() -> None:
    out = subprocess.run([sys.executable, "-m", "proxy", "--version"], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("lcm-proxy ")


def test_check_config_ok_and_error(tmp_path: Path, isolated_env: dict[str, str]) -> None:
    ok = main("check-config", "config/proxy.yaml", env=isolated_env)
    assert ok.returncode == 0 and "OK" in ok.stdout and "local" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_list:\n  - model_name: m\n    litellm_params: {model: x}\nlcm_settings:\n  fresh_tail: 3\n")
    result = main("check-config", str(bad), env=isolated_env)
    assert result.returncode == 1
    assert "lcm_settings.fresh_tail: unknown key" in result.stderr
    missing = main("check-config", str(tmp_path / "nope.yaml"), env=isolated_env)
    assert missing.returncode == 1 and "cannot read file" in missing.stderr


@pytest.fixture
def served(isolated_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str], Path]]:
    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [console_script(), "serve", "--config", "config/proxy.yaml", "--port", str(port)],
            cwd=REPO, env=isolated_env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                assert process.poll() is None, log_path.read_text()
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            yield url, process, log_path
        finally:
            process.terminate()
            process.wait(timeout=20)


def test_serve_example_config_answers_healthz(served: tuple[str, subprocess.Popen[str], Path], tmp_path: Path) -> None:
    url, _process, log_path = served
    health = httpx.get(f"{url}/healthz", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    models = httpx.get(f"{url}/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["local"]
    data_dir = tmp_path / "xdg" / "lcm-proxy"
    assert data_dir.is_dir() and (data_dir.stat().st_mode & 0o777) == 0o700
    log = log_path.read_text()
    assert "model local -> openai/local-model" in log
    assert str(data_dir) in log
    assert "127.0.0.1" in log


def test_serve_refuses_invalid_config(tmp_path: Path, isolated_env: dict[str, str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_list: []\n")
    result = main("serve", "--config", str(bad), env=isolated_env)
    assert result.returncode == 1 and "model_list" in result.stderr


def test_serve_never_prints_keys(tmp_path: Path, isolated_env: dict[str, str]) -> None:
    config = tmp_path / "keys.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: m\n"
        "    litellm_params: {model: openai/m, api_base: 'http://127.0.0.1:9/v1', api_key: os.environ/UP_KEY}\n"
        "general_settings:\n"
        "  host: 127.0.0.1\n"
        f"  port: {free_port()}\n"
        "  api_keys: [{key: os.environ/PROXY_KEY, tenant: me}]\n"
    )
    env = {**isolated_env, "UP_KEY": "sk-up-very-secret", "PROXY_KEY": "sk-proxy-very-secret"}
    process = subprocess.Popen(
        [console_script(), "serve", "--config", str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines: list[str] = []
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "Uvicorn running" in line or "Application startup complete" in line:
                break
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=20)
    text = "".join(lines) + out
    assert "authentication: 1 key(s)" in text
    assert "sk-up-very-secret" not in text and "sk-proxy-very-secret" not in text


@pytest.mark.parametrize("args", [["--help"], ["serve", "--help"]], ids=["help", "serve-help"])
def test_readme_shows_the_real_help(args: list[str]) -> None:
    """The help blocks of docs/operations.md are the program's own output (at 80 columns), so they cannot drift."""
    readme = (REPO / "docs" / "operations.md").read_text()
    shown = "$ lcm-proxy " + " ".join(args) + "\n"
    assert shown in readme
    block = readme.split(shown, 1)[1].split("```", 1)[0]
    env = {**os.environ, "COLUMNS": "80"}
    assert block == main(*args, env=env).stdout


# --- Found trying it as a new user would -------------------------------------------------------------------


def test_check_config_shows_each_models_window_and_where_it_came_from(
    tmp_path: Path, isolated_env: dict[str, str]
) -> None:
    config = tmp_path / "models.yaml"
    config.write_text(
        "model_list:\n"
        "  - {model_name: local, litellm_params: {model: openai/local, api_base: 'http://127.0.0.1:9/v1'},"
        " model_info: {max_input_tokens: 8192}}\n"
        "  - {model_name: typo, litellm_params: {model: openai/my-local-model}, model_info: {max_input_token: 4096}}\n"
        "  - {model_name: gpt-4o, litellm_params: {model: openai/gpt-4o}}\n"
        "lcm_settings: {default_context_window: 32768}\n"
    )
    result = main("check-config", str(config), env=isolated_env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "model local -> openai/local at http://127.0.0.1:9/v1" in out
    assert "window:      8,192 tokens (model_info.max_input_tokens)" in out
    assert "window:      32,768 tokens (lcm_settings.default_context_window)" in out  # the typo's fallback, visible
    assert "window:      128,000 tokens (LiteLLM's model map; set model_info.max_input_tokens)" in out
    assert "reserve:     2,048 tokens for the answer without max_tokens" in out  # a quarter of 8,192
    local = out.split("model local", 1)[1].split("model typo", 1)[0]
    soft, target = (int(n.replace(",", "")) for n in re.findall(r"above ([\d,]+) tokens.*down to ([\d,]+)", local)[0])
    large = int(re.findall(r"large files: over ([\d,]+) tokens", local)[0].replace(",", ""))
    tool = int(re.findall(r"tool results: over ([\d,]+) tokens", local)[0].replace(",", ""))
    assert 0 < target < soft < 8192 - 2048 and 0 < tool <= large < 8192
    assert "model_list[1].model_info.max_input_token: unknown key; did you mean max_input_tokens?" in result.stderr


def test_check_config_refuses_a_summary_model_no_request_could_reach(
    tmp_path: Path, isolated_env: dict[str, str]
) -> None:
    config = tmp_path / "summary.yaml"
    config.write_text(
        "model_list: [{model_name: chat, litellm_params: {model: openai/chat}}]\n"
        "lcm_settings: {summary_model: summarizer}\n"
    )
    for command in (["check-config", str(config)], ["serve", "--config", str(config)]):
        result = main(*command, env=isolated_env)
        assert (
            result.returncode == 1 and "lcm_settings.summary_model: 'summarizer' is not a model_name" in result.stderr
        )


def test_workers_must_be_at_least_one(isolated_env: dict[str, str]) -> None:
    result = main("serve", "--workers", "0", "--config", "does-not-exist.yaml", env=isolated_env)
    assert result.returncode == 2 and "argument --workers: must be at least 1, got 0" in result.stderr


@pytest.fixture(scope="module")
def stored(
    fake_upstream_server: tuple[Any, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, str]]:
    """A database with one conversation of 2,001 messages (its ``show`` and ``export`` outputs, 200 KB and
    more, are far larger than a pipe's buffer), sent under the client's own key ``client-key-7``.

    Written once for the module (ingesting 2,001 messages was most of each of these tests' time): the tests
    given it only read it (``show``, ``export``, ``grep``, ``conversations``, ``doctor`` without ``--repair``;
    ``compact`` is refused for its missing key before it opens the store). The proxy that wrote it is closed
    before they run, as a test's own proxy is closed before the next test, and doctor checks the database
    after the last of them."""
    config = make_config(fake_upstream_server[1], tmp_path_factory.mktemp("stored") / "data")
    with in_process(config) as proxy:
        messages: list[dict[str, str]] = []
        for i in range(1000):
            messages += [
                {"role": "user", "content": f"question {i}: " + "what about this one " * 4},
                {"role": "assistant", "content": f"answer {i}: " + "it is fine " * 4},
            ]
        messages.append({"role": "user", "content": "and now?"})
        response = proxy.client.post(
            f"{proxy.base_url}/chat/completions",
            json={"model": "test-model", "messages": messages},
            headers={"x-lcm-conversation-id": "client-key-7"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
    yield Path(str(config.general_settings.data_dir)), response.headers["x-lcm-conversation-id"]
    assert_doctor_passes([config.general_settings.location()])


@pytest.mark.parametrize("command", ["show", "export"])
def test_a_closed_pipe_ends_quietly(stored: tuple[Path, str], command: str) -> None:
    """``lcm-proxy show ID | head -1``: the reader goes away, the command stops like a unix tool (exit 141,
    as if by SIGPIPE), with no "Broken pipe" message and no traceback."""
    data_dir, conversation = stored
    process = subprocess.Popen(
        [console_script(), command, conversation, "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    assert first.strip()
    process.stdout.close()  # like head -1: the rest of the output has nowhere to go
    errors = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, errors
    assert errors == ""


def test_operator_commands_need_no_secret_they_do_not_use(
    stored: tuple[Path, str], tmp_path: Path, isolated_env: dict[str, str]
) -> None:
    data_dir, conversation = stored
    # No config at all: --data-dir.
    listed = main("conversations", "--data-dir", str(data_dir), env=isolated_env)
    assert listed.returncode == 0 and conversation in listed.stdout, listed.stderr
    doctor = main("doctor", "--data-dir", str(data_dir), env=isolated_env)
    assert doctor.returncode == 0 and doctor.stdout.strip().endswith("OK"), doctor.stdout + doctor.stderr
    # A config whose secrets this shell does not have: reading the database needs none of them.
    config = tmp_path / "secrets.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: test-model\n"
        "    litellm_params: {model: openai/fake-model, api_key: os.environ/UNSET_UPSTREAM_KEY}\n"
        f"general_settings:\n  data_dir: '{data_dir}'\n  api_keys: [os.environ/UNSET_PROXY_KEY]\n"
    )
    for args in (
        ["show", conversation],
        ["export", conversation],
        ["grep", "answer 5", "--conversation", conversation],
    ):
        result = main(*args, "--config", str(config), env=isolated_env)
        assert result.returncode == 0 and result.stdout, (args, result.stderr)
    # compact calls the model: then its key is needed, and the error says which one.
    compact = main("compact", conversation, "--config", str(config), env=isolated_env)
    assert compact.returncode == 1
    assert "model_list[0].litellm_params.api_key: environment variable UNSET_UPSTREAM_KEY is not set" in compact.stderr
    assert "UNSET_PROXY_KEY" not in compact.stderr and "Traceback" not in compact.stderr


def test_show_accepts_the_clients_own_conversation_key(stored: tuple[Path, str], isolated_env: dict[str, str]) -> None:
    data_dir, conversation = stored
    shown = main("show", "client-key-7", "--data-dir", str(data_dir), env=isolated_env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"conversation {conversation}\n") and "key:           client-key-7" in shown.stdout
    grep = main("grep", "question 999", "--conversation", "client-key-7", "--data-dir", str(data_dir), env=isolated_env)
    assert grep.returncode == 0 and "question 999" in grep.stdout
    unknown = main("show", "no-such-key", "--data-dir", str(data_dir), env=isolated_env)
    assert unknown.returncode == 1 and "no conversation no-such-key" in unknown.stderr


def test_describe_refuses_an_end_line_before_the_start_line(tmp_path: Path, isolated_env: dict[str, str]) -> None:
    result = main(
        "describe", "file_x", "--start-line", "10", "--end-line", "5", "--data-dir", str(tmp_path), env=isolated_env
    )
    assert result.returncode == 2
    assert "lcm-proxy describe: error: --end-line 5 is before --start-line 10" in result.stderr
