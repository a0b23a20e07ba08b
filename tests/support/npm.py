"""A pinned npm package installed once into a cache folder, for the real JavaScript clients of the tests (Claude
Code, Anthropic's TypeScript SDK): under a file lock, so parallel test workers don't race, and checked by the
caller's own probe before and after (``.ci/run`` installs the same folders beforehand)."""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pinned_install(prefix: Path, spec: str, probe: Callable[[Path], Path | None], why: list[str]) -> Path | None:
    """``probe(prefix)`` once ``spec`` (``name@version``) is installed there; None when node or npm is missing
    or the install failed, the reason appended to ``why``."""
    why.clear()
    found = probe(prefix)
    if found is not None:
        return found
    with locked(prefix.parent / f"{prefix.name}.lock"):
        found = probe(prefix)  # another worker may have installed it while this one waited
        if found is not None:
            return found
        npm = shutil.which("npm")
        if npm is None or shutil.which("node") is None:
            why.append("node or npm is not on PATH")
            return None
        prefix.mkdir(parents=True, exist_ok=True)
        command = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", spec]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as error:
            why.append(f"{' '.join(command)} failed: {error}")
            return None
        found = probe(prefix)
        if found is None:
            tail = (done.stdout + done.stderr)[-2000:]
            why.append(f"{' '.join(command)} exited {done.returncode}, and what it installed does not run:\n{tail}")
        return found
