"""Payload files a killed writer leaves behind (pending, or written with no row naming them), and a stored
conversation beside them: what doctor, repair and the startup collection work on."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from proxy.store.files import PENDING
from tests.support import REPO
from tests.support.engine import open_engine, run, user
from tests.support.transcripts import blocks

PENDING_CONTENT = b"half of a request's payload " * 40  # 1,120 bytes


UNCOMMITTED_CONTENT = b"published, but its rows never committed " * 25  # 1,000 bytes


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from proxy.store.files import FileStore

files = FileStore(Path(sys.argv[1]))
pending = files.batch("t")
pending.add(bytes.fromhex(sys.argv[2]))
pending.write()  # written to the pending folder; the request never got to its transaction
uncommitted = files.batch("t")
_, relative = uncommitted.add(bytes.fromhex(sys.argv[3]))
uncommitted.write()
uncommitted.publish_now([relative])  # renamed into place inside a transaction that never committed
(files.data_dir / relative).with_name(".tmp-0123abcd").write_bytes(b"x" * 10)  # an older version's temp file
print(relative, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def killed_writer(data_dir: Path, partial: bytes = PENDING_CONTENT, uncommitted: bytes = UNCOMMITTED_CONTENT) -> str:
    """Run a process that leaves a pending file, a stored file without a row and a legacy temporary file, and
    SIGKILL it; the path of the stored file."""
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(data_dir), partial.hex(), uncommitted.hex()],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.stdout.strip()


def stored_conversation(data_dir: Path) -> tuple[str, list[dict[str, str]]]:
    """A conversation whose document is a stored file (a row, its file): what repair must never touch."""
    transcript = [user(blocks(1, "minutes"))]

    async def scenario() -> str:
        async with open_engine(data_dir, large=100) as (ingestor, _store, _):
            result = await ingestor.ingest("t", transcript)
            assert result.conversation_id is not None
            return result.conversation_id

    conversation = run(scenario())
    gc.collect()  # its FileStore is gone, and with it this process's hold on the writers' lock
    return conversation, transcript


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def pending(data_dir: Path) -> list[Path]:
    folder = data_dir / "files" / PENDING
    return sorted(folder.iterdir()) if folder.exists() else []
