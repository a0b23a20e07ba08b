"""The SQLite store's deletions: a conversation's rows (``Writes.remove_conversation``) and the scrub that
follows (``SQLiteStore.scrub``).

What deleted content leaves behind in SQLite, and what takes it away:

* freed space in the database's pages: ``PRAGMA secure_delete=ON`` on every connection of the store (set
  when it connects) zeroes content as it is deleted or overwritten, so nothing freed by the proxy lingers;
* the full-text indexes: FTS5 records a deletion as a marker beside the old entry, which stays (the deleted
  message's words with it) until its segment is merged. The scrub merges each index into one segment, which
  costs time in proportion to the index, so it does it in bounded steps: FTS5's incremental ``merge``
  command, about ``SCRUB_PAGES`` pages written per step, each step its own short write transaction, the
  writer free for other requests between steps (the first step with a negative count, which starts a merge
  of every segment like ``optimize`` does; the next ones positive, which carry that merge to its end even
  when new segments arrive meanwhile; done when a step changes nothing, as FTS5's documentation says to tell).
  FTS5's own ``secure-delete`` option (SQLite 3.42 and later)
  would remove entries at once, but it switches the index to a format that SQLite before 3.42 refuses
  ("invalid fts5 file format"), and the same data directory may well be opened by another Python (the CLI,
  a container), so it is not used;
* the write-ahead log: old page images stay in ``lcm.sqlite3-wal`` until a checkpoint copies the pages back
  and the log is truncated (``wal_checkpoint(TRUNCATE)``), which waits for readers of older snapshots (other
  processes) to finish, up to the busy timeout.

The file system's own copies (freed blocks, snapshots, backups) are out of SQLite's reach.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiosqlite

from proxy.store.records import Removed

FTS_TABLES = ("messages_fts", "summaries_fts")
SCRUB_PAGES = 16  # FTS5 pages (about 4 kB each) one scrub step writes: a few milliseconds of the writer
CHECKPOINT_STEPS = 8  # scrub steps between the scrub's own (passive) checkpoints
MAX_SCRUB_STEPS = 1_000_000  # per index and scrub: a bound on the loop, far beyond any store's index
CHUNK = 500  # ids per IN (...) list: far below SQLite's 32,766 parameters

# The summaries of conversation ? that rows of other conversations still reference (another conversation's
# context, or another conversation's summary through its sources), and everything they link to. Run after the
# conversation's own context items are gone.
KEPT_SUMMARIES = """
WITH RECURSIVE kept(id) AS (
    SELECT s.id FROM summaries s WHERE s.conversation_id = ?1 AND (
        EXISTS (SELECT 1 FROM context_items ci WHERE ci.summary_id = s.id)
        OR EXISTS (SELECT 1 FROM summary_sources ss JOIN summaries p ON p.id = ss.summary_id
                   WHERE ss.child_summary_id = s.id AND p.conversation_id != ?1))
    UNION
    SELECT ss.child_summary_id FROM summary_sources ss JOIN kept k ON ss.summary_id = k.id
    WHERE ss.child_summary_id IS NOT NULL
)
SELECT id FROM kept
"""


def _chunks(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]


class SQLiteRemoval:
    """``remove_conversation`` and ``delete_blobs`` of a write transaction (``sqlite.writes.WriteTransaction``)."""

    conn: aiosqlite.Connection

    if TYPE_CHECKING:  # provided by ``sqlite.ledger.SQLiteLedgerWrites``

        async def _truncate_ledger(self, conversation_id: str, start: int) -> None: ...

    async def _fetch(self, sql: str, args: Sequence[Any]) -> list[Any]:
        async with self.conn.execute(sql, args) as cursor:
            return list(await cursor.fetchall())

    async def _count(self, sql: str, args: Sequence[Any]) -> int:
        cursor = await self.conn.execute(sql, args)
        return max(0, cursor.rowcount)

    async def remove_conversation(self, conversation_id: str, keep: int) -> Removed:
        cid = conversation_id
        for table in ("context_items", "last_sent", "relayed_answers", "compaction_leases"):
            await self.conn.execute(f"DELETE FROM {table} WHERE conversation_id = ?", (cid,))
        keep, kept, doomed = await self._remove_summaries(cid, keep)
        # What the door issued for it, but for what stands within the prefix kept for its forks: a checkpoint
        # for its first `position` messages, a response for those and its answer after them.
        await self.conn.execute(
            "DELETE FROM responses WHERE conversation_id = ? AND (position > ?"
            " OR (position = ? AND kind = 'response'))",
            (cid, keep, keep),
        )
        await self._truncate_ledger(cid, keep)
        linked = await self._fetch(
            "SELECT DISTINCT mf.file_id FROM message_files mf JOIN messages m ON m.id = mf.message_id"
            " WHERE m.conversation_id = ? AND m.seq >= ?",
            (cid, keep),
        )
        await self.conn.execute(
            "DELETE FROM message_files WHERE message_id IN (SELECT id FROM messages WHERE conversation_id = ?"
            " AND seq >= ?)",
            (cid, keep),
        )
        messages = await self._count("DELETE FROM messages WHERE conversation_id = ? AND seq >= ?", (cid, keep))
        paths = await self._remove_files(cid, linked)
        children = await self._fetch("SELECT 1 FROM conversations WHERE parent_id = ? LIMIT 1", (cid,))
        if keep == 0 and not kept and not children:
            await self.conn.execute("DELETE FROM conversations WHERE id = ?", (cid,))
            return Removed(1, messages, len(doomed), len(paths), tuple(dict.fromkeys(paths)), 0)
        await self.conn.execute(
            "UPDATE conversations SET deleted_at = coalesce(deleted_at, ?1), external_key = NULL,"
            " instructions_json = NULL, last_model = NULL, summarized_upto = 0, stubbed_upto = 0,"
            " message_count = (SELECT count(*) FROM messages WHERE conversation_id = ?2),"
            " token_count = (SELECT coalesce(sum(token_count), 0) FROM messages WHERE conversation_id = ?2)"
            " WHERE id = ?2",
            (time.time(), cid),
        )
        return Removed(0, messages, len(doomed), len(paths), tuple(dict.fromkeys(paths)), keep)

    async def _remove_summaries(self, cid: str, keep: int) -> tuple[int, set[str], list[str]]:
        """Delete the conversation's summaries that nothing kept needs; (the messages to keep, grown to cover
        the kept summaries; the kept summaries; the deleted ones)."""
        kept = {str(r[0]) for r in await self._fetch(KEPT_SUMMARIES, (cid,))}
        owned = [str(r[0]) for r in await self._fetch("SELECT id FROM summaries WHERE conversation_id = ?", (cid,))]
        kept &= set(owned)
        if kept:  # the messages the kept summaries cover stay too (they are within the forks' prefix anyway)
            for chunk in _chunks(sorted(kept)):
                row = await self._fetch(
                    "SELECT max(m.seq) FROM summary_sources ss JOIN messages m ON m.id = ss.message_id"
                    f" WHERE ss.summary_id IN ({','.join('?' * len(chunk))})",
                    tuple(chunk),
                )
                if row and row[0][0] is not None:
                    keep = max(keep, int(row[0][0]) + 1)
        doomed = [s for s in owned if s not in kept]
        for chunk in _chunks(doomed):
            marks = ",".join("?" * len(chunk))
            await self.conn.execute(f"DELETE FROM summary_sources WHERE summary_id IN ({marks})", tuple(chunk))
            await self.conn.execute(f"DELETE FROM summaries WHERE id IN ({marks})", tuple(chunk))
        return keep, kept, doomed

    async def _remove_files(self, cid: str, linked: Sequence[Any]) -> list[str]:
        """Delete the ``files`` rows of the conversation (those it owns, and ``linked``: those its removed
        messages named) that no message names any more; the paths of their contents."""
        # A file first seen here that others still refer to is attributed to one of them (a live one first).
        await self.conn.execute(
            "UPDATE files SET conversation_id = coalesce((SELECT m.conversation_id FROM message_files mf"
            " JOIN messages m ON m.id = mf.message_id JOIN conversations c ON c.id = m.conversation_id"
            " WHERE mf.file_id = files.id AND m.conversation_id != ?1 ORDER BY c.deleted_at IS NOT NULL, m.id"
            " LIMIT 1), conversation_id) WHERE conversation_id = ?1",
            (cid,),
        )
        owned_files = await self._fetch("SELECT id FROM files WHERE conversation_id = ?", (cid,))
        paths: list[str] = []
        for (file_id,) in dict.fromkeys(tuple(r) for r in [*linked, *owned_files]):
            gone = await self._fetch(
                "DELETE FROM files WHERE id = ?1 AND NOT EXISTS (SELECT 1 FROM message_files WHERE file_id = ?1)"
                " RETURNING path",
                (file_id,),
            )
            paths += [str(r[0]) for r in gone]
        return paths

    async def delete_blobs(self, paths: Sequence[str]) -> int:
        raise TypeError("the SQLite store keeps payloads in files (FileStore.forget), not in the database")


async def merge_step(conn: aiosqlite.Connection, table: str, pages: int) -> bool:
    """One bounded step of the scrub's merge of ``table`` (``pages`` negative: the first, which starts a merge of
    every segment), in a transaction of its own; whether it did any work (when not, the merge is complete).
    Run on the writer connection, outside any transaction, holding its lock."""
    await conn.execute("BEGIN IMMEDIATE")
    try:
        before = conn.total_changes
        await conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('merge', ?)", (pages,))
        worked = conn.total_changes - before >= 2
        await conn.commit()
    except BaseException:
        await conn.rollback()
        raise
    return worked


async def vacuum(conn: aiosqlite.Connection) -> None:
    """``lcm-proxy purge --vacuum-full``: the whole database rewritten, holding the writer while it runs."""
    await conn.execute("VACUUM")


async def truncate_wal(conn: aiosqlite.Connection) -> list[str]:
    """The scrub's last step: the write-ahead log checkpointed and truncated (short once the merge steps ran:
    SQLite's automatic checkpoints kept it to about a thousand pages meanwhile)."""
    async with conn.execute("PRAGMA wal_checkpoint(TRUNCATE)") as cursor:
        busy, *_ = await cursor.fetchone() or (0,)
    if busy:
        return [
            "the write-ahead log could not be truncated (another process was reading): old page images stay in"
            " lcm.sqlite3-wal until a later checkpoint overwrites them"
        ]
    return []
