"""The PostgreSQL store: several proxy replicas, one database (``general_settings.database_url``).

psycopg 3 with an async connection pool. No server-side prepared statements (``prepare_threshold=None``) and
no session state (no ``SET`` outside a transaction, no session-level advisory locks), so the store works behind
PgBouncer's transaction pooling. Reads: ``postgres_reads``; write transactions and their locks:
``postgres_writes``; searches: ``postgres_search``; the schema: ``pg_migrations``.

Payloads live in the database too (``PostgresBlobs``, the ``lcm.blobs`` table keyed by the same
content-addressed path the file store uses): every replica reads what any replica stored, and a payload is
inserted by the very transaction that stores the rows naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import AsyncIterator, Sequence

import psycopg
from psycopg_pool import AsyncConnectionPool

from proxy.store.base import Writes
from proxy.store.errors import StoreUnavailable
from proxy.store.files import FileStore
from proxy.store.postgres.delete import vacuum
from proxy.store.postgres.migrations import MIGRATIONS, apply_migrations
from proxy.store.postgres.reads import PostgresReads, translated
from proxy.store.postgres.search import PostgresSearches
from proxy.store.postgres.writes import PostgresWrites

POOL_SIZE = 16  # connections per replica: a read holds one for one statement, a transaction for its length
LOCK_TIMEOUT_MS = 10_000  # a write transaction waiting longer for a conversation's lock gives up (503, retry)
IDLE_TIMEOUT_MS = 60_000  # a transaction idle this long (its replica froze) is ended by the server


# The tables LiteLLM proxy's prisma schema creates are all named LiteLLM_* (LiteLLM_VerificationToken,
# LiteLLM_SpendLogs...), in the schema its URL names (public by default).
LITELLM_TABLES = (
    "SELECT c.relname FROM pg_class c WHERE c.relkind IN ('r', 'p') AND c.relname LIKE 'LiteLLM\\_%' ORDER BY c.relname"
)
LITELLM_CONNECT_SECONDS = 3  # check-config and serve's startup look once; an unreachable server is not theirs to report


def litellm_tables(url: str) -> list[str] | None:
    """The LiteLLM proxy tables in the database at ``url`` (it is LiteLLM's own database then), or None when
    it cannot be reached (``serve`` reports that when it opens the store)."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=LITELLM_CONNECT_SECONDS) as conn:
            return [str(row[0]) for row in conn.execute(LITELLM_TABLES).fetchall()]
    except psycopg.Error:
        return None


def redacted(url: str) -> str:
    """``url`` without its password, for logs and messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://…"
    host, port, name = info.get("host", "localhost"), info.get("port", "5432"), info.get("dbname", "")
    return f"postgresql://{info.get('user', '')}{'@' if info.get('user') else ''}{host}:{port}/{name}"


class PostgresStore:
    kind = "postgresql"

    def __init__(self, url: str, *, pool_size: int = POOL_SIZE) -> None:
        self.url = url
        self.pool_size = pool_size
        self._pool: AsyncConnectionPool | None = None

    async def open(self) -> None:
        """Connect (one attempt first, so an unreachable server is reported at once with its reason rather
        than after the pool's retries), apply the schema's migrations, and open the pool."""
        try:
            probe = await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=10)
        except psycopg.Error as error:
            reason = " ".join(str(error).split()) or type(error).__name__
            raise StoreUnavailable(f"cannot open the PostgreSQL store at {redacted(self.url)}: {reason}") from None
        await probe.close()
        pool = AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            kwargs={"autocommit": True, "prepare_threshold": None},
            open=False,
            name="lcm-proxy",
        )
        with translated():
            await pool.open(wait=True, timeout=30)
            async with pool.connection() as conn:
                await apply_migrations(conn)
        self._pool = pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        self._pool = None

    @property
    def pool(self) -> AsyncConnectionPool:
        assert self._pool is not None, "store is not open"
        return self._pool

    @property
    def read(self) -> PostgresReads:
        return PostgresReads(pool=self.pool)

    @property
    def search(self) -> PostgresSearches:
        return PostgresSearches(pool=self.pool)

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[PostgresWrites]:
        """One transaction. It waits for a lock at most ``LOCK_TIMEOUT_MS`` and may stay idle at most
        ``IDLE_TIMEOUT_MS`` (a replica that froze holding a lock frees it), so a stuck holder costs its waiters
        a retryable 503 rather than every pooled connection of their replicas."""
        with translated():
            async with self.pool.connection() as conn, conn.transaction():
                await conn.execute(
                    f"SET LOCAL lock_timeout = {int(LOCK_TIMEOUT_MS)};"
                    f" SET LOCAL idle_in_transaction_session_timeout = {int(IDLE_TIMEOUT_MS)}"
                )
                yield PostgresWrites(conn=conn)

    async def integrity(self) -> list[str]:
        """Pending migrations and a missing extension; PostgreSQL enforces keys and constraints itself."""
        reads = self.read
        applied = {r[0] for r in await reads._all("SELECT name FROM lcm.migrations")}
        problems = [f"migration {name} not applied" for name, _ in MIGRATIONS if name not in applied]
        if await reads._one("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'") is None:
            problems.append("the pg_trgm extension is missing")
        return problems

    async def scrub(self, *, full: bool = False) -> list[str]:
        """After deletions: ``VACUUM`` the tables they touch (``proxy.store.postgres.delete`` says what that
        does and does not remove)."""
        with translated():
            return await vacuum(self.pool, full=full)


class PostgresBlobs:
    """Payload contents as rows of ``lcm.blobs`` (see the module docstring)."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    def batch(self, scope: str) -> MemoryBatch:
        return MemoryBatch(scope)

    async def load(self, path: str) -> bytes:
        row = await self.store.read._one("SELECT content FROM lcm.blobs WHERE path = %s", (path,))
        if row is None:
            raise FileNotFoundError(f"no stored content at {path}")
        return bytes(row[0])

    async def forget(self, tx: Writes, paths: Sequence[str]) -> int:
        """Contents no row names: normally none, those of a deletion go in its own transaction
        (``remove_conversation``)."""
        return await tx.delete_blobs(paths)

    async def check(self, files: Sequence[tuple[str, str, str]], *, verify_hashes: bool) -> list[str]:
        problems: list[str] = []
        reads = self.store.read
        for file_id, path, sha in files:
            digest = "encode(sha256(content), 'hex')" if verify_hashes else "''"
            row = await reads._one(f"SELECT {digest} FROM lcm.blobs WHERE path = %s", (path,))
            if row is None:
                problems.append(f"{file_id}: content {path} is missing")
            elif verify_hashes and row[0] != sha:
                problems.append(f"{file_id}: content of {path} does not match its sha256")
        return problems


class MemoryBatch:
    """A request's payloads held in memory until the transaction that stores their rows inserts them: nothing
    reaches the database for a request that fails first, so nothing is left to clean up."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        self._lock = threading.Lock()
        self._located: dict[str, tuple[str, str]] = {}
        self._contents: dict[str, bytes] = {}

    def add(self, data: bytes, file_id: str | None = None) -> tuple[str, str]:
        sha = hashlib.sha256(data).hexdigest()
        address = FileStore.address(self.scope, sha)
        path = f"files/{address[:2]}/{address}"
        with self._lock:
            self._contents.setdefault(path, data)
            if file_id is not None:
                self._located[file_id] = (sha, path)
        return sha, path

    def location(self, file_id: str) -> tuple[str, str] | None:
        return self._located.get(file_id)

    @property
    def unwritten(self) -> bool:
        return False

    def write(self) -> None:
        pass

    async def publish(self, tx: Writes, paths: Sequence[str]) -> None:
        await tx.put_blobs([(path, self._contents[path]) for path in dict.fromkeys(paths)])

    @property
    def holds_files(self) -> bool:
        return False

    def discard(self) -> None:
        with self._lock:
            self._contents.clear()
