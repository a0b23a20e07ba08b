"""Append-only registry of the PostgreSQL store's schema migrations, recorded by name in ``lcm.migrations``.

Same rule as the SQLite registry (``proxy.store.sqlite.migrations``): never edit or reorder a step that has shipped.
Every table lives in the ``lcm`` schema, so the proxy can share a database with LiteLLM proxy (the same
``database_url``) without touching its tables. Several replicas may start at once: each step runs in its own
transaction holding an advisory lock, so exactly one of them applies it.

Search: a ``tsvector`` column that the store fills from the text when it writes a row (``postgres_words``:
folded in Python, as the query side folds, whatever the database's locale) with a GIN index for full text,
and a ``pg_trgm`` index for the case-insensitive substring scans that narrow a regular-expression search.
"""

from __future__ import annotations

import time
from typing import Any

MIGRATIONS: list[tuple[str, str]] = []
LOCK_KEY = "lcm-proxy:migrations"


def migration(name: str, sql: str) -> None:
    MIGRATIONS.append((name, sql))


migration(
    "p001_schema",
    """
    CREATE EXTENSION IF NOT EXISTS pg_trgm;

    CREATE TABLE lcm.conversations (
        id text PRIMARY KEY,
        tenant text NOT NULL,
        external_key text,
        parent_id text REFERENCES lcm.conversations(id),
        fork_seq integer,
        instructions_json text,
        message_count integer NOT NULL DEFAULT 0,
        token_count bigint NOT NULL DEFAULT 0,
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        summarized_upto integer NOT NULL DEFAULT 0,
        stubbed_upto integer NOT NULL DEFAULT 0,
        last_model text
    );
    CREATE UNIQUE INDEX conversations_external_key ON lcm.conversations(tenant, external_key)
        WHERE external_key IS NOT NULL;
    CREATE INDEX conversations_tenant_updated ON lcm.conversations(tenant, updated_at);
    CREATE INDEX conversations_parent ON lcm.conversations(parent_id) WHERE parent_id IS NOT NULL;

    CREATE TABLE lcm.messages (
        id bigserial PRIMARY KEY,
        conversation_id text NOT NULL REFERENCES lcm.conversations(id),
        seq integer NOT NULL,
        role text NOT NULL,
        original_json text NOT NULL,
        payload_paths text,
        forward_json text,
        compact_json text,
        text text NOT NULL,
        token_count integer NOT NULL,
        sent_token_count integer NOT NULL,
        chain_hash text NOT NULL,
        created_at double precision NOT NULL,
        compact_token_count integer,
        words tsvector NOT NULL,  -- postgres_words.tsvector(text)
        UNIQUE (conversation_id, seq)
    );
    CREATE INDEX messages_chain_hash ON lcm.messages(chain_hash);
    CREATE INDEX messages_words ON lcm.messages USING gin (words);
    CREATE INDEX messages_trigrams ON lcm.messages USING gin (text gin_trgm_ops);

    CREATE TABLE lcm.files (
        id text PRIMARY KEY,
        tenant text NOT NULL,
        conversation_id text REFERENCES lcm.conversations(id),
        name text NOT NULL,
        mime text NOT NULL,
        kind text NOT NULL,
        bytes bigint NOT NULL,
        sha256 text NOT NULL,
        path text NOT NULL,
        exploration text,
        created_at double precision NOT NULL
    );
    CREATE INDEX files_path ON lcm.files(path);
    CREATE TABLE lcm.message_files (
        message_id bigint NOT NULL REFERENCES lcm.messages(id),
        file_id text NOT NULL REFERENCES lcm.files(id),
        PRIMARY KEY (message_id, file_id)
    );
    CREATE INDEX message_files_file ON lcm.message_files(file_id);

    -- Payload contents, shared by every replica (never a replica's local disk).
    CREATE TABLE lcm.blobs (
        path text PRIMARY KEY,
        content bytea NOT NULL
    );

    CREATE TABLE lcm.summaries (
        pk bigserial PRIMARY KEY,
        id text NOT NULL UNIQUE,
        conversation_id text NOT NULL REFERENCES lcm.conversations(id),
        kind text NOT NULL CHECK (kind IN ('leaf', 'condensed')),
        depth integer NOT NULL,
        start_seq integer NOT NULL,
        end_seq integer NOT NULL,
        content text NOT NULL,
        token_count integer NOT NULL,
        source_token_count integer NOT NULL,
        earliest_at double precision NOT NULL,
        latest_at double precision NOT NULL,
        descendant_count integer NOT NULL,
        file_ids text,
        summarizer_model text,
        escalation integer NOT NULL,
        created_at double precision NOT NULL,
        words tsvector NOT NULL  -- postgres_words.tsvector(content)
    );
    CREATE INDEX summaries_conversation ON lcm.summaries(conversation_id, start_seq);
    CREATE INDEX summaries_words ON lcm.summaries USING gin (words);

    CREATE TABLE lcm.summary_sources (
        summary_id text NOT NULL REFERENCES lcm.summaries(id),
        ordinal integer NOT NULL,
        message_id bigint REFERENCES lcm.messages(id),
        child_summary_id text REFERENCES lcm.summaries(id),
        PRIMARY KEY (summary_id, ordinal),
        CHECK ((message_id IS NULL) <> (child_summary_id IS NULL))
    );
    CREATE INDEX summary_sources_message ON lcm.summary_sources(message_id);
    CREATE INDEX summary_sources_child ON lcm.summary_sources(child_summary_id);

    CREATE TABLE lcm.context_items (
        conversation_id text NOT NULL REFERENCES lcm.conversations(id),
        ordinal integer NOT NULL,
        summary_id text NOT NULL REFERENCES lcm.summaries(id),
        PRIMARY KEY (conversation_id, ordinal)
    );

    CREATE TABLE lcm.last_sent (
        conversation_id text PRIMARY KEY REFERENCES lcm.conversations(id),
        sent_json text NOT NULL,
        updated_at double precision NOT NULL
    );

    CREATE TABLE lcm.relayed_answers (
        conversation_id text PRIMARY KEY REFERENCES lcm.conversations(id),
        seq integer NOT NULL,
        created_at double precision NOT NULL
    );

    -- Expiry is the database's clock, never a replica's: replicas' clocks may disagree.
    CREATE TABLE lcm.compaction_leases (
        conversation_id text PRIMARY KEY,
        owner text NOT NULL,
        expires_at double precision NOT NULL
    );
    """,
)


migration(
    "p002_deleted_conversations",
    """
    -- A conversation deleted while live forks still share its prefix stays, marked, holding only what they need
    -- (proxy.engine.deletion); every lookup made for a client skips it.
    ALTER TABLE lcm.conversations ADD COLUMN deleted_at double precision;
    -- Deleting walks forks and references: the foreign keys checked on every delete have an index each.
    CREATE INDEX conversations_updated ON lcm.conversations(updated_at);
    CREATE INDEX files_conversation ON lcm.files(conversation_id);
    CREATE INDEX context_items_summary ON lcm.context_items(summary_id);
    """,
)


migration(
    "p003_conversation_dialects",
    """
    -- The wire format a conversation's messages are stored in (proxy.dialects): how the engine reads them
    -- when no request is at hand (a background or operator's compaction, recall). Every conversation stored
    -- before there were other formats is chat.
    ALTER TABLE lcm.conversations ADD COLUMN dialect text NOT NULL DEFAULT 'chat';
    """,
)


migration(
    "p004_ledger_items",
    """
    -- The ledger of standing instructions: see proxy.store.sqlite.migrations (m008_ledger_items).
    CREATE TABLE lcm.ledger_items (
        id text PRIMARY KEY,
        conversation_id text NOT NULL REFERENCES lcm.conversations(id),
        kind text NOT NULL,
        slot text NOT NULL,
        value text NOT NULL,
        text text NOT NULL,
        seq integer NOT NULL,
        message_id bigint NOT NULL REFERENCES lcm.messages(id),
        role text NOT NULL,
        created_at double precision NOT NULL,
        superseded_seq integer,
        superseded_by text,
        state text NOT NULL DEFAULT 'active'
    );
    CREATE INDEX ledger_items_conversation ON lcm.ledger_items(conversation_id, seq);
    CREATE INDEX ledger_items_message ON lcm.ledger_items(message_id);
    """,
)


migration(
    "p005_ledger_open_items",
    """
    -- A conversation's open items, as they are read: see proxy.store.sqlite.migrations (m009_ledger_open_items).
    -- Not CONCURRENTLY (a step runs in a transaction): the ledger's writers wait while the index is built.
    CREATE INDEX ledger_items_open ON lcm.ledger_items(conversation_id, seq, id) WHERE superseded_seq IS NULL;
    """,
)


migration(
    "p006_continued_conversations",
    """
    -- See proxy.store.sqlite.migrations (m010_continued_conversations).
    ALTER TABLE lcm.conversations ADD COLUMN continued integer NOT NULL DEFAULT 0;
    """,
)


migration(
    "p007_linked_conversations",
    """
    -- See proxy.store.sqlite.migrations (m011_linked_conversations).
    ALTER TABLE lcm.conversations ADD COLUMN linked_to text;
    """,
)


migration(
    "p008_responses",
    """
    -- See proxy.store.sqlite.migrations (m012_responses).
    CREATE TABLE lcm.responses (
        id text PRIMARY KEY,
        scope text NOT NULL,
        kind text NOT NULL,
        conversation_id text,
        position bigint NOT NULL DEFAULT 0,
        previous_id text,
        input_json text,
        body_json text,
        created_at double precision NOT NULL
    );
    CREATE INDEX responses_conversation ON lcm.responses(conversation_id);
    """,
)


migration(
    "p009_running_token_sums",
    """
    -- See proxy.store.sqlite.migrations (m013_running_token_sums).
    ALTER TABLE lcm.messages ADD COLUMN cum_tokens bigint;
    ALTER TABLE lcm.messages ADD COLUMN cum_sent_tokens bigint;
    ALTER TABLE lcm.messages ADD COLUMN cum_compact_tokens bigint;
    UPDATE lcm.messages m SET cum_tokens = r.t, cum_sent_tokens = r.s, cum_compact_tokens = r.k
    FROM (
        SELECT id, sum(token_count) OVER w AS t, sum(sent_token_count) OVER w AS s,
            sum(coalesce(compact_token_count, token_count)) OVER w AS k
        FROM lcm.messages WINDOW w AS (PARTITION BY conversation_id ORDER BY seq)
    ) AS r
    WHERE r.id = m.id;
    CREATE INDEX messages_forwarded ON lcm.messages(conversation_id, seq) WHERE forward_json IS NOT NULL;
    """,
)


async def recorded(conn: Any) -> set[str]:
    """The migrations recorded as applied (none before the first): read without any DDL, so a role that may
    use the ``lcm`` schema but not create one starts once the schema is up to date."""
    cursor = await conn.execute("SELECT to_regclass('lcm.migrations') IS NOT NULL")
    row = await cursor.fetchone()
    if not row or not row[0]:
        return set()
    cursor = await conn.execute("SELECT name FROM lcm.migrations")
    return {str(r[0]) for r in await cursor.fetchall()}


async def apply_migrations(conn: Any) -> list[str]:
    """Apply every migration not yet recorded, on an autocommit ``psycopg.AsyncConnection``; safe to run
    from several replicas at once."""
    applied: list[str] = []
    done = await recorded(conn)
    for name, sql in MIGRATIONS:
        if name in done:
            continue
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (LOCK_KEY,))
            await conn.execute("CREATE SCHEMA IF NOT EXISTS lcm")
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS lcm.migrations (name text PRIMARY KEY, applied_at float8 NOT NULL)"
            )
            cursor = await conn.execute("SELECT 1 FROM lcm.migrations WHERE name = %s", (name,))
            if await cursor.fetchone() is None:
                await conn.execute(sql)  # several statements: sent as one simple query (no parameters)
                await conn.execute("INSERT INTO lcm.migrations (name, applied_at) VALUES (%s, %s)", (name, time.time()))
                applied.append(name)
    return applied


migration(
    "p010_ledger_read_upto",
    """
    -- See proxy.store.sqlite.migrations (m014_ledger_read_upto).
    ALTER TABLE lcm.conversations ADD COLUMN ledger_upto integer NOT NULL DEFAULT 0;
    UPDATE lcm.conversations SET ledger_upto = message_count;
    """,
)
