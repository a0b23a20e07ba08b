"""One SQLite write transaction (``Writes``), on the store's one writer connection.

This store's writers are serialised (one process: ``SQLiteStore``'s lock; several: ``BEGIN IMMEDIATE``), so
every transaction already holds every lock the engine asks for, and payloads live in files (``FileStore``),
never in the database.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import aiosqlite

from proxy.store import running
from proxy.store.records import FileRecord, NewMessage, ResponseRecord, SummaryRecord
from proxy.store.sqlite.delete import SQLiteRemoval
from proxy.store.sqlite.ledger import SQLiteLedgerWrites
from proxy.store.sqlite.reads import FILE_COLUMNS, RESPONSE_COLUMNS, SUM_COLUMNS, Queries


class WriteTransaction(SQLiteRemoval, SQLiteLedgerWrites, Queries):
    conn: aiosqlite.Connection

    def __init__(self, conn: aiosqlite.Connection, fresh: Queries | None = None) -> None:
        self.conn = conn
        self._fresh = fresh

    @property
    def locked_reads(self) -> Queries:
        # BEGIN IMMEDIATE holds the database's write lock: no other connection can commit until this one ends,
        # so the loop's reader (autocommit: a snapshot per statement) sees what this transaction would.
        return self._fresh if self._fresh is not None else self

    # This store's writers are serialised (one process: ``SQLiteStore._lock``; several: BEGIN IMMEDIATE), so
    # every transaction already holds every lock.
    async def lock_identity(self, scope: str, key: str) -> None:
        pass

    async def lock_conversation(self, conversation_id: str) -> bool:
        return False

    async def put_blobs(self, blobs: Sequence[tuple[str, bytes]]) -> None:
        raise TypeError("the SQLite store keeps payloads in files (FileStore), not in the database")

    async def create_conversation(
        self,
        conversation_id: str,
        scope: str,
        *,
        external_key: str | None = None,
        parent_id: str | None = None,
        fork_seq: int | None = None,
        instructions_json: str | None = None,
        dialect: str = "chat",
        continued: bool = False,
        linked_to: str | None = None,
    ) -> None:
        now = time.time()
        await self.conn.execute(
            "INSERT INTO conversations (id, tenant, external_key, parent_id, fork_seq, instructions_json,"
            " created_at, updated_at, dialect, continued, linked_to) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                conversation_id,
                scope,
                external_key,
                parent_id,
                fork_seq,
                instructions_json,
                now,
                now,
                dialect,
                int(continued),
                linked_to,
            ),
        )

    async def move_external_key(self, scope: str, key: str, to_conversation: str) -> None:
        await self.conn.execute(
            "UPDATE conversations SET external_key = NULL WHERE tenant = ? AND external_key = ?", (scope, key)
        )
        await self.conn.execute("UPDATE conversations SET external_key = ? WHERE id = ?", (key, to_conversation))

    async def copy_prefix(self, source_id: str, target_id: str, count: int) -> None:
        """Copy messages [0, count) of ``source_id`` (their file links, the ledger items they stated) into
        ``target_id``."""
        await self.conn.execute(
            "INSERT INTO messages (conversation_id, seq, role, original_json, payload_paths, forward_json,"
            f" compact_json, text, token_count, sent_token_count, chain_hash, created_at, compact_token_count,"
            f" {running.COLUMNS}) SELECT ?, seq, role, original_json, payload_paths, forward_json, compact_json, text,"
            f" token_count, sent_token_count, chain_hash, created_at, compact_token_count, {running.COLUMNS}"
            " FROM messages"
            " WHERE conversation_id = ? AND seq < ? ORDER BY seq",
            (target_id, source_id, count),
        )
        await self.conn.execute(
            "INSERT OR IGNORE INTO message_files (message_id, file_id)"
            " SELECT t.id, mf.file_id FROM messages s JOIN message_files mf ON mf.message_id = s.id"
            " JOIN messages t ON t.conversation_id = ? AND t.seq = s.seq WHERE s.conversation_id = ? AND s.seq < ?",
            (target_id, source_id, count),
        )
        await self._copy_ledger(source_id, target_id, count)
        await self._refresh_counts(target_id)

    async def append_messages(self, conversation_id: str, first_seq: int, messages: Sequence[NewMessage]) -> None:
        now = time.time()
        sums = running.extend(await self._running_base(conversation_id, first_seq), messages)
        # One statement for all the rows (each statement is a hop to the writer's thread and back, which the
        # transaction holds the writer for; the ingestor appends a large request in chunks of many messages).
        await self.conn.executemany(
            "INSERT INTO messages (conversation_id, seq, role, original_json, payload_paths, forward_json,"
            " compact_json, text, token_count, sent_token_count, chain_hash, created_at, compact_token_count,"
            f" {running.COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    conversation_id, first_seq + offset, m.role, m.original_json, m.payload_paths, m.forward_json,
                    m.compact_json, m.text, m.token_count, m.sent_token_count, m.chain_hash, now,
                    m.compact_token_count, *sums[offset],
                )
                for offset, m in enumerate(messages)
            ],
        )  # fmt: skip
        if any(m.file_ids for m in messages):
            ids = dict(await self.message_ids(conversation_id, first_seq, first_seq + len(messages)))
            await self.conn.executemany(
                "INSERT OR IGNORE INTO message_files (message_id, file_id) VALUES (?, ?)",
                [(ids[first_seq + offset], f) for offset, m in enumerate(messages) for f in m.file_ids],
            )
        # Incremental (the counts are exact: every change of a conversation's messages updates them), so an
        # append costs the same at 10 messages as at 50,000 (a large request is appended in chunks).
        await self.conn.execute(
            "UPDATE conversations SET message_count = message_count + ?, token_count = token_count + ?,"
            " updated_at = ? WHERE id = ?",
            (len(messages), sum(m.token_count for m in messages), time.time(), conversation_id),
        )

    async def _running_base(self, conversation_id: str, first_seq: int) -> running.Running:
        """The running sums before ``first_seq``: stored on the previous row, or added up when it has none."""
        sums = await self.running_sums(conversation_id, [first_seq - 1])
        if sums is not None:
            return sums[first_seq - 1]
        row = await self._one(
            "SELECT coalesce(sum(token_count), 0), coalesce(sum(sent_token_count), 0),"
            " coalesce(sum(coalesce(compact_token_count, token_count)), 0) FROM messages"
            " WHERE conversation_id = ? AND seq < ?",
            (conversation_id, first_seq),
        )
        return int(row[0]), int(row[1]), int(row[2])

    async def _refresh_counts(self, conversation_id: str) -> None:
        await self.conn.execute(
            "UPDATE conversations SET message_count = (SELECT count(*) FROM messages WHERE conversation_id = ?),"
            " token_count = (SELECT coalesce(sum(token_count), 0) FROM messages WHERE conversation_id = ?),"
            " updated_at = ? WHERE id = ?",
            (conversation_id, conversation_id, time.time(), conversation_id),
        )

    async def set_relayed_answer(self, conversation_id: str, seq: int, asked_at: float) -> None:
        """Record the message at ``seq`` as the answer relayed for a request that arrived at ``asked_at``."""
        await self.conn.execute(
            "INSERT OR REPLACE INTO relayed_answers (conversation_id, seq, created_at) VALUES (?, ?, ?)",
            (conversation_id, seq, asked_at),
        )

    async def relayed_answer_asked_at(self, conversation_id: str) -> float | None:
        row = await self._one("SELECT created_at FROM relayed_answers WHERE conversation_id = ?", (conversation_id,))
        return float(row[0]) if row else None

    async def drop_relayed_answer(self, conversation_id: str, seq: int) -> None:
        """Remove the relayed answer at ``seq`` (checked with ``replaceable_answer`` in this transaction), and
        the ledger items it stated."""
        await self._truncate_ledger(conversation_id, seq)
        await self.conn.execute(
            "DELETE FROM message_files WHERE message_id IN"
            " (SELECT id FROM messages WHERE conversation_id = ? AND seq = ?)",
            (conversation_id, seq),
        )
        await self.conn.execute("DELETE FROM messages WHERE conversation_id = ? AND seq = ?", (conversation_id, seq))
        await self.conn.execute("DELETE FROM relayed_answers WHERE conversation_id = ?", (conversation_id,))
        await self._refresh_counts(conversation_id)

    async def set_instructions(self, conversation_id: str, instructions_json: str | None) -> None:
        await self.conn.execute(
            "UPDATE conversations SET instructions_json = ?, updated_at = ? WHERE id = ?",
            (instructions_json, time.time(), conversation_id),
        )

    async def touch(self, conversation_id: str) -> None:
        await self.conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (time.time(), conversation_id))

    async def insert_summary(self, record: SummaryRecord, message_ids: Sequence[int], child_ids: Sequence[str]) -> None:
        await self.conn.execute(
            f"INSERT INTO summaries ({SUM_COLUMNS}) VALUES ({', '.join('?' * 16)})",
            (
                record.id, record.conversation_id, record.kind, record.depth, record.start_seq, record.end_seq,
                record.content, record.token_count, record.source_token_count, record.earliest_at, record.latest_at,
                record.descendant_count, record.file_ids, record.summarizer_model, record.escalation, record.created_at,
            ),
        )  # fmt: skip
        sources = [(m, None) for m in message_ids] + [(None, c) for c in child_ids]
        await self.conn.executemany(
            "INSERT INTO summary_sources (summary_id, ordinal, message_id, child_summary_id) VALUES (?, ?, ?, ?)",
            [(record.id, i, m, c) for i, (m, c) in enumerate(sources)],
        )

    async def set_context(self, conversation_id: str, summary_ids: Sequence[str], summarized_upto: int) -> None:
        """Replace the summarised part of the active context (the swap of one compaction pass)."""
        await self.conn.execute("DELETE FROM context_items WHERE conversation_id = ?", (conversation_id,))
        await self.conn.executemany(
            "INSERT INTO context_items (conversation_id, ordinal, summary_id) VALUES (?, ?, ?)",
            [(conversation_id, i, s) for i, s in enumerate(summary_ids)],
        )
        await self.conn.execute(
            "UPDATE conversations SET summarized_upto = ?, stubbed_upto = max(stubbed_upto, ?) WHERE id = ?",
            (summarized_upto, summarized_upto, conversation_id),
        )

    async def set_stubbed_upto(self, conversation_id: str, seq: int) -> None:
        await self.conn.execute(
            "UPDATE conversations SET stubbed_upto = max(stubbed_upto, ?) WHERE id = ?", (seq, conversation_id)
        )

    async def set_last_sent(self, conversation_id: str, sent_json: str) -> None:
        # Nothing for a conversation deleted while its request ran.
        await self.conn.execute(
            "INSERT INTO last_sent (conversation_id, sent_json, updated_at) SELECT ?1, ?2, ?3"
            " WHERE EXISTS (SELECT 1 FROM conversations WHERE id = ?1 AND deleted_at IS NULL)"
            " ON CONFLICT(conversation_id) DO UPDATE"
            " SET sent_json = excluded.sent_json, updated_at = excluded.updated_at",
            (conversation_id, sent_json, time.time()),
        )

    async def set_last_model(self, conversation_id: str, model: str) -> None:
        await self.conn.execute("UPDATE conversations SET last_model = ? WHERE id = ?", (model, conversation_id))

    async def put_response(self, record: ResponseRecord) -> None:
        await self.conn.execute(
            f"INSERT INTO responses ({RESPONSE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.id, record.scope, record.kind, record.conversation_id, record.position, record.previous_id,
                record.input_json, record.body_json, record.created_at,
            ),
        )  # fmt: skip

    async def put_file(self, record: FileRecord) -> None:
        await self.conn.execute(
            f"INSERT OR IGNORE INTO files ({FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.id, record.tenant, record.conversation_id, record.name, record.mime, record.kind,
                record.bytes, record.sha256, record.path, record.exploration, record.created_at,
            ),
        )  # fmt: skip

    # Compaction leases: at most one sweep of a conversation at a time across processes (workers, the CLI). A
    # lease names its owner and expires unless renewed, so one whose holder died (SIGKILL) is taken over.

    async def take_compaction_lease(self, conversation_id: str, owner: str, ttl: float) -> bool:
        """Take the lease of ``conversation_id`` for ``ttl`` seconds if it is free, expired or already
        ``owner``'s; whether ``owner`` holds it now."""
        now = time.time()
        await self.conn.execute(
            "INSERT INTO compaction_leases (conversation_id, owner, expires_at) VALUES (?, ?, ?)"
            " ON CONFLICT(conversation_id) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at"
            " WHERE compaction_leases.expires_at <= ? OR compaction_leases.owner = excluded.owner",
            (conversation_id, owner, now + ttl, now),
        )
        held = await self.compaction_lease(conversation_id)
        return held is not None and held[0] == owner

    async def renew_compaction_lease(self, conversation_id: str, owner: str, ttl: float) -> bool:
        """Extend ``owner``'s lease; False when it is no longer ``owner``'s (it expired and was taken over)."""
        cursor = await self.conn.execute(
            "UPDATE compaction_leases SET expires_at = ? WHERE conversation_id = ? AND owner = ?",
            (time.time() + ttl, conversation_id, owner),
        )
        return cursor.rowcount > 0

    async def release_compaction_lease(self, conversation_id: str, owner: str) -> None:
        await self.conn.execute(
            "DELETE FROM compaction_leases WHERE conversation_id = ? AND owner = ?", (conversation_id, owner)
        )
