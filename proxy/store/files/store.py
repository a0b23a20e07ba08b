"""The payload files of the data directory: content addresses per scope, safe reads and integrity checks.

A read resolves the path and refuses anything that leaves the files root, symlinks included: a path comes
from the database, and a database is not trusted to be untampered.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from proxy.store.errors import UnsafePathError
from proxy.store.files.batch import FileBatch
from proxy.store.files.leftovers import PENDING, Leftovers


class FileStore(Leftovers):
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
    def address(scope: str, sha256: str) -> str:
        """Where ``scope``'s copy of the content hashed ``sha256`` lives (like ``file_id_for``, per scope)."""
        return hashlib.sha256(f"{scope}\x00{sha256}".encode()).hexdigest()

    def relative_path(self, scope: str, sha256: str) -> str:
        address = self.address(scope, sha256)
        return f"files/{address[:2]}/{address}"

    def batch(self, scope: str) -> FileBatch:
        return FileBatch(self, scope)

    def put(self, scope: str, data: bytes) -> tuple[str, str]:
        """Store ``data`` for ``scope`` now (blocking); return (sha256, path relative to the data dir)."""
        batch = self.batch(scope)
        try:
            sha, relative = batch.add(data)
            batch.write()
            batch.publish_now([relative])
        finally:
            batch.discard()
        return sha, relative

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

    def exists(self, relative: str) -> bool:
        try:
            return self.resolve(relative).is_file()
        except UnsafePathError:
            return False
