"""Persistence: where conversations live (``Location``) and the store that serves them.

SQLite under the data directory is the default (nothing to run); ``general_settings.database_url:
postgresql://...`` selects PostgreSQL, which several replicas share. The engine sees only the protocols in
``proxy.store.base``; drivers are imported only when their store is opened.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.store.base import Blobs, Store

POSTGRES_SCHEMES = ("postgresql", "postgres")
# What installs the driver however lcm-proxy was installed: the ``postgres`` extra's requirement itself (lcm-proxy
# is not on PyPI, so ``pip install 'lcm-proxy[postgres]'`` fails), and the extra, from a clone.
POSTGRES_INSTALL = "pip install 'psycopg[binary,pool]>=3.2,<4' (in a clone of lcm-proxy: pip install '.[postgres]')"
POSTGRES_DRIVER = ("psycopg", "psycopg_pool")  # the [postgres] extra's modules


def missing_postgres_driver() -> str | None:
    """What to say when the PostgreSQL store's driver is not installed (it is an optional extra), else None.
    Asked before a PostgreSQL store is used, so that the message names what installs it instead of a traceback."""
    for name in POSTGRES_DRIVER:
        try:
            importlib.import_module(name)
        except ImportError:
            return f"the PostgreSQL store needs the psycopg driver, which is not installed: {POSTGRES_INSTALL}"
    return None


def is_postgres_url(url: str) -> bool:
    return url.partition("://")[0].lower().split("+")[0] in POSTGRES_SCHEMES


@dataclass(frozen=True)
class Location:
    data_dir: Path
    database_url: str | None = None  # postgresql://...; None: SQLite in data_dir
    pool_size: int = 16  # PostgreSQL connections of this process, at most

    @property
    def kind(self) -> str:
        return "sqlite" if self.database_url is None else "postgresql"

    def describe(self) -> str:
        """Where the conversations are, without a password: for logs and the CLI's messages."""
        if self.database_url is None:
            from proxy.store.sqlite.store import DB_NAME

            return str(self.data_dir / DB_NAME)
        from proxy.store.postgres.store import redacted

        return redacted(self.database_url)

    def exists(self) -> bool:
        """Whether a store is there to read (a PostgreSQL database is checked when it is opened)."""
        if self.database_url is not None:
            return True
        from proxy.store.sqlite.store import DB_NAME

        return (self.data_dir / DB_NAME).exists()

    def stores(self) -> tuple[Store, Blobs]:
        """The conversation store and the payload store, not opened yet."""
        if self.database_url is not None:
            from proxy.store.postgres.store import PostgresBlobs, PostgresStore

            store = PostgresStore(self.database_url, pool_size=self.pool_size)
            return store, PostgresBlobs(store)
        from proxy.store.files import FileStore
        from proxy.store.sqlite.store import SQLiteStore

        return SQLiteStore(self.data_dir), FileStore(self.data_dir)
