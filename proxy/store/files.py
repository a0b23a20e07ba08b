"""Payload files under the data directory, content-addressed per tenant.

A payload lives at ``files/ab/<address>``, where the address is ``sha256(tenant NUL sha256(content))``: a tenant
only ever deduplicates against its own files, so whether a write happens (and how long it takes) tells it
nothing about what other tenants stored. The ``files`` table keeps the content hash (doctor checks content
against it) and the path, so rows written under another layout stay valid.

Writes go through a ``FileBatch``, one per request: new payloads are written to a private pending folder
and made durable there, then *published* (renamed into place) by the write transaction that stores the rows
referring to them, before it commits; a request that fails before that deletes its pending files and
leaves nothing behind. A published file is never deleted that way: another request of the same tenant may
refer to the same content. Files are 0600 in 0700 folders. Reads resolve the path and refuse anything that
leaves the files root, symlinks included: a path comes from the database, and a database is not trusted to
be untampered.

Leftovers: a process killed between writing a pending file and its request's end leaves that file behind, and
one killed between publishing and committing leaves a stored file that no row names. Neither is ever read;
``lcm-proxy doctor`` reports them and ``doctor --repair`` deletes them, and every server start deletes those
older than any request can have been writing them (``proxy.engine.doctor.collect_leftovers``, in the background). The
rule that keeps this safe while a server runs: every process that writes payloads holds a shared lock on
``lcm.writers.lock`` from its first write until it exits (the kernel drops it when the process dies), so
whoever gets the exclusive lock knows no write is in flight, and every leftover it finds is one. Without it,
only files older than ``PENDING_MAX_AGE`` count (no request holds its files that long). A stored file without
a row is deleted only inside a write transaction that re-checks the rows (a publish happens inside its rows'
transaction, so none is half-done then); and a request that found its content already stored, before its
transaction began, checks in that transaction that the file is still there and writes it again if it is not. A
new process's first write also deletes the pending files of dead ones (all of them when it is alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import hashlib
import os
import secrets
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.store.errors import UnsafePathError

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
SYNCFS_BATCH = 16  # from this many files on, one syncfs(2) instead of an fsync per file (Linux)


class BatchClosedError(Exception):
    """The request gave up on its batch (its pending files are gone) while its transaction still ran."""


@functools.cache
def _syncfs() -> Callable[[int], int] | None:
    try:
        function: Callable[[int], int] = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    return function


def _private_dir(folder: Path) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)


def _sync(paths: Iterable[Path], anchor: Path | None = None) -> None:
    """Make ``paths`` (files or folders) durable: fsync each, or (given an ``anchor``) one syncfs of its file
    system when there are many. syncfs also waits for other processes' writes: not for use under a lock."""
    paths = list(paths)
    syncfs = _syncfs() if len(paths) >= SYNCFS_BATCH else None
    if anchor is not None and syncfs is not None:
        fd = os.open(anchor, os.O_RDONLY)
        try:
            if syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class DiskFile:
    relative: str  # to the data directory, as ``files.path`` names it
    bytes: int
    mtime: float


def _disk_file(entry: os.DirEntry[str], data_dir: Path) -> DiskFile | None:
    try:
        if not entry.is_file(follow_symlinks=False):
            return None
        info = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None
    return DiskFile(Path(entry.path).relative_to(data_dir).as_posix(), info.st_size, info.st_mtime)


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []


class FileStore:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.root = data_dir / "files"
        self.pending_dir = self.root / PENDING
        self._swept = False
        self._setup = threading.Lock()

    @staticmethod
    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    @staticmethod
    def address(tenant: str, sha256: str) -> str:
        """Where ``tenant``'s copy of the content hashed ``sha256`` lives (like ``file_id_for``, per tenant)."""
        return hashlib.sha256(f"{tenant}\x00{sha256}".encode()).hexdigest()

    def relative_path(self, tenant: str, sha256: str) -> str:
        address = self.address(tenant, sha256)
        return f"files/{address[:2]}/{address}"

    def batch(self, tenant: str) -> FileBatch:
        return FileBatch(self, tenant)

    def put(self, tenant: str, data: bytes) -> tuple[str, str]:
        """Store ``data`` for ``tenant`` now (blocking); return (sha256, path relative to the data dir)."""
        batch = self.batch(tenant)
        try:
            sha, relative = batch.add(data)
            batch.write()
            batch.publish_now([relative])
        finally:
            batch.discard()
        return sha, relative

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

    def _prepare_pending(self) -> None:
        for folder in (self.root, self.pending_dir):
            _private_dir(folder)
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
        found = [_disk_file(e, self.data_dir) for e in _entries(self.pending_dir)]
        for folder in self._content_folders():
            found += [_disk_file(e, self.data_dir) for e in _entries(folder) if e.name.startswith(LEGACY_TEMP)]
        return [f for f in found if f is not None]

    def stored_files(self) -> list[DiskFile]:
        """Every file in the content folders (``files/ab/...``): what rows may name."""
        found = []
        for folder in self._content_folders():
            found += [_disk_file(e, self.data_dir) for e in _entries(folder) if not e.name.startswith(LEGACY_TEMP)]
        return [f for f in found if f is not None]

    def _content_folders(self) -> list[Path]:
        return sorted(
            Path(e.path)
            for e in _entries(self.root)
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

    def resolve(self, relative: str) -> Path:
        if not relative or os.path.isabs(relative) or "\x00" in relative:
            raise UnsafePathError("file path must be relative to the data directory")
        candidate = self.data_dir / relative
        root = self.root.resolve()
        resolved = candidate.resolve()
        if root not in resolved.parents:
            raise UnsafePathError("file path leaves the data directory")
        # Reject a symlink anywhere between the root and the file.
        probe = candidate
        while probe != self.data_dir and probe != probe.parent:
            if probe.is_symlink():
                raise UnsafePathError("file path contains a symbolic link")
            probe = probe.parent
        return resolved

    def read(self, relative: str) -> bytes:
        return self.resolve(relative).read_bytes()

    async def load(self, path: str) -> bytes:
        return await asyncio.to_thread(self.read, path)

    async def check(self, files: Sequence[tuple[str, str, str]], *, verify_hashes: bool) -> list[str]:
        return await asyncio.to_thread(self._check, files, verify_hashes)

    def _check(self, files: Sequence[tuple[str, str, str]], verify_hashes: bool) -> list[str]:
        problems: list[str] = []
        for file_id, path, sha in files:
            try:
                resolved = self.resolve(path)
            except UnsafePathError as error:
                problems.append(f"{file_id}: unsafe path {path!r} ({error})")
                continue
            if not resolved.is_file():
                problems.append(f"{file_id}: file {path} is missing")
                continue
            mode = stat.S_IMODE(resolved.stat().st_mode)
            if mode != 0o600:
                problems.append(f"{file_id}: file {path} has mode {mode:o}, expected 600")
            for folder in (resolved.parent, self.root):
                folder_mode = stat.S_IMODE(folder.stat().st_mode)
                if folder_mode != 0o700:
                    problems.append(f"{file_id}: folder {folder} has mode {folder_mode:o}, expected 700")
            if verify_hashes and hashlib.sha256(resolved.read_bytes()).hexdigest() != sha:
                problems.append(f"{file_id}: content of {path} does not match its sha256")
        return problems

    async def forget(self, tx: Writes, paths: Sequence[str]) -> int:
        """Delete the stored files at ``paths`` that no row names, in ``tx`` as ``repair_files`` does (see above)."""
        named = await tx.known_file_paths(list(paths)) if paths else set()
        doomed = [path for path in dict.fromkeys(paths) if path not in named]
        return sum(await asyncio.to_thread(lambda: [self.remove(path) for path in doomed]))

    def exists(self, relative: str) -> bool:
        try:
            return self.resolve(relative).is_file()
        except UnsafePathError:
            return False


class FileBatch:
    """The payloads of one request: ``add`` (cheap, any thread), ``write`` to the pending folder, ``publish``
    the ones a transaction stores, ``discard`` the rest. ``write``, ``publish`` and ``discard`` block: call
    them in a worker thread, once per batch of files (never once per file on the event loop)."""

    def __init__(self, store: FileStore, tenant: str) -> None:
        self.store = store
        self.tenant = tenant
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
        relative = self.store.relative_path(self.tenant, sha)
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
        """Write what was queued to the pending folder, durably. Content the tenant already has (published
        by an earlier request) is not written again."""
        with self._lock:
            if self._closed:
                raise BatchClosedError("this request's files were discarded")
            queued, self._queued = self._queued, {}
            todo = {r: d for r, d in queued.items() if not (self.store.data_dir / r).is_file()}
            if todo:
                self._pending.update(self._write_pending(todo))

    def _write_pending(self, todo: dict[str, bytes]) -> dict[str, Path]:
        self.store._prepare_pending()
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
            _sync(written.values(), self.store.pending_dir)
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
            _private_dir(self.store.root)
            for folder in folders:
                _private_dir(folder)
            for relative, path in moves:
                os.replace(path, self.store.data_dir / relative)  # atomic: readers see the whole file or none
                del self._pending[relative]
            _sync([*folders, self.store.root])  # at most 257 folders; this runs inside the write transaction

    def discard(self) -> None:
        """Delete the pending files that were not published. Published files stay (others may use them)."""
        with self._lock:
            self._closed = True
            self._queued.clear()
            self._contents.clear()
            pending, self._pending = self._pending, {}
        for path in pending.values():
            path.unlink(missing_ok=True)
