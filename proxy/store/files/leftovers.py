"""Leftovers of processes that died mid-request, and the writers' lock that makes collecting them safe.

Every process that writes payloads holds a shared lock on ``lcm.writers.lock`` from its first write until it
exits; whoever gets the exclusive lock knows no write is in flight, so every pending file it finds is a
leftover. Without the lock, only files older than ``PENDING_MAX_AGE`` count. A stored file no row names is
deleted only inside a write transaction that re-checks the rows (``forget``). The package's docstring
(``proxy.store.files``) gives the whole rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.store.errors import UnsafePathError
from proxy.store.files.disk import DiskFile, disk_file, folder_entries, private_dir

if TYPE_CHECKING:
    from proxy.store.base import Writes

try:
    import fcntl
except ImportError:  # not POSIX: no lock, so no process ever counts as alone with the files
    fcntl = None  # type: ignore[assignment]

PENDING = ".pending"  # under the files root: same file system, so publishing is an atomic rename
PENDING_MAX_AGE = 600.0  # seconds: pending files this old belong to a process that died mid-request
WRITERS = "lcm.writers.lock"  # in the data directory: the lock every process that writes payloads holds (shared)
LEGACY_TEMP = ".tmp-"  # the prefix of temporary files next to their final name, before the pending folder


class Leftovers:
    """The part of ``FileStore`` that knows about other processes: the writers' lock and their leftovers."""

    data_dir: Path
    root: Path
    pending_dir: Path
    _swept: bool
    _setup: threading.Lock

    def sweep_pending(self, max_age: float = PENDING_MAX_AGE) -> int:
        """Delete pending files left by a process that died mid-request; return how many."""
        removed = 0
        cutoff = time.time() - max_age
        try:
            entries = list(os.scandir(self.pending_dir))
        except FileNotFoundError:
            return 0
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                pass
        return removed

    def prepare_pending(self) -> None:
        for folder in (self.root, self.pending_dir):
            private_dir(folder)
        with self._setup:
            if self._swept:
                return
            self._swept = True
            # This process's first write: from now on it holds the writers' lock (shared). Pending files left by
            # processes that died mid-request go first: all of them when no other process writes here.
            if fcntl is None:
                self.sweep_pending()
                return
            fd = self._writers_lock()
            weakref.finalize(self, os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                alone = True
            except BlockingIOError:
                alone = False
            self.sweep_pending(0.0 if alone else PENDING_MAX_AGE)
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits while doctor --repair holds it exclusively

    @contextlib.contextmanager
    def alone(self) -> Iterator[bool]:
        """Whether no process is writing payloads here (True: none can start until the block ends; False: one
        may be, its files in flight). For ``doctor``, which itself never writes payloads."""
        if fcntl is None or not self.root.is_dir():  # no lock, or nothing was ever written here
            yield fcntl is not None
            return
        fd = self._writers_lock()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the lock

    def _writers_lock(self) -> int:
        fd = os.open(self.data_dir / WRITERS, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        os.fchmod(fd, 0o600)
        return fd

    def partial_files(self) -> list[DiskFile]:
        """Pending files, and temporary files of older versions next to stored ones: none is ever read."""
        found = [disk_file(e, self.data_dir) for e in folder_entries(self.pending_dir)]
        for folder in self._content_folders():
            found += [disk_file(e, self.data_dir) for e in folder_entries(folder) if e.name.startswith(LEGACY_TEMP)]
        return [f for f in found if f is not None]

    def stored_files(self) -> list[DiskFile]:
        """Every file in the content folders (``files/ab/...``): what rows may name."""
        found = []
        for folder in self._content_folders():
            found += [disk_file(e, self.data_dir) for e in folder_entries(folder) if not e.name.startswith(LEGACY_TEMP)]
        return [f for f in found if f is not None]

    def _content_folders(self) -> list[Path]:
        return sorted(
            Path(e.path)
            for e in folder_entries(self.root)
            if len(e.name) == 2 and all(c in "0123456789abcdef" for c in e.name) and e.is_dir(follow_symlinks=False)
        )

    def remove(self, relative: str) -> bool:
        """Delete a leftover file (a path from ``partial_files`` or ``stored_files``); whether it was there."""
        path = self.data_dir / relative
        if self.root.resolve() not in path.parent.resolve().parents:
            raise UnsafePathError("file path leaves the files folder")
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    async def forget(self, tx: Writes, paths: Sequence[str]) -> int:
        """Delete the stored files at ``paths`` that no row names, in ``tx`` as ``repair_files`` does (see above)."""
        named = await tx.known_file_paths(list(paths)) if paths else set()
        doomed = [path for path in dict.fromkeys(paths) if path not in named]
        return sum(await asyncio.to_thread(lambda: [self.remove(path) for path in doomed]))
