"""The errors the store reports to its callers (the engine, the operator's commands, the wire's error mapping).

The store imports nothing above it, so these are its own, not the engine's: ``proxy.wire.http.to_proxy_error``
maps them to HTTP as it maps the engine's (the status each maps to is noted below), and the operator's CLI
prints the message and exits with status 1. ``message`` never quotes stored content.

    StoreError                   anything the store reports (unmapped subclasses: 500)
    ├── StoreBusy                503: another process held the database's write lock too long; retry
    │   └── StoreUnavailable     503: the database cannot be reached (at startup: the reason it refused)
    └── UnsafePathError          500: a stored file path leaves the data directory (a damaged database)
"""

from __future__ import annotations


class StoreError(Exception):
    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class StoreBusy(StoreError):
    """SQLite's "database is locked" after the store's busy timeout: nothing was written; a retry shortly
    succeeds once the other process (another worker, the operator's CLI) releases the lock."""

    def __init__(self, message: str = "The database is busy (another process holds its write lock); retry.") -> None:
        super().__init__(message)


class StoreUnavailable(StoreBusy):
    """The database server cannot be reached or refuses the proxy (a wrong password, no such database)."""


class UnsafePathError(StoreError):
    """A file path read from the database leaves the files root or passes through a symbolic link."""
