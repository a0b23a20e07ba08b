"""Anthropic's official TypeScript SDK (``@anthropic-ai/sdk`` on npm) as a test client: a pinned install and a
runner for small Node scripts that use it.

``sdk_dir()`` installs ``@anthropic-ai/sdk@ANTHROPIC_JS_VERSION`` once into
``${XDG_CACHE_HOME:-~/.cache}/lcm-proxy/npm/anthropic-sdk-<version>`` (``.ci/run`` does the same beforehand), under
a file lock so parallel test workers don't race; ``require_sdk()`` fails the test (never skips it) when it is
missing. ``run_node(script, env)`` runs a CommonJS script (``require("@anthropic-ai/sdk")``) with ``NODE_PATH``
pointing at the install and returns ``(returncode, stdout, stderr)``. The version is the newest that runs on
Node 20 (it declares no ``engines``; checked by running it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support.npm import pinned_install

ANTHROPIC_JS_VERSION = "1.14.0"
PACKAGE = "@anthropic-ai/sdk"
_why_missing: list[str] = []  # why the last sdk_dir() returned None


def cache_dir() -> Path:
    """Where the pinned version is installed (the folder ``.ci/run`` installs into)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lcm-proxy" / "npm" / f"anthropic-sdk-{ANTHROPIC_JS_VERSION}"


def _modules(prefix: Path) -> Path | None:
    """The install's ``node_modules`` when node loads the pinned SDK from it."""
    modules = prefix / "node_modules"
    node = shutil.which("node")
    manifest = modules / "@anthropic-ai" / "sdk" / "package.json"
    with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
        if node is None or json.loads(manifest.read_text()).get("version") != ANTHROPIC_JS_VERSION:
            return None
        probe = f'const {{ Anthropic }} = require("{PACKAGE}"); new Anthropic({{ apiKey: "k" }}); process.stdout.write("ok")'
        done = subprocess.run(
            [node, "-e", probe],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NODE_PATH": str(modules)},
        )
        if done.returncode == 0 and done.stdout == "ok":
            return modules
    return None


def sdk_dir() -> Path | None:
    """The ``node_modules`` holding the pinned SDK, installed on first use; None when node or npm is missing or
    the install failed (the reason in ``require_sdk``'s message)."""
    return pinned_install(cache_dir(), f"{PACKAGE}@{ANTHROPIC_JS_VERSION}", _modules, _why_missing)


def require_sdk() -> Path:
    """The SDK's ``node_modules``, or the test fails saying why (CI installs it first, so it must be there)."""
    found = sdk_dir()
    if found is None:
        reason = _why_missing[0] if _why_missing else "unknown reason"
        pytest.fail(f"{PACKAGE} {ANTHROPIC_JS_VERSION} is not installed in {cache_dir()}: {reason}", pytrace=False)
    return found


def run_node(script: str, env: Mapping[str, str], timeout: float = 120) -> tuple[int, str, str]:
    """Run ``script`` (CommonJS) with node, ``NODE_PATH`` at the pinned SDK, from an environment holding only
    ``PATH`` and ``env`` (the developer's own ``ANTHROPIC_*`` never reach it); (returncode, stdout, stderr)."""
    modules = require_sdk()
    node = shutil.which("node")
    assert node is not None  # require_sdk() ran it
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NODE_PATH": str(modules), **env}
    with tempfile.TemporaryDirectory(prefix="lcm-node-") as folder:
        path = Path(folder) / "script.cjs"
        path.write_text(script)
        done = subprocess.run(
            [node, str(path)], cwd=folder, env=full, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    return done.returncode, done.stdout, done.stderr
