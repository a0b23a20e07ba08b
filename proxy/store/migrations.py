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
