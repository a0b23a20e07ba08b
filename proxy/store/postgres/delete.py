"""The PostgreSQL store's deletions: a conversation's rows and payloads (``Writes.remove_conversation``), and
the ``VACUUM`` that follows (``PostgresStore.scrub``).

What PostgreSQL keeps of a deleted row, and what can be done about it:

* a ``DELETE`` only marks the row dead: its bytes stay in the table's pages (and in its indexes, its TOAST
  table for long texts) until ``VACUUM`` removes them. Plain ``VACUUM``, run after deletions (coalesced: one
  pass for the deletions made while the previous one ran, ``proxy.engine.deletion.Scrubber``) on the tables
  deletions touch, makes that space reusable and removes the index entries, without blocking readers
  or writers; it does not zero the freed space, so the bytes stay on disk until new rows overwrite them.
  ``VACUUM FULL`` (``full=True``: ``lcm-proxy purge --vacuum-full``) rewrites each table into new files and
  drops the old ones, but holds an exclusive lock on each table while it runs: every replica waits.
* the write-ahead log, its archive, replicas and backups keep the rows as they were written, for as long as
  they are kept: PostgreSQL offers no way to scrub them (docs/operations.md, "Deleting data").

``VACUUM`` cannot run inside a transaction: it runs on a pooled connection, which is in autocommit mode. A
table the database role does not own is skipped by PostgreSQL with a warning.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from proxy.store.records import Removed

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

# The tables a deletion changes, in ``VACUUM``'s order (their TOAST tables and indexes come with them).
TABLES = (
    "ledger_items", "messages", "message_files", "summaries", "summary_sources", "context_items", "files", "blobs",
    "last_sent", "relayed_answers", "compaction_leases", "responses", "conversations",
)  # fmt: skip

# See ``proxy.store.sqlite.delete.KEPT_SUMMARIES``: the conversation's summaries other rows still reference,
# and all they link to. Parameters: the conversation id, three times.
KEPT_SUMMARIES = """
WITH RECURSIVE kept(id) AS (
    SELECT s.id FROM lcm.summaries s WHERE s.conversation_id = %s AND (
        EXISTS (SELECT 1 FROM lcm.context_items ci WHERE ci.summary_id = s.id)
        OR EXISTS (SELECT 1 FROM lcm.summary_sources ss JOIN lcm.summaries p ON p.id = ss.summary_id
                   WHERE ss.child_summary_id = s.id AND p.conversation_id <> %s))
    UNION
    SELECT ss.child_summary_id FROM lcm.summary_sources ss JOIN kept k ON ss.summary_id = k.id
    WHERE ss.child_summary_id IS NOT NULL
)
SELECT k.id FROM kept k JOIN lcm.summaries s ON s.id = k.id WHERE s.conversation_id = %s
"""


class PostgresRemoval:
    """``remove_conversation`` and ``delete_blobs`` of a write transaction (``postgres_writes.PostgresWrites``)."""

    if TYPE_CHECKING:  # provided by ``postgres_reads.Session``

        async def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]: ...
        async def _run(self, sql: str, args: Sequence[Any] = ()) -> int: ...
        async def _truncate_ledger(self, conversation_id: str, start: int) -> None: ...  # ``postgres.ledger``

    async def remove_conversation(self, conversation_id: str, keep: int) -> Removed:
        cid = conversation_id
        for table in ("context_items", "last_sent", "relayed_answers", "compaction_leases"):
            await self._run(f"DELETE FROM lcm.{table} WHERE conversation_id = %s", (cid,))
        keep, kept, doomed = await self._remove_summaries(cid, keep)
        # What the door issued for it, but for what stands within the prefix kept for its forks: a checkpoint
        # for its first `position` messages, a response for those and its answer after them.
        await self._run(
            "DELETE FROM lcm.responses WHERE conversation_id = %s AND (position > %s"
            " OR (position = %s AND kind = 'response'))",
            (cid, keep, keep),
        )
        await self._truncate_ledger(cid, keep)
        linked = await self._all(
            "SELECT DISTINCT mf.file_id FROM lcm.message_files mf JOIN lcm.messages m ON m.id = mf.message_id"
            " WHERE m.conversation_id = %s AND m.seq >= %s",
            (cid, keep),
        )
        await self._run(
            "DELETE FROM lcm.message_files WHERE message_id IN (SELECT id FROM lcm.messages"
            " WHERE conversation_id = %s AND seq >= %s)",
            (cid, keep),
        )
        messages = await self._run("DELETE FROM lcm.messages WHERE conversation_id = %s AND seq >= %s", (cid, keep))
        gone = await self._remove_files(cid, linked)
        paths = tuple(dict.fromkeys(str(r[0]) for r in gone))
        await self.delete_blobs(paths)  # in this transaction: contents go with the rows that name them
        children = await self._all("SELECT 1 FROM lcm.conversations WHERE parent_id = %s LIMIT 1", (cid,))
        if keep == 0 and not kept and not children:
            await self._run("DELETE FROM lcm.conversations WHERE id = %s", (cid,))
            return Removed(1, messages, len(doomed), len(gone), paths, 0)
        await self._run(
            "UPDATE lcm.conversations SET deleted_at = coalesce(deleted_at, %s), external_key = NULL,"
            " instructions_json = NULL, last_model = NULL, summarized_upto = 0, stubbed_upto = 0,"
            " message_count = (SELECT count(*) FROM lcm.messages WHERE conversation_id = %s),"
            " token_count = (SELECT coalesce(sum(token_count), 0) FROM lcm.messages WHERE conversation_id = %s)"
            " WHERE id = %s",
            (time.time(), cid, cid, cid),
        )
        return Removed(0, messages, len(doomed), len(gone), paths, keep)

    async def _remove_summaries(self, cid: str, keep: int) -> tuple[int, list[str], list[str]]:
        """Delete the conversation's summaries that nothing kept needs; (the messages to keep, grown to cover
        the kept summaries; the kept summaries; the deleted ones)."""
        kept = [str(r[0]) for r in await self._all(KEPT_SUMMARIES, (cid, cid, cid))]
        if kept:  # the messages the kept summaries cover stay too (they are within the forks' prefix anyway)
            row = await self._all(
                "SELECT max(m.seq) FROM lcm.summary_sources ss JOIN lcm.messages m ON m.id = ss.message_id"
                " WHERE ss.summary_id = ANY(%s::text[])",
                (kept,),
            )
            if row and row[0][0] is not None:
                keep = max(keep, int(row[0][0]) + 1)
        doomed = [
            str(r[0])
            for r in await self._all(
                "SELECT id FROM lcm.summaries WHERE conversation_id = %s AND NOT id = ANY(%s::text[])", (cid, kept)
            )
        ]
        if doomed:
            await self._run("DELETE FROM lcm.summary_sources WHERE summary_id = ANY(%s::text[])", (doomed,))
            await self._run("DELETE FROM lcm.summaries WHERE id = ANY(%s::text[])", (doomed,))
        return keep, kept, doomed

    async def _remove_files(self, cid: str, linked: Sequence[Any]) -> list[Any]:
        """Delete the ``files`` rows of the conversation (those it owns, and ``linked``: those its removed
        messages named) that no message names any more; the deleted rows (their paths)."""
        # A file first seen here that others still refer to is attributed to one of them (a live one first).
        await self._run(
            "UPDATE lcm.files f SET conversation_id = coalesce((SELECT m.conversation_id FROM lcm.message_files mf"
            " JOIN lcm.messages m ON m.id = mf.message_id JOIN lcm.conversations v ON v.id = m.conversation_id"
            " WHERE mf.file_id = f.id AND m.conversation_id <> %s ORDER BY v.deleted_at IS NOT NULL, m.id"
            " LIMIT 1), f.conversation_id) WHERE f.conversation_id = %s",
            (cid, cid),
        )
        candidates = [str(r[0]) for r in linked]
        owned = await self._all("SELECT id FROM lcm.files WHERE conversation_id = %s", (cid,))
        candidates += [str(r[0]) for r in owned]
        gone = await self._all(
            "DELETE FROM lcm.files f WHERE f.id = ANY(%s::text[])"
            " AND NOT EXISTS (SELECT 1 FROM lcm.message_files mf WHERE mf.file_id = f.id) RETURNING f.path",
            (list(dict.fromkeys(candidates)),),
        )
        return gone

    async def delete_blobs(self, paths: Sequence[str]) -> int:
        if not paths:
            return 0
        return await self._run(
            "DELETE FROM lcm.blobs b WHERE b.path = ANY(%s::text[])"
            " AND NOT EXISTS (SELECT 1 FROM lcm.files f WHERE f.path = b.path)",
            (list(paths),),
        )


async def vacuum(pool: AsyncConnectionPool, *, full: bool) -> list[str]:
    """``VACUUM`` (or ``VACUUM FULL``) the tables deletions touch, one table at a time, each on an autocommit
    pooled connection taken for that table only (the pool's other connections serve requests meanwhile)."""
    command = "VACUUM (FULL)" if full else "VACUUM"
    for table in TABLES:
        async with pool.connection() as conn:
            await conn.execute(f"{command} lcm.{table}")
    return []
