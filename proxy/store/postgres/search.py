"""The PostgreSQL store's long-running queries (``Searches``): full text over the ``tsvector`` columns (GIN),
substring narrowing for regular-expression scans over a ``pg_trgm`` index, and the doctor's walk. Each runs in
a transaction of its own with a ``statement_timeout`` (``SET LOCAL``: it ends with the transaction, so no
pooled session keeps it).

Ranking (``ranked``): ``ts_rank`` alone knows nothing of how rare a word is, so a message repeating the
question's common words ("login error") outranked the one naming its rare identifier ("ABC-4711"), and with
only the best few handed over (auto-recall takes 40) the one that mattered was left out. As FTS5's ``bm25``
does, each term is weighted by its rarity among the rows searched, ``ln(1 + (N - n + 0.5) / (n + 0.5))``, times
``ts_rank`` of that term alone (which grows with repeats, saturating, and is divided by the log of the
length). Which order two near matches come in is not promised; that the rare word's row is among the first is."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from proxy.scopes import end_users_of
from proxy.store.base import Bounds, Hit, Phrase
from proxy.store.postgres.reads import CONV_COLUMNS, SUM_COLUMNS, PostgresReads, prefixed, translated
from proxy.store.postgres.words import term_queries
from proxy.store.records import ConversationRecord, SummaryRecord

SEARCH_TIMEOUT_MS = 10_000  # a search or scan that runs longer is cancelled (reported as a busy store)
_SUMMARY = prefixed(SUM_COLUMNS, "s")


def within(bounds: Bounds, conversation_column: str, position: str) -> tuple[str, tuple[Any, ...]]:
    """SQL condition and arguments: ``position`` (``m.seq <`` or ``s.end_seq <=``) within ``bounds``."""
    if not bounds:
        return "false", ()
    clause = " OR ".join(f"({conversation_column} = %s AND {position} %s)" for _ in bounds)
    return f"({clause})", tuple(v for pair in bounds for v in pair)


def ranked(hits: str, total: str, key: str) -> str:
    """The ``WITH`` clauses that score rows: ``hits`` selects ``key`` and ``words`` of the rows matching any
    term, ``total`` counts the rows searched (``n``). Parameters, in order: the terms (a ``tsquery`` array),
    then those of ``hits`` and ``total``. Defines ``scored(key, score)``."""
    return (
        "WITH terms AS (SELECT q FROM unnest(CAST(%s AS tsquery[])) AS t(q)),"
        f" hits AS ({hits}), total AS ({total}),"
        # MATERIALIZED: referenced once, df would be inlined and its counts recomputed for every hit
        # (quadratic in the conversation's length).
        " df AS MATERIALIZED (SELECT t.q, (SELECT count(*) FROM hits h WHERE h.words @@ t.q) AS n FROM terms t),"
        f" scored AS (SELECT h.{key}, sum(ln(1 + (greatest(total.n, df.n) - df.n + 0.5) / (df.n + 0.5))"
        "   * ts_rank(h.words, df.q, 1)) AS score"
        f"   FROM hits h JOIN df ON h.words @@ df.q CROSS JOIN total GROUP BY h.{key})"
    )


def _like(literal: str) -> str:
    escaped = literal.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class PostgresSearches(PostgresReads):
    @contextlib.asynccontextmanager
    async def _bounded(self) -> AsyncIterator[PostgresReads]:
        assert self.pool is not None
        with translated():
            async with self.pool.connection() as conn, conn.transaction():
                await conn.execute(f"SET LOCAL statement_timeout = {int(SEARCH_TIMEOUT_MS)}")
                yield PostgresReads(conn=conn)

    async def _search_all(self, sql: str, args: Sequence[Any]) -> list[Any]:
        async with self._bounded() as session:
            return await session._all(sql, args)

    async def search_messages(
        self, conversation_id: str, phrases: Sequence[Phrase], before_seq: int, limit: int, *, max_chars: int = 1 << 30
    ) -> list[Hit]:
        terms = term_queries(phrases)
        if not terms:
            return []
        scoring = ranked(
            "SELECT id, seq, words FROM lcm.messages WHERE conversation_id = %s AND seq < %s"
            " AND words @@ CAST(%s AS tsquery)",
            "SELECT least(%s, message_count) AS n FROM lcm.conversations WHERE id = %s",
            "id",
        )
        rows = await self._search_all(
            f"{scoring} SELECT m.id, m.seq, m.role, left(m.text, %s), m.created_at FROM scored s"
            " JOIN lcm.messages m ON m.id = s.id ORDER BY s.score DESC, m.seq DESC LIMIT %s",
            (terms, conversation_id, before_seq, " | ".join(terms), before_seq, conversation_id, max_chars, limit),
        )
        return [(int(r[0]), int(r[1]), str(r[2]), str(r[3]), float(r[4])) for r in rows]

    async def scan_messages(self, conversation_id: str, before_seq: int, *, literal: str | None = None) -> list[Hit]:
        where, args = ("AND text ILIKE %s", (_like(literal),)) if literal else ("", ())
        rows = await self._search_all(
            "SELECT id, seq, role, text, created_at FROM lcm.messages WHERE conversation_id = %s AND seq < %s"
            f" {where} ORDER BY seq DESC",
            (conversation_id, before_seq, *args),
        )
        return [(int(r[0]), int(r[1]), str(r[2]), str(r[3]), float(r[4])) for r in rows]

    async def search_summaries(self, phrases: Sequence[Phrase], bounds: Bounds, limit: int) -> list[SummaryRecord]:
        terms = term_queries(phrases)
        if not terms:
            return []
        visible, args = within(bounds, "s.conversation_id", "s.end_seq <=")
        scoring = ranked(
            f"SELECT s.pk, s.words FROM lcm.summaries s WHERE s.words @@ CAST(%s AS tsquery) AND {visible}",
            f"SELECT count(*) AS n FROM lcm.summaries s WHERE {visible}",
            "pk",
        )
        rows = await self._search_all(
            f"{scoring} SELECT {_SUMMARY} FROM scored x JOIN lcm.summaries s ON s.pk = x.pk"
            " ORDER BY x.score DESC, s.pk DESC LIMIT %s",
            (terms, " | ".join(terms), *args, *args, limit),
        )
        return [SummaryRecord(*r) for r in rows]

    async def scan_summaries(self, bounds: Bounds) -> list[SummaryRecord]:
        visible, args = within(bounds, "s.conversation_id", "s.end_seq <=")
        rows = await self._search_all(
            f"SELECT {_SUMMARY} FROM lcm.summaries s WHERE {visible} ORDER BY s.pk DESC", args
        )
        return [SummaryRecord(*r) for r in rows]

    async def visible_file_ids(self, scope: str, bounds: Bounds) -> list[str]:
        visible, args = within(bounds, "m.conversation_id", "m.seq <")
        rows = await self._search_all(
            "SELECT DISTINCT f.id FROM lcm.files f JOIN lcm.message_files mf ON mf.file_id = f.id"
            f" JOIN lcm.messages m ON m.id = mf.message_id WHERE f.tenant = %s AND {visible} ORDER BY f.id",
            (scope, *args),
        )
        return [str(r[0]) for r in rows]

    async def file_visible(self, file_id: str, bounds: Bounds) -> bool:
        visible, args = within(bounds, "m.conversation_id", "m.seq <")
        rows = await self._search_all(
            "SELECT 1 FROM lcm.message_files mf JOIN lcm.messages m ON m.id = mf.message_id WHERE mf.file_id = %s"
            f" AND {visible} LIMIT 1",
            (file_id, *args),
        )
        return bool(rows)

    async def message_seqs(self, conversation_id: str) -> list[int]:
        rows = await self._all(
            "SELECT seq FROM lcm.messages WHERE conversation_id = %s ORDER BY seq", (conversation_id,)
        )
        return [int(r[0]) for r in rows]

    async def context_items(self, conversation_id: str) -> list[tuple[str, bool]]:
        rows = await self._all(
            "SELECT ci.summary_id, s.id IS NOT NULL FROM lcm.context_items ci LEFT JOIN lcm.summaries s"
            " ON s.id = ci.summary_id WHERE ci.conversation_id = %s ORDER BY ci.ordinal",
            (conversation_id,),
        )
        return [(str(r[0]), bool(r[1])) for r in rows]

    async def payload_messages(self, conversation_id: str) -> list[tuple[int, int, str, str]]:
        rows = await self._all(
            "SELECT id, seq, original_json, payload_paths FROM lcm.messages"
            " WHERE conversation_id = %s AND payload_paths IS NOT NULL ORDER BY seq",
            (conversation_id,),
        )
        return [(int(r[0]), int(r[1]), str(r[2]), str(r[3])) for r in rows]

    async def summary_sources(self, summary_id: str) -> list[tuple[int | None, str | None, int | None]]:
        rows = await self._all(
            "SELECT ss.message_id, ss.child_summary_id, m.seq FROM lcm.summary_sources ss"
            " LEFT JOIN lcm.messages m ON m.id = ss.message_id WHERE ss.summary_id = %s ORDER BY ss.ordinal",
            (summary_id,),
        )
        return [(r[0], r[1], r[2]) for r in rows]

    async def all_files(self) -> list[tuple[str, str, str]]:
        rows = await self._all("SELECT id, path, sha256 FROM lcm.files ORDER BY id")
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    async def idle_conversations(self, before: float | None, scope: str | None, limit: int) -> list[ConversationRecord]:
        rows = await self._search_all(
            f"SELECT {CONV_COLUMNS} FROM lcm.conversations WHERE deleted_at IS NULL"
            " AND (%s::float8 IS NULL OR updated_at < %s)"
            " AND (%s::text IS NULL OR tenant = %s OR left(tenant, length(%s::text)) = %s::text)"
            " ORDER BY updated_at, id LIMIT %s",
            (before, before, scope, scope, end_users_of(scope), end_users_of(scope), limit),
        )
        return [ConversationRecord(*r) for r in rows]
