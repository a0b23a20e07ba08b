"""Append-only registry of schema migrations, recorded by name in ``_migrations``.

Never edit or reorder a step that has shipped: add a new one. Each step runs in its own transaction
together with the row that records it, so a crash mid-migration leaves the database at the previous step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import aiosqlite

Migration = Callable[[aiosqlite.Connection], "object"]
MIGRATIONS: list[tuple[str, str]] = []


def migration(name: str, sql: str) -> None:
    MIGRATIONS.append((name, sql))


migration(
    "m001_conversations_messages_files",
    """
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY,                      -- conv_<16 hex>
        tenant TEXT NOT NULL,
        external_key TEXT,                        -- X-LCM-Conversation-Id chosen by the client
        parent_id TEXT REFERENCES conversations(id),
        fork_seq INTEGER,                         -- messages [0, fork_seq) were copied from the parent
        instructions_json TEXT,                   -- latest leading system/developer messages
        message_count INTEGER NOT NULL DEFAULT 0,
        token_count INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX conversations_external_key ON conversations(tenant, external_key)
        WHERE external_key IS NOT NULL;
    CREATE INDEX conversations_tenant_updated ON conversations(tenant, updated_at);

    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id TEXT NOT NULL REFERENCES conversations(id),
        seq INTEGER NOT NULL,                     -- 0-based position after the instructions
        role TEXT NOT NULL,
        original_json TEXT NOT NULL,              -- the client's message; big payloads replaced by file refs
        payload_paths TEXT,                       -- JSON list of paths where refs replaced payloads
        forward_json TEXT,                        -- what is forwarded instead, when it differs (stubs)
        compact_json TEXT,                        -- cheaper stubbed form used once compaction is due
        text TEXT NOT NULL,                       -- searchable text
        token_count INTEGER NOT NULL,             -- tokens of the forwarded form
        sent_token_count INTEGER NOT NULL,        -- tokens of the message as the client sent it
        chain_hash TEXT NOT NULL,
        created_at REAL NOT NULL,
        UNIQUE (conversation_id, seq)
    );
    CREATE INDEX messages_chain_hash ON messages(chain_hash);

    CREATE TABLE files (
        id TEXT PRIMARY KEY,                      -- file_<16 hex>, derived from tenant + content hash
        tenant TEXT NOT NULL,
        conversation_id TEXT REFERENCES conversations(id),   -- where it was first seen
        name TEXT NOT NULL,
        mime TEXT NOT NULL,
        kind TEXT NOT NULL,                       -- file_block | tool_output | pasted_text | base64
        bytes INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        path TEXT NOT NULL,                       -- relative to the data directory
        exploration TEXT,
        created_at REAL NOT NULL
    );
    CREATE TABLE message_files (
        message_id INTEGER NOT NULL REFERENCES messages(id),
        file_id TEXT NOT NULL REFERENCES files(id),
        PRIMARY KEY (message_id, file_id)
    );
    CREATE INDEX message_files_file ON message_files(file_id);

    CREATE VIRTUAL TABLE messages_fts USING fts5(
        text, content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, text) VALUES (new.id, new.text);
    END;
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, text) VALUES ('delete', old.id, old.text);
    END;
    """,
)


async def apply_migrations(conn: aiosqlite.Connection) -> list[str]:
    """Apply every migration not yet recorded. Safe to call from several processes at once."""
    await conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    await conn.commit()
    applied: list[str] = []
    for name, sql in MIGRATIONS:
        await conn.execute("BEGIN IMMEDIATE")
        try:
            async with conn.execute("SELECT 1 FROM _migrations WHERE name = ?", (name,)) as cursor:
                done = await cursor.fetchone() is not None
            if not done:
                for statement in _statements(sql):
                    await conn.execute(statement)
                await conn.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, time.time()))
                applied.append(name)
            await conn.commit()
        except BaseException:
            await conn.rollback()
            raise
    return applied


def _statements(sql: str) -> list[str]:
    """Split a script into statements (``executescript`` would commit our transaction)."""
    import sqlite3

    out: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                out.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        out.append(buffer.strip())
    return out


migration(
    "m002_summary_dag",
    """
    CREATE TABLE summaries (
        pk INTEGER PRIMARY KEY,                   -- stable rowid for the FTS index (VACUUM keeps it)
        id TEXT NOT NULL UNIQUE,                  -- sum_<16 hex>
        conversation_id TEXT NOT NULL REFERENCES conversations(id),
        kind TEXT NOT NULL CHECK (kind IN ('leaf', 'condensed')),
        depth INTEGER NOT NULL,
        start_seq INTEGER NOT NULL,               -- covers messages [start_seq, end_seq) of conversation_id
        end_seq INTEGER NOT NULL,
        content TEXT NOT NULL,
        token_count INTEGER NOT NULL,
        source_token_count INTEGER NOT NULL,
        earliest_at REAL NOT NULL,
        latest_at REAL NOT NULL,
        descendant_count INTEGER NOT NULL,
        file_ids TEXT,                            -- JSON list of file ids mentioned in the sources
        summarizer_model TEXT,
        escalation INTEGER NOT NULL,              -- 0 normal, 1 aggressive, 2 deterministic fallback
        created_at REAL NOT NULL
    );
    CREATE INDEX summaries_conversation ON summaries(conversation_id, start_seq);

    CREATE TABLE summary_sources (
        summary_id TEXT NOT NULL REFERENCES summaries(id),
        ordinal INTEGER NOT NULL,
        message_id INTEGER REFERENCES messages(id),
        child_summary_id TEXT REFERENCES summaries(id),
        PRIMARY KEY (summary_id, ordinal),
        CHECK ((message_id IS NULL) != (child_summary_id IS NULL))
    );
    CREATE INDEX summary_sources_message ON summary_sources(message_id);
    CREATE INDEX summary_sources_child ON summary_sources(child_summary_id);

    -- The summarised part of each conversation's active context, oldest first. Raw messages from
    -- conversations.summarized_upto on follow them implicitly: a compaction swaps a run of items (or of raw
    -- messages) for one summary in a single transaction.
    CREATE TABLE context_items (
        conversation_id TEXT NOT NULL REFERENCES conversations(id),
        ordinal INTEGER NOT NULL,
        summary_id TEXT NOT NULL REFERENCES summaries(id),
        PRIMARY KEY (conversation_id, ordinal)
    );

    ALTER TABLE conversations ADD COLUMN summarized_upto INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE conversations ADD COLUMN stubbed_upto INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE conversations ADD COLUMN last_model TEXT;
    ALTER TABLE messages ADD COLUMN compact_token_count INTEGER;

    CREATE VIRTUAL TABLE summaries_fts USING fts5(
        content, content='summaries', content_rowid='pk', tokenize='unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER summaries_fts_insert AFTER INSERT ON summaries BEGIN
        INSERT INTO summaries_fts(rowid, content) VALUES (new.pk, new.content);
    END;
    CREATE TRIGGER summaries_fts_delete AFTER DELETE ON summaries BEGIN
        INSERT INTO summaries_fts(summaries_fts, rowid, content) VALUES ('delete', old.pk, old.content);
    END;
    """,
)

migration(
    "m003_last_sent",
    """
    -- What the last request of each conversation actually forwarded (summaries, those that did not fit, the
    -- first raw message), so that the admin views and `show` report what was sent, not the stored context.
    CREATE TABLE last_sent (
        conversation_id TEXT PRIMARY KEY REFERENCES conversations(id),
        sent_json TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
)

migration(
    "m004_relayed_answers",
    """
    -- The answer the proxy relayed and stored as a conversation's last message before the client re-sent it
    -- (proxy.engine.answers). While it is still the last message and nothing summarises it, the client's own
    -- version of it (or a regenerated answer) replaces it in place instead of forking.
    CREATE TABLE relayed_answers (
        conversation_id TEXT PRIMARY KEY REFERENCES conversations(id),
        seq INTEGER NOT NULL,
        created_at REAL NOT NULL                  -- when the request it answered arrived (the latest wins)
    );
    """,
)

migration(
    "m005_compaction_leases",
    """
    -- At most one compaction sweep of a conversation at a time, across processes (several workers, the
    -- operator's CLI): a sweep takes its conversation's lease in a write transaction, renews it while it runs
    -- and deletes it when done. A lease past expires_at (its holder died) may be taken over.
    CREATE TABLE compaction_leases (
        conversation_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,                      -- host:pid:token of the sweep that holds it
        expires_at REAL NOT NULL                  -- unix time
    );
    """,
)

migration(
    "m006_deleted_conversations",
    """
    -- A conversation deleted while live forks still share its prefix stays, marked, holding only what they need
    -- (proxy.engine.deletion); every lookup made for a client skips it.
    ALTER TABLE conversations ADD COLUMN deleted_at REAL;
    -- Deleting walks forks and references: the foreign keys checked on every delete have an index each.
    CREATE INDEX conversations_parent ON conversations(parent_id) WHERE parent_id IS NOT NULL;
    CREATE INDEX conversations_updated ON conversations(updated_at);
    CREATE INDEX files_conversation ON files(conversation_id);
    CREATE INDEX context_items_summary ON context_items(summary_id);
    """,
)

migration(
    "m007_conversation_dialects",
    """
    -- The wire format a conversation's messages are stored in (proxy.dialects): how the engine reads them
    -- when no request is at hand (a background or operator's compaction, recall). Every conversation stored
    -- before there were other formats is chat.
    ALTER TABLE conversations ADD COLUMN dialect TEXT NOT NULL DEFAULT 'chat';
    """,
)

migration(
    "m008_ledger_items",
    """
    -- The ledger of standing instructions (proxy.engine.standing.ledger): what the user or the agent set to hold from
    -- then on, each with the message it came from. An item is current until a later statement of the same kind
    -- and slot supersedes it (superseded_seq: that statement's message; superseded_by: its item, in the same
    -- conversation). A fork holds copies of its parent's items under ids of its own (proxy.store.ledger).
    CREATE TABLE ledger_items (
        id TEXT PRIMARY KEY,                      -- led_<16 hex>
        conversation_id TEXT NOT NULL REFERENCES conversations(id),
        kind TEXT NOT NULL,                       -- rule | constraint | preference | goal | decision | name
        slot TEXT NOT NULL,                       -- what it is about, normalised: the supersession key
        value TEXT NOT NULL,                      -- the part an update changes
        text TEXT NOT NULL,                       -- the sentence as stated (credentials masked)
        seq INTEGER NOT NULL,                     -- the message it came from
        message_id INTEGER NOT NULL REFERENCES messages(id),
        role TEXT NOT NULL,
        created_at REAL NOT NULL,
        superseded_seq INTEGER,
        superseded_by TEXT,
        state TEXT NOT NULL DEFAULT 'active'      -- active | pinned | dropped (set by the user)
    );
    CREATE INDEX ledger_items_conversation ON ledger_items(conversation_id, seq);
    -- Deleting messages checks this foreign key: an index, as every other one has.
    CREATE INDEX ledger_items_message ON ledger_items(message_id);
    """,
)

migration(
    "m009_ledger_open_items",
    """
    -- A conversation's open items (no later statement replaced them), in the order they are read: what every
    -- ingest that states something reads, before its write transaction and inside it, and what each chunk of a
    -- large request is planned against (proxy.engine.chunks). ledger_items_conversation alone made that read scan
    -- every item the conversation ever had: 20,000 after 20,000 small rule-setting messages, for 300 open ones.
    CREATE INDEX ledger_items_open ON ledger_items(conversation_id, seq, id) WHERE superseded_seq IS NULL;
    """,
)


migration(
    "m010_continued_conversations",
    """
    -- 1 when the conversation continues its parent after the client compacted the transcript itself (Claude Code's
    -- /compact, Codex's): nothing of the parent was copied, and its messages [0, fork_seq) stay in recall's scope.
    ALTER TABLE conversations ADD COLUMN continued INTEGER NOT NULL DEFAULT 0;
    """,
)


migration(
    "m011_linked_conversations",
    """
    -- A sub-agent's conversation (Claude Code's x-claude-code-agent-id): the conversation of the agent that started it.
    ALTER TABLE conversations ADD COLUMN linked_to TEXT;
    """,
)


migration(
    "m012_responses",
    """
    -- What the Responses door issued: answers a client may chain to (previous_response_id) or read back, and the
    -- compaction checkpoints it handed Codex, each standing for a conversation's first `position` messages.
    -- Looked up by id within the scope that received it; deleted with the conversation.
    CREATE TABLE responses (
        id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        kind TEXT NOT NULL,
        conversation_id TEXT,
        position INTEGER NOT NULL DEFAULT 0,
        previous_id TEXT,
        input_json TEXT,
        body_json TEXT,
        created_at REAL NOT NULL
    );
    CREATE INDEX responses_conversation ON responses(conversation_id);
    """,
)


migration(
    "m013_running_token_sums",
    """
    -- Each message's running sums of its conversation's token counts over [0, seq] (proxy.store.running): a request
    -- reads the cost of any range of a long conversation from two rows instead of adding up one row per message.
    -- Rows stored before this step get theirs here; a row without them makes readers add the rows up.
    ALTER TABLE messages ADD COLUMN cum_tokens INTEGER;
    ALTER TABLE messages ADD COLUMN cum_sent_tokens INTEGER;
    ALTER TABLE messages ADD COLUMN cum_compact_tokens INTEGER;
    UPDATE messages SET cum_tokens = r.t, cum_sent_tokens = r.s, cum_compact_tokens = r.k
    FROM (
        SELECT id, sum(token_count) OVER w AS t, sum(sent_token_count) OVER w AS s,
            sum(coalesce(compact_token_count, token_count)) OVER w AS k
        FROM messages WINDOW w AS (PARTITION BY conversation_id ORDER BY seq)
    ) AS r
    WHERE r.id = messages.id;
    -- The few messages forwarded in another form than stored (stubs): what every request reads of them, without
    -- visiting every other message of the conversation.
    CREATE INDEX messages_forwarded ON messages(conversation_id, seq) WHERE forward_json IS NOT NULL;
    """,
)


migration(
    "m014_ledger_read_upto",
    """
    -- Messages [0, ledger_upto) of a conversation have been read for standing instructions
    -- (proxy.engine.standing.reader): the rest are read after the response, or before the ledger is next needed.
    -- Every message stored before this step was read when it was stored.
    ALTER TABLE conversations ADD COLUMN ledger_upto INTEGER NOT NULL DEFAULT 0;
    UPDATE conversations SET ledger_upto = message_count;
    """,
)
