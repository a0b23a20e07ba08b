"""LiteLLM's own proxy server as an overhead comparator: its own virtualenv, its own process, no database.

``litellm[proxy]`` pins conflict with this project's dependencies, so it lives in ``.bench/litellm-proxy-venv``
(git-ignored), at the same LiteLLM version as the project's virtualenv. The full benchmark creates it when it
is missing (``python -m venv`` + ``pip install``; a few minutes, once); ``--quick`` never does. When it cannot
be created (no package index reachable, say) the comparator is skipped with a note, never a crash.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".bench" / "litellm-proxy-venv"
# Written only after a successful install: a venv without it is half-made (an interrupted pip) and is rebuilt.
MARKER = VENV / "bench-installed-litellm-version"
INSTALL_LOG = VENV.parent / "litellm-proxy-install.log"

READY_PATH = "/health/liveliness"  # LiteLLM proxy has no /healthz; this one needs no key and no database
STARTUP_TIMEOUT = 180.0  # seconds: it imports all of LiteLLM and FastAPI; ~6 s on a quiet 2-core machine

# The offline, quiet, production mode of its own docs: no price-list download, error-level logs only (which
# also silences uvicorn's access log), no .env loading, no feedback banner.
ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOG": "ERROR",
    "LITELLM_MODE": "PRODUCTION",
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "True",
    # Its /v1/messages on an openai/ deployment goes to OpenAI's Responses API (/v1/responses) by default, which
    # the fake does not serve; this switch sends it to /v1/chat/completions, the translation lcm-proxy's Messages
    # door makes too. (As ``litellm_settings.use_chat_completions_url_for_anthropic_messages`` in the config it
    # did not take effect at 1.106.12: the requests still went to /v1/responses.)
    "LITELLM_USE_CHAT_COMPLETIONS_URL_FOR_ANTHROPIC_MESSAGES": "True",
}


def wanted_version() -> str:
    """The LiteLLM version of the project's virtualenv: both proxies then run the same SDK code."""
    return importlib.metadata.version("litellm")


def executable(create: bool) -> tuple[Path | None, str]:
    """The comparator's ``litellm`` command, or None and why it is skipped.

    With ``create`` False (``--quick``) an existing venv is used whatever its version, and a missing one is
    not created, so smoke tests stay fast and offline.
    """
    installed = MARKER.read_text().strip() if MARKER.exists() else None
    if installed is not None and (installed == wanted_version() or not create):
        return VENV / "bin" / "litellm", ""
    if not create:
        return None, f"LiteLLM proxy skipped: --quick does not create {VENV.relative_to(REPO)} (a full run does)"
    return install(wanted_version())


def install(version: str) -> tuple[Path | None, str]:
    requirement = f"litellm[proxy]=={version}"
    print(f"\ncreating {VENV.relative_to(REPO)}: pip install '{requirement}' (once; a few minutes) ...", flush=True)
    VENV.parent.mkdir(exist_ok=True)
    steps = [
        # The project's interpreter (not whatever ``python3`` is on PATH): the same Python version for both.
        ("python -m venv", [sys.executable, "-m", "venv", "--clear", str(VENV)]),
        ("pip install", [str(VENV / "bin" / "python"), "-m", "pip", "install", requirement]),
    ]
    failed = f"LiteLLM proxy skipped: could not create its virtualenv (see {INSTALL_LOG}):"
    try:
        with INSTALL_LOG.open("w") as log:
            for label, step in steps:
                if subprocess.run(step, stdout=log, stderr=subprocess.STDOUT, timeout=1800).returncode != 0:
                    return None, f"{failed} {label} failed"
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"{failed} {error}"
    MARKER.write_text(version + "\n")
    return VENV / "bin" / "litellm", ""


def write_config(path: Path, upstream: str, models: list[str], deployments: list[dict[str, Any]]) -> None:
    """``models`` (``openai/``) and ``deployments`` (whole ``model_list`` entries) pointing at the fake upstream;
    no master key, no database, nothing logged or tracked."""

    def deployment(name: str) -> dict[str, Any]:
        # max_retries 0: the same as lcm-proxy and the bare forwarder (retries never fire here anyway).
        params = {"model": f"openai/{name}", "api_base": f"{upstream}/v1", "api_key": "k-12345678", "max_retries": 0}
        return {"model_name": name, "litellm_params": params}

    config: dict[str, Any] = {
        "model_list": [*(deployment(name) for name in models), *deployments],
        "litellm_settings": {
            # Its production checklist: verbose logging off. No callbacks are configured at all.
            "set_verbose": False,
            "request_timeout": 60,
            "num_retries": 0,
        },
        "general_settings": {
            # Spend and error logs go to the database, which there is none of; off anyway, as the docs advise.
            "disable_spend_logs": True,
            "disable_error_logs": True,
            # Since 1.10x it refuses to start without a master key; this is its documented local-use switch.
            # lcm-proxy runs without API keys here too, so neither side authenticates requests.
            "dangerously_permit_weak_or_unset_master_key": True,
        },
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def command(exe: Path, config: Path, port: int) -> list[str]:
    # One uvicorn worker, like every other server measured (the machine has 2 cores, one is the client's).
    return [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
