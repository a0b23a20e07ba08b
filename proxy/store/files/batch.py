"""The payloads of one request: written to a private pending folder and made durable there, then published
(renamed into place) by the write transaction that stores the rows naming them, before it commits; a request
that fails before that deletes its pending files and leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from proxy.store.files.disk import private_dir, sync

if TYPE_CHECKING:
    from proxy.store.base import Writes


class Addresses(Protocol):
    """What a batch needs of its ``FileStore`` (``proxy.store.files.store``, which makes the batches)."""

    data_dir: Path
    root: Path
    pending_dir: Path

    def digest(self, data: bytes) -> str: ...
    def relative_path(self, scope: str, sha256: str) -> str: ...
    def prepare_pending(self) -> None: ...


class BatchClosedError(Exception):
    """The request gave up on its batch (its pending files are gone) while its transaction still ran."""


class FileBatch:
    """The payloads of one request: ``add`` (cheap, any thread), ``write`` to the pending folder, ``publish``
    the ones a transaction stores, ``discard`` the rest. ``write``, ``publish`` and ``discard`` block: call
    them in a worker thread, once per batch of files (never once per file on the event loop)."""

    def __init__(self, store: Addresses, scope: str) -> None:
        self.store = store
        self.scope = scope
        self._lock = threading.Lock()
        self._located: dict[str, tuple[str, str]] = {}  # file id -> (sha256, relative path)
        self._queued: dict[str, bytes] = {}  # relative path -> content, not written yet
        self._pending: dict[str, Path] = {}  # relative path -> durable pending file, not published yet
        self._contents: dict[str, bytes] = {}  # relative path -> content, for a stored file that went missing
        self._closed = False
        self.holds_files = False  # anything was ever added: then discard() must run when the request is done

    def add(self, data: bytes, file_id: str | None = None) -> tuple[str, str]:
        """Queue ``data`` for writing unless this batch has it already; return (sha256, relative path)."""
        sha = self.store.digest(data)
        relative = self.store.relative_path(self.scope, sha)
        with self._lock:
            self.holds_files = True
            if relative not in self._pending:
                self._queued.setdefault(relative, data)
            self._contents.setdefault(relative, data)
            if file_id is not None:
                self._located[file_id] = (sha, relative)
        return sha, relative

    def location(self, file_id: str) -> tuple[str, str] | None:
        return self._located.get(file_id)

    @property
    def unwritten(self) -> bool:
        return bool(self._queued)

    def write(self) -> None:
        """Write what was queued to the pending folder, durably. Content the scope already has (published
        by an earlier request) is not written again."""
        with self._lock:
            if self._closed:
                raise BatchClosedError("this request's files were discarded")
            queued, self._queued = self._queued, {}
            todo = {r: d for r, d in queued.items() if not (self.store.data_dir / r).is_file()}
            if todo:
                self._pending.update(self._write_pending(todo))

    def _write_pending(self, todo: dict[str, bytes]) -> dict[str, Path]:
        self.store.prepare_pending()
        written: dict[str, Path] = {}
        try:
            for relative, data in todo.items():
                path = self.store.pending_dir / secrets.token_hex(16)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
                written[relative] = path
                with os.fdopen(fd, "wb") as handle:
                    os.fchmod(handle.fileno(), 0o600)  # whatever the umask
                    handle.write(data)
            # Durable before it can be published: a published file is trusted by its name for ever.
            sync(written.values(), self.store.pending_dir)
        except BaseException:
            for path in written.values():
                path.unlink(missing_ok=True)
            raise
        return written

    async def publish(self, tx: Writes, paths: Sequence[str]) -> None:
        """Publish ``paths`` inside ``tx`` (the files are renamed into place just before it commits)."""
        await asyncio.to_thread(self.publish_now, paths)

    def publish_now(self, relatives: Iterable[str]) -> None:
        """Rename these paths' pending files into place, durably (call before the rows referring to them
        commit). Paths this batch did not write were published before and are left as they are."""
        with self._lock:
            if self._closed:
                raise BatchClosedError("this request's files were discarded before its transaction published them")
            if self._queued:
                raise RuntimeError("publish() before write(): some payloads are not on disk yet")
            relatives = list(dict.fromkeys(relatives))
            # Content found stored before this transaction began may have been a leftover that doctor --repair
            # deleted since (it had no row then): it is written again, so that no committed row names a
            # missing file.
            gone = {
                r: self._contents[r]
                for r in relatives
                if r not in self._pending and r in self._contents and not (self.store.data_dir / r).is_file()
            }
            if gone:
                self._pending.update(self._write_pending(gone))
            moves = [(r, self._pending[r]) for r in relatives if r in self._pending]
            if not moves:
                return
            folders: dict[Path, None] = {}
            for relative, _ in moves:
                folders.setdefault((self.store.data_dir / relative).parent)
            private_dir(self.store.root)
            for folder in folders:
                private_dir(folder)
            for relative, path in moves:
                os.replace(path, self.store.data_dir / relative)  # atomic: readers see the whole file or none
                del self._pending[relative]
            sync([*folders, self.store.root])  # at most 257 folders; this runs inside the write transaction

    def discard(self) -> None:
        """Delete the pending files that were not published. Published files stay (others may use them)."""
        with self._lock:
            self._closed = True
            self._queued.clear()
            self._contents.clear()
            pending, self._pending = self._pending, {}
        for path in pending.values():
            path.unlink(missing_ok=True)
