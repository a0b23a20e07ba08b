"""The ``lcm-proxy`` command line, two ways: ``run`` spawns the installed console script (for what needs a
process of its own: signals, kills, serving, a closed pipe, what a fresh interpreter imports), ``main`` calls
``proxy.cli.main.main(argv)`` in this process with the environment, working directory, standard streams and
audit logger a spawned command would have had, and answers the same ``CompletedProcess``."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from unittest import mock

from proxy.cli.main import main as cli_main
from tests.support import REPO

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


class Served:
    """``lcm-proxy serve`` in a subprocess; its log lines (stderr) collected by a thread as they come."""

    def __init__(self, config: Path, env: dict[str, str], *args: str) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            [console_script(), "serve", "--config", str(config), *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("<exited>")
            self._changed.notify_all()

    def wait_for(self, text: str, count: int = 1, timeout: float = 90) -> list[str]:
        """The lines so far, once ``count`` of them contain ``text`` (or the process has exited)."""
        with self._changed:
            self._changed.wait_for(
                lambda: sum(text in line for line in self.lines) >= count or "<exited>" in self.lines, timeout
            )
            return list(self.lines)

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)
        return "\n".join(self.wait_for("<exited>"))


@contextlib.contextmanager
def _fresh_audit_logger() -> Iterator[None]:
    """The handler a deleting command gives ``lcm_proxy.audit`` writes to that command's stderr: taken off
    afterwards, as a process's would go with it."""
    audit = logging.getLogger("lcm_proxy.audit")
    handlers, level = list(audit.handlers), audit.level
    try:
        yield
    finally:
        audit.handlers[:] = handlers
        audit.setLevel(level)


def main(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO, stdin: str | IO[str] = ""
) -> subprocess.CompletedProcess[str]:
    """``lcm-proxy ARGS`` in this process: ``env`` replaces the environment when given (as ``run``'s does),
    stdin reads ``stdin`` (a text, not a terminal; or an open file such as a pseudo-terminal), and argparse's
    exits are the return code."""
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, env or {}, clear=env is not None))
        stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(_fresh_audit_logger())
        stack.enter_context(mock.patch.object(sys, "stdin", io.StringIO(stdin) if isinstance(stdin, str) else stdin))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = cli_main(list(args))
        except SystemExit as exit_:  # argparse: --help, --version, usage errors
            code = exit_.code if isinstance(exit_.code, int) else 0
        out.flush()
        err.flush()
    texts = [stream.buffer.getvalue().decode() for stream in (out, err)]
    return subprocess.CompletedProcess(["lcm-proxy", *args], code, *texts)
