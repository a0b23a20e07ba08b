"""Content-addressed payload files under the data directory.

A payload is written once per content hash (``files/ab/abcdef…``), atomically (temp file + rename), 0600 in
0700 folders. Reads resolve the path and refuse anything that leaves the files root, symlinks included: a
path comes from the database, and a database is not trusted to be untampered.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


class UnsafePathError(Exception):
    pass


class FileStore:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.root = data_dir / "files"

    @staticmethod
    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def relative_path(self, sha256: str) -> str:
        return f"files/{sha256[:2]}/{sha256}"

    def put(self, data: bytes) -> tuple[str, str]:
        """Store ``data`` once; return (sha256, path relative to the data dir)."""
        sha = self.digest(data)
        relative = self.relative_path(sha)
        target = self.data_dir / relative
        if target.exists():
            return sha, relative
        for folder in (self.root, target.parent):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(folder, 0o700)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)  # atomic: readers see the whole file or none
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
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

    def exists(self, relative: str) -> bool:
        try:
            return self.resolve(relative).is_file()
        except UnsafePathError:
            return False
