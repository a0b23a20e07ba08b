"""The installed ``lcm-proxy`` console script, run as a real process."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def console_script() -> str:
    path = BIN / "lcm-proxy"
    found = str(path) if path.exists() else shutil.which("lcm-proxy")
    assert found, "the lcm-proxy console script is not installed (pip install -e '.[test]')"
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([console_script(), *args], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)


@pytest.fixture
def isolated_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "LCM_"))}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    return env


def test_version_and_help() -> None:
    from proxy import __version__

    assert run("--version").stdout.strip() == f"lcm-proxy {__version__}"
    help_text = run("--help").stdout
    assert "serve" in help_text and "check-config" in help_text
    serve_help = run("serve", "--help").stdout
    for flag in ("--config", "--host", "--port", "--workers"):
        assert flag in serve_help


def test_help_and_import_do_not_load_litellm() -> None:
    # LiteLLM's import costs seconds and may try the network; the CLI's fast paths must never pay it.
    code = (
        "import sys, contextlib, io\n"
        "import proxy, proxy.app, proxy.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: proxy.cli.main(['--help'])\n"
        "    except SystemExit: pass\n"
        "    proxy.cli.main(['check-config', 'config/proxy.yaml'])\n"
        "print(sorted(m for m in ('litellm', 'openai', 'tiktoken') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_python_dash_m_entry_point() -> None:
    out = subprocess.run([sys.executable, "-m", "proxy", "--version"], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("lcm-proxy ")


def test_check_config_ok_and_error(tmp_path: Path, isolated_env: dict[str, str]) -> None:
    ok = run("check-config", "config/proxy.yaml", env=isolated_env)
    assert ok.returncode == 0 and "OK" in ok.stdout and "local" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_list:\n  - model_name: m\n    litellm_params: {model: x}\nlcm_settings:\n  fresh_tail: 3\n")
    result = run("check-config", str(bad), env=isolated_env)
    assert result.returncode == 1
    assert "lcm_settings.fresh_tail: unknown key" in result.stderr
    missing = run("check-config", str(tmp_path / "nope.yaml"), env=isolated_env)
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
    result = run("serve", "--config", str(bad), env=isolated_env)
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
    """The README's help blocks are the program's own output (at 80 columns), so they cannot drift."""
    readme = (REPO / "README.md").read_text()
    shown = "$ lcm-proxy " + " ".join(args) + "\n"
    assert shown in readme
    block = readme.split(shown, 1)[1].split("```", 1)[0]
    env = {**os.environ, "COLUMNS": "80"}
    assert block == run(*args, env=env).stdout
