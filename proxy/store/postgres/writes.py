"""One PostgreSQL write transaction (``Writes``), on a connection of its own.

Replicas run these side by side at READ COMMITTED, so the engine takes a lock before each decision
(``lock_identity``, ``lock_conversation``): ``pg_advisory_xact_lock`` on a key hashed from a namespaced
string, released at commit or rollback. Never a session-level lock: under PgBouncer's transaction pooling
the session is not ours, and such a lock would outlive the transaction on someone else's connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from proxy.store import running
from proxy.store.postgres.delete import PostgresRemoval
from proxy.store.postgres.ledger import PostgresLedgerWrites
from proxy.store.postgres.reads import FILE_COLUMNS, RESPONSE_COLUMNS, SUM_COLUMNS, PostgresReads
from proxy.store.postgres.words import tsvector
from proxy.store.records import FileRecord, NewMessage, ResponseRecord, SummaryRecord

LOCK_NAMESPACE = "lcm-proxy"
NOW = "extract(epoch from clock_timestamp())"  # the database's clock: replicas' clocks may disagree
_MESSAGE_FIELDS = (
    "conversation_id, seq, role, original_json, payload_paths, forward_json, compact_json, text, token_count,"
    " sent_token_count, chain_hash, created_at, compact_token_count, words, cum_tokens, cum_sent_tokens,"
    " cum_compact_tokens"
)
OFF_LOOP_CHARS = 200_000  # texts of one append longer than this are folded into words in a worker thread


class PostgresWrites(PostgresReads, PostgresRemoval, PostgresLedgerWrites):
    @property
    def locked_reads(self) -> PostgresWrites:
        return self  # writers run side by side: only this transaction's reads come after its locks

    async def _lock(self, key: str) -> None:
        await self._run("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"{LOCK_NAMESPACE}:{key}",))

    async def lock_identity(self, scope: str, key: str) -> None:
        await self._lock(f"identity:{len(scope)}:{scope}:{key}")

    async def lock_conversation(self, conversation_id: str) -> bool:
        await self._lock(f"conversation:{conversation_id}")
        return True

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
        await self._run(
            "INSERT INTO lcm.conversations (id, tenant, external_key, parent_id, fork_seq, instructions_json,"
            " created_at, updated_at, dialect, continued, linked_to)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
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
        await self._run(
            "UPDATE lcm.conversations SET external_key = NULL WHERE tenant = %s AND external_key = %s", (scope, key)
        )
        await self._run("UPDATE lcm.conversations SET external_key = %s WHERE id = %s", (key, to_conversation))

    async def copy_prefix(self, source_id: str, target_id: str, count: int) -> None:
        await self._run(
            f"INSERT INTO lcm.messages ({_MESSAGE_FIELDS}) SELECT %s, seq, role, original_json, payload_paths,"
            " forward_json, compact_json, text, token_count, sent_token_count, chain_hash, created_at,"
            f" compact_token_count, words, {running.COLUMNS} FROM lcm.messages WHERE conversation_id = %s AND seq < %s"
            " ORDER BY seq",
            (target_id, source_id, count),
        )
        await self._run(
            "INSERT INTO lcm.message_files (message_id, file_id)"
            " SELECT t.id, mf.file_id FROM lcm.messages s JOIN lcm.message_files mf ON mf.message_id = s.id"
            " JOIN lcm.messages t ON t.conversation_id = %s AND t.seq = s.seq"
            " WHERE s.conversation_id = %s AND s.seq < %s ON CONFLICT DO NOTHING",
            (target_id, source_id, count),
        )
        await self._copy_ledger(source_id, target_id, count)
        await self._refresh_counts(target_id)

    async def append_messages(self, conversation_id: str, first_seq: int, messages: Sequence[NewMessage]) -> None:
        now = time.time()
        texts = [m.text for m in messages]
        if sum(map(len, texts)) > OFF_LOOP_CHARS:
            vectors = await asyncio.to_thread(lambda: [tsvector(t) for t in texts])
        else:
            vectors = [tsvector(t) for t in texts]
        sums = running.extend(await self._running_base(conversation_id, first_seq), messages)
        # One pipelined statement for all the rows (a chunk of a large request holds up to a hundred messages).
        await self._run_many(
            f"INSERT INTO lcm.messages ({_MESSAGE_FIELDS})"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::tsvector, %s, %s, %s)",
            [
                (
                    conversation_id, first_seq + offset, m.role, m.original_json, m.payload_paths, m.forward_json,
                    m.compact_json, m.text, m.token_count, m.sent_token_count, m.chain_hash, now,
                    m.compact_token_count, words, *sums[offset],
                )
                for offset, (m, words) in enumerate(zip(messages, vectors, strict=True))
            ],
        )  # fmt: skip
        if any(m.file_ids for m in messages):
            ids = await self.message_ids(conversation_id, first_seq, first_seq + len(messages))
            await self._run_many(
                "INSERT INTO lcm.message_files (message_id, file_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                [(ids[first_seq + offset], f) for offset, m in enumerate(messages) for f in m.file_ids],
            )
        # Incremental (the counts are exact: every change of a conversation's messages updates them), so an
        # append costs the same at 10 messages as at 5,000.
        await self._run(
            "UPDATE lcm.conversations SET message_count = message_count + %s, token_count = token_count + %s,"
            " updated_at = %s WHERE id = %s",
            (len(messages), sum(m.token_count for m in messages), time.time(), conversation_id),
        )

    async def _running_base(self, conversation_id: str, first_seq: int) -> running.Running:
        """The running sums before ``first_seq``: stored on the previous row, or added up when it has none."""
        sums = await self.running_sums(conversation_id, [first_seq - 1])
        if sums is not None:
            return sums[first_seq - 1]
        row = await self._one(
            "SELECT coalesce(sum(token_count), 0), coalesce(sum(sent_token_count), 0),"
            " coalesce(sum(coalesce(compact_token_count, token_count)), 0) FROM lcm.messages"
            " WHERE conversation_id = %s AND seq < %s",
            (conversation_id, first_seq),
        )
        return int(row[0]), int(row[1]), int(row[2])

    async def _refresh_counts(self, conversation_id: str) -> None:
        await self._run(
            "UPDATE lcm.conversations SET"
            " message_count = (SELECT count(*) FROM lcm.messages WHERE conversation_id = %s),"
            " token_count = (SELECT coalesce(sum(token_count), 0) FROM lcm.messages WHERE conversation_id = %s),"
            " updated_at = %s WHERE id = %s",
            (conversation_id, conversation_id, time.time(), conversation_id),
        )

    async def set_relayed_answer(self, conversation_id: str, seq: int, asked_at: float) -> None:
        await self._run(
            "INSERT INTO lcm.relayed_answers (conversation_id, seq, created_at) VALUES (%s, %s, %s)"
            " ON CONFLICT (conversation_id) DO UPDATE SET seq = excluded.seq, created_at = excluded.created_at",
            (conversation_id, seq, asked_at),
        )

    async def relayed_answer_asked_at(self, conversation_id: str) -> float | None:
        row = await self._one(
            "SELECT created_at FROM lcm.relayed_answers WHERE conversation_id = %s", (conversation_id,)
        )
        return float(row[0]) if row else None

    async def drop_relayed_answer(self, conversation_id: str, seq: int) -> None:
        await self._truncate_ledger(conversation_id, seq)  # the items it stated go with it
        await self._run(
            "DELETE FROM lcm.message_files WHERE message_id IN"
            " (SELECT id FROM lcm.messages WHERE conversation_id = %s AND seq = %s)",
            (conversation_id, seq),
        )
        await self._run("DELETE FROM lcm.messages WHERE conversation_id = %s AND seq = %s", (conversation_id, seq))
        await self._run("DELETE FROM lcm.relayed_answers WHERE conversation_id = %s", (conversation_id,))
        await self._refresh_counts(conversation_id)

    async def set_instructions(self, conversation_id: str, instructions_json: str | None) -> None:
        await self._run(
            "UPDATE lcm.conversations SET instructions_json = %s, updated_at = %s WHERE id = %s",
            (instructions_json, time.time(), conversation_id),
        )

    async def touch(self, conversation_id: str) -> None:
        await self._run("UPDATE lcm.conversations SET updated_at = %s WHERE id = %s", (time.time(), conversation_id))

    async def insert_summary(self, record: SummaryRecord, message_ids: Sequence[int], child_ids: Sequence[str]) -> None:
        await self._run(
            f"INSERT INTO lcm.summaries ({SUM_COLUMNS}, words) VALUES ({', '.join(['%s'] * 16)}, %s::tsvector)",
            (
                record.id, record.conversation_id, record.kind, record.depth, record.start_seq, record.end_seq,
                record.content, record.token_count, record.source_token_count, record.earliest_at, record.latest_at,
                record.descendant_count, record.file_ids, record.summarizer_model, record.escalation, record.created_at,
                tsvector(record.content),
            ),
        )  # fmt: skip
        sources = [(m, None) for m in message_ids] + [(None, c) for c in child_ids]
        if sources:
            await self._run(
                "INSERT INTO lcm.summary_sources (summary_id, ordinal, message_id, child_summary_id)"
                " SELECT %s, o - 1, m, c FROM unnest(%s::bigint[], %s::text[]) WITH ORDINALITY AS s(m, c, o)",
                (record.id, [m for m, _ in sources], [c for _, c in sources]),
            )

    async def set_context(self, conversation_id: str, summary_ids: Sequence[str], summarized_upto: int) -> None:
        await self._run("DELETE FROM lcm.context_items WHERE conversation_id = %s", (conversation_id,))
        if summary_ids:
            await self._run(
                "INSERT INTO lcm.context_items (conversation_id, ordinal, summary_id)"
                " SELECT %s, o - 1, s FROM unnest(%s::text[]) WITH ORDINALITY AS u(s, o)",
                (conversation_id, list(summary_ids)),
            )
        await self._run(
            "UPDATE lcm.conversations SET summarized_upto = %s, stubbed_upto = greatest(stubbed_upto, %s)"
            " WHERE id = %s",
            (summarized_upto, summarized_upto, conversation_id),
        )

    async def set_stubbed_upto(self, conversation_id: str, seq: int) -> None:
        await self._run(
            "UPDATE lcm.conversations SET stubbed_upto = greatest(stubbed_upto, %s) WHERE id = %s",
            (seq, conversation_id),
        )

    async def set_last_sent(self, conversation_id: str, sent_json: str) -> None:
        # Nothing for a conversation deleted while its request ran.
        await self._run(
            "INSERT INTO lcm.last_sent (conversation_id, sent_json, updated_at) SELECT %s, %s, %s"
            " WHERE EXISTS (SELECT 1 FROM lcm.conversations WHERE id = %s AND deleted_at IS NULL)"
            " ON CONFLICT (conversation_id) DO UPDATE"
            " SET sent_json = excluded.sent_json, updated_at = excluded.updated_at",
            (conversation_id, sent_json, time.time(), conversation_id),
        )

    async def set_last_model(self, conversation_id: str, model: str) -> None:
        await self._run("UPDATE lcm.conversations SET last_model = %s WHERE id = %s", (model, conversation_id))

    async def put_response(self, record: ResponseRecord) -> None:
        await self._run(
            f"INSERT INTO lcm.responses ({RESPONSE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                record.id, record.scope, record.kind, record.conversation_id, record.position, record.previous_id,
                record.input_json, record.body_json, record.created_at,
            ),
        )  # fmt: skip

    async def put_file(self, record: FileRecord) -> None:
        await self._run(
            f"INSERT INTO lcm.files ({FILE_COLUMNS}) VALUES ({', '.join(['%s'] * 11)}) ON CONFLICT DO NOTHING",
            (
                record.id, record.tenant, record.conversation_id, record.name, record.mime, record.kind,
                record.bytes, record.sha256, record.path, record.exploration, record.created_at,
            ),
        )  # fmt: skip

    async def put_blobs(self, blobs: Sequence[tuple[str, bytes]]) -> None:
        if blobs:
            await self._run_many(
                "INSERT INTO lcm.blobs (path, content) VALUES (%s, %s) ON CONFLICT DO NOTHING", list(blobs)
            )

    async def take_compaction_lease(self, conversation_id: str, owner: str, ttl: float) -> bool:
        row = await self._one(
            "INSERT INTO lcm.compaction_leases (conversation_id, owner, expires_at)"
            f" VALUES (%s, %s, {NOW} + %s) ON CONFLICT (conversation_id) DO UPDATE"
            " SET owner = excluded.owner, expires_at = excluded.expires_at"
            f" WHERE lcm.compaction_leases.expires_at <= {NOW} OR lcm.compaction_leases.owner = excluded.owner"
            " RETURNING owner",
            (conversation_id, owner, ttl),
        )
        return row is not None and row[0] == owner

    async def renew_compaction_lease(self, conversation_id: str, owner: str, ttl: float) -> bool:
        changed = await self._run(
            f"UPDATE lcm.compaction_leases SET expires_at = {NOW} + %s WHERE conversation_id = %s AND owner = %s",
            (ttl, conversation_id, owner),
        )
        return changed > 0

    async def release_compaction_lease(self, conversation_id: str, owner: str) -> None:
        await self._run(
            "DELETE FROM lcm.compaction_leases WHERE conversation_id = %s AND owner = %s", (conversation_id, owner)
        )
