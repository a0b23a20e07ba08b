"""Durable writes and folder listings for payload files: private folders (0700), fsync (or one syncfs(2) for
a whole batch on Linux), and the files found on disk, listed without following symbolic links.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

SYNCFS_BATCH = 16  # from this many files on, one syncfs(2) instead of an fsync per file (Linux)


@functools.cache
def _syncfs() -> Callable[[int], int] | None:
    try:
        function: Callable[[int], int] = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    return function


def private_dir(folder: Path) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)


def sync(paths: Iterable[Path], anchor: Path | None = None) -> None:
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


def disk_file(entry: os.DirEntry[str], data_dir: Path) -> DiskFile | None:
    try:
        if not entry.is_file(follow_symlinks=False):
            return None
        info = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None
    return DiskFile(Path(entry.path).relative_to(data_dir).as_posix(), info.st_size, info.st_mtime)


def folder_entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
