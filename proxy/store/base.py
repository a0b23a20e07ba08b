"""The store interface the engine is typed against; ``sqlite.py`` and ``postgres.py`` implement it.

A store has three doors. ``read`` serves short indexed reads on the request path. ``search`` serves what may run
long (full-text search, scans for a regular expression, the doctor's checks). ``write()`` opens one transaction:
every write decision (which conversation a request belongs to, an append, a fork, a compaction swap) is made
inside one, after taking the locks it needs (``lock_identity``, ``lock_conversation``). SQLite serialises all
writers anyway, so its locks cost nothing; PostgreSQL runs transactions side by side on several replicas and
takes a transaction-scoped advisory lock per key (released at commit, so nothing leaks under PgBouncer).

Payload files (huge pastes, tool outputs, images) live behind ``Blobs``: files under the data directory with
SQLite, rows in the database with PostgreSQL (every replica sees them). A request collects its payloads in a
``BlobBatch`` outside the transaction and publishes them inside the transaction that stores the rows naming
them, so a committed row never names a missing payload.

Deleted conversations (``proxy.engine.deletion``): one that live forks still share a prefix with stays as a
row marked ``deleted_at``, holding only what they need. Reads made for clients never return it (``conversation``,
the key and chain lookups, listings); ``deleted=True`` is for what must walk through it (a fork's recall scope,
the doctor, the deletion itself).

No SQL and no driver here: records (``records.py``) and these protocols are all the engine sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from proxy.store.records import (
    ConversationRecord,
    FileRecord,
    LedgerItem,
    MessageRecord,
    NewMessage,
    Removed,
    ResponseRecord,
    SummaryRecord,
)

# (conversation id, n): messages [0, n) of that conversation. A recall scope is a tuple of these (the current
# conversation first, then its ancestors up to where each fork left them).
Bounds = Sequence[tuple[str, int]]

# (id, seq, role, text, created_at) of a message found by a search.
Hit = tuple[int, int, str, str, float]


@dataclass(frozen=True)
class Phrase:
    """One full-text search term: folded words (letters and digits only, so no store's query syntax can
    appear in them) that must follow each other; a single word may match as a prefix."""

    parts: tuple[str, ...]
    prefix: bool = False


class Reads(Protocol):
    """Reads, on the request path or inside a write transaction. ``scope=None`` is for the operator's CLI
    only, which sees every scope. A scope is a tenant, or an end user within it (``proxy.scopes``); the
    records keep it in their ``tenant`` field (and the tables in their ``tenant`` column)."""

    async def conversation(
        self, scope: str | None, conversation_id: str, *, deleted: bool = False
    ) -> ConversationRecord | None:
        """``deleted=True``: also a deleted conversation kept for its forks."""
        ...

    async def conversation_by_key(self, scope: str, key: str) -> ConversationRecord | None: ...
    async def response(self, scope: str, response_id: str) -> ResponseRecord | None: ...
    async def conversations_by_key(self, key: str) -> list[ConversationRecord]:
        """At most two conversations of any tenant whose clients named ``key``: enough to tell unique from
        ambiguous."""
        ...

    async def conversations(
        self, scope: str | None = None, limit: int = 1000, *, deleted: bool = False
    ) -> list[ConversationRecord]:
        """Newest activity first; ``deleted=True``: with the deleted conversations kept for their forks."""
        ...

    async def chain_exists(self, chain_hash: str) -> bool: ...
    async def chain_in_conversation(self, conversation_id: str, seq: int, chain_hash: str) -> bool: ...
    async def chain_in_any(self, conversation_ids: Sequence[str], chain_hash: str) -> bool: ...
    async def descendants(self, scope: str, conversation_id: str, limit: int = 1000) -> list[str]:
        """Ids of the (not deleted) conversations forked from ``conversation_id``, directly or through other
        forks."""
        ...

    async def family(self, conversation_id: str) -> list[ConversationRecord]:
        """Every conversation forked from ``conversation_id``, directly or through other forks, deleted ones
        included: what the deletion's fork rule looks at."""
        ...

    async def conversations_with_chain(self, scope: str, chain_hash: str) -> list[ConversationRecord]: ...
    async def messages(self, conversation_id: str, start: int = 0, end: int | None = None) -> list[MessageRecord]: ...
    async def messages_by_id(self, message_ids: Sequence[int]) -> list[MessageRecord]: ...
    async def source_messages(self, summary_id: str) -> list[MessageRecord]: ...
    async def forward_overrides(self, conversation_id: str, end: int) -> dict[int, str]: ...
    async def token_sums(self, conversation_id: str, end: int) -> tuple[int, int]:
        """(forwarded, sent) tokens of messages [0, end)."""
        ...

    async def context_summaries(self, conversation_id: str) -> list[SummaryRecord]: ...
    async def summary(self, summary_id: str) -> SummaryRecord | None: ...
    async def child_summaries(self, summary_id: str) -> list[SummaryRecord]: ...
    async def parent_summary_ids(self, summary_id: str) -> list[str]: ...
    async def roles(self, conversation_id: str, start: int, end: int) -> list[str]: ...
    async def raw_token_counts(self, conversation_id: str, start: int, end: int, stubbed_upto: int) -> list[int]: ...
    async def raw_token_sum(self, conversation_id: str, start: int, end: int, stubbed_upto: int) -> int:
        """Tokens of messages [start, end) as assembled: the compact form where stubbing applies."""
        ...

    async def patches(self, conversation_id: str, start: int, end: int) -> list[tuple[int, str | None, str | None]]:
        """(seq, forward patches, compact patches) of messages in [start, end) that have any."""
        ...

    async def file(self, scope: str, file_id: str) -> FileRecord | None: ...
    async def file_owner(self, scope: str | None, file_id: str) -> tuple[str, str] | None: ...
    async def files_of_message(self, message_id: int) -> list[FileRecord]: ...
    async def last_sent(self, conversation_id: str) -> str | None: ...
    async def compaction_lease(self, conversation_id: str) -> tuple[str, float] | None:
        """(owner, expires_at) of the compaction lease of ``conversation_id``, expired or not."""
        ...

    async def known_file_paths(self, paths: Sequence[str]) -> set[str]:
        """Those of ``paths`` that a ``files`` row names."""
        ...

    async def replaceable_answer(self, conversation_id: str) -> int | None:
        """The seq of the answer the proxy relayed and stored, while it may still be replaced: it is the last
        message, and no summary and no fork reaches it."""
        ...

    async def ledger(
        self, conversation_id: str, include_superseded: bool = False, *, newest_superseded: int | None = None
    ) -> list[LedgerItem]:
        """The conversation's standing instructions, by seq (then id); without ``include_superseded`` only
        those no later statement replaced (dropped ones included: callers filter on ``LedgerItem.current``);
        with it and ``newest_superseded``, of the replaced ones only that many, the newest (a request's read:
        replaced items pile up as a conversation goes on, the open ones are capped)."""
        ...

    async def message_ids(self, conversation_id: str, start: int, end: int) -> dict[int, int]:
        """seq -> row id of the conversation's messages [start, end) (the messages new ledger items name)."""
        ...


class Searches(Reads, Protocol):
    """Queries that may run long, off the request path's fast reads; also every read of ``Reads``, for reads
    whose size grows with a conversation's history (``reads_for``): SQLite runs these on a connection in a
    thread of its own, so a long range never holds the event loop."""

    async def search_messages(
        self, conversation_id: str, phrases: Sequence[Phrase], before_seq: int, limit: int, *, max_chars: int = 1 << 30
    ) -> list[Hit]:
        """Messages of ``conversation_id`` before ``before_seq`` matching any of ``phrases``, best ranked first
        (ties: newest first); ``text`` cut to ``max_chars`` characters."""
        ...

    async def scan_messages(self, conversation_id: str, before_seq: int, *, literal: str | None = None) -> list[Hit]:
        """Messages of ``conversation_id`` before ``before_seq``, newest first, for a regular-expression scan;
        with ``literal``, only those containing it (case-insensitively): a store may answer from an index."""
        ...

    async def search_summaries(self, phrases: Sequence[Phrase], bounds: Bounds, limit: int) -> list[SummaryRecord]:
        """Summaries within ``bounds`` (a summary is within when it ends by the bound) matching any phrase,
        best ranked first."""
        ...

    async def scan_summaries(self, bounds: Bounds) -> list[SummaryRecord]:
        """Summaries within ``bounds``, newest first."""
        ...

    async def visible_file_ids(self, scope: str, bounds: Bounds) -> list[str]:
        """Files of ``scope`` attached to a message within ``bounds``."""
        ...

    async def file_visible(self, file_id: str, bounds: Bounds) -> bool: ...

    # The doctor's walk over everything stored.
    async def message_seqs(self, conversation_id: str) -> list[int]: ...
    async def context_items(self, conversation_id: str) -> list[tuple[str, bool]]:
        """(summary id, whether it resolves to a summary) of the context, in order."""
        ...

    async def payload_messages(self, conversation_id: str) -> list[tuple[int, int, str, str]]:
        """(id, seq, original_json, payload_paths) of the messages that carry payload references."""
        ...

    async def summary_sources(self, summary_id: str) -> list[tuple[int | None, str | None, int | None]]:
        """(message id, child summary id, the message's seq) of each source of ``summary_id``, in order."""
        ...

    async def all_files(self) -> list[tuple[str, str, str]]:
        """(id, path, sha256) of every stored file."""
        ...

    async def idle_conversations(self, before: float | None, scope: str | None, limit: int) -> list[ConversationRecord]:
        """Conversations (not deleted) whose last activity is before ``before`` (None: any), of ``scope`` and, for a
        tenant, its end users' scopes (``proxy.scopes.end_users_of``; None: every scope), oldest first: what a purge
        deletes."""
        ...


LONG_RANGE = 2000  # rows: a read over more of a conversation's messages than this goes off the event loop


def reads_for(store: Store, rows: int) -> Reads:
    """Where to read ``rows`` messages' worth: the request path's fast reads for a short range, the
    long-running door (off the event loop) for a range as long as a conversation's history may be."""
    return store.search if rows > LONG_RANGE else store.read


class Writes(Reads, Protocol):
    """One write transaction: committed when its ``with`` block ends, rolled back if it raises."""

    async def lock_identity(self, scope: str, key: str) -> None:
        """Hold the lock that serialises the identity decision for ``key`` (a client's conversation key, or
        the chain hash of a transcript's first message) until this transaction ends."""
        ...

    async def lock_conversation(self, conversation_id: str) -> bool:
        """Hold the lock of one conversation until this transaction ends: take it before deciding anything
        from what this transaction reads of the conversation. True when the store runs writers side by side
        (what this transaction read before taking the lock may be stale: read it again)."""
        ...

    @property
    def locked_reads(self) -> Reads:
        """Reads that see everything committed, for decisions under this transaction's locks (identity) before
        it writes anything: the transaction itself, or where it holds the store's only write lock (SQLite), the
        request path's reader, which sees the same and costs no hop to the writer's thread."""
        ...

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
    ) -> None: ...
    async def move_external_key(self, scope: str, key: str, to_conversation: str) -> None: ...
    async def copy_prefix(self, source_id: str, target_id: str, count: int) -> None:
        """Copy messages [0, count) of ``source_id`` (and their file links) into ``target_id``, and the ledger
        items they stated, under new ids: a supersession by a statement at or after ``count`` is undone there."""
        ...

    async def append_messages(self, conversation_id: str, first_seq: int, messages: Sequence[NewMessage]) -> None: ...
    async def set_relayed_answer(self, conversation_id: str, seq: int, asked_at: float) -> None: ...
    async def relayed_answer_asked_at(self, conversation_id: str) -> float | None: ...
    async def drop_relayed_answer(self, conversation_id: str, seq: int) -> None:
        """Remove the relayed answer at ``seq`` and the ledger items it stated."""
        ...

    async def set_instructions(self, conversation_id: str, instructions_json: str | None) -> None: ...
    async def touch(self, conversation_id: str) -> None: ...
    async def insert_summary(
        self, record: SummaryRecord, message_ids: Sequence[int], child_ids: Sequence[str]
    ) -> None: ...
    async def set_context(self, conversation_id: str, summary_ids: Sequence[str], summarized_upto: int) -> None:
        """Replace the summarised part of the active context (the swap of one compaction pass)."""
        ...

    async def set_stubbed_upto(self, conversation_id: str, seq: int) -> None: ...
    async def set_last_sent(self, conversation_id: str, sent_json: str) -> None: ...
    async def set_last_model(self, conversation_id: str, model: str) -> None: ...
    async def put_file(self, record: FileRecord) -> None: ...
    async def put_response(self, record: ResponseRecord) -> None: ...
    async def add_ledger_items(self, items: Sequence[LedgerItem]) -> None: ...
    async def set_ledger_upto(self, conversation_id: str, seq: int) -> None:
        """Messages [0, ``seq``) of the conversation have been read for standing instructions (their items are
        written in this same transaction)."""
        ...

    async def supersede_ledger_items(self, ids: Sequence[str], by: str, seq: int) -> None:
        """Mark the items ``ids`` replaced by item ``by``, stated in the message at ``seq``."""
        ...

    async def supersede_ledger_batch(self, supersessions: Sequence[tuple[str, str, int]]) -> None:
        """For each (id, by, seq), mark the item ``id`` replaced by item ``by``, stated in the message at ``seq``:
        all of them in one statement (what an ingest's plan replaces, whatever the count)."""
        ...

    async def set_ledger_state(self, conversation_id: str, item_id: str, state: str) -> LedgerItem | None:
        """Set one item's state (``LEDGER_STATES``: the user pins or drops it); the item as it is now, None
        when ``conversation_id`` has no item ``item_id``."""
        ...

    async def put_blobs(self, blobs: Sequence[tuple[str, bytes]]) -> None:
        """Store payload contents by path, in this transaction (stores that keep payloads in the database)."""
        ...

    async def take_compaction_lease(self, conversation_id: str, owner: str, ttl: float) -> bool:
        """Take the lease for ``ttl`` seconds if it is free, expired or already ``owner``'s; whether ``owner``
        holds it now."""
        ...

    async def renew_compaction_lease(self, conversation_id: str, owner: str, ttl: float) -> bool: ...
    async def release_compaction_lease(self, conversation_id: str, owner: str) -> None: ...
    async def remove_conversation(self, conversation_id: str, keep: int) -> Removed:
        """Delete the conversation's rows except its messages ``[0, keep)`` (and the ledger items they stated,
        a supersession by a later statement undone) and the summaries that rows of other
        conversations still reference (with all they link to, and the messages those cover). With nothing
        kept the row goes too; otherwise it stays, marked deleted, stripped of its key, instructions, context
        and bookkeeping. A ``files`` row goes once no message refers to it (``Removed.paths``: their contents,
        for ``Blobs.forget``); one that stays is attributed to a conversation that still refers to it.
        The caller decides ``keep`` (the fork rule, ``proxy.engine.deletion``) and holds the conversation's lock."""
        ...

    async def delete_blobs(self, paths: Sequence[str]) -> int:
        """Delete the payload contents at ``paths`` that no ``files`` row names (stores that keep payloads in the
        database); how many went."""
        ...


class Store(Protocol):
    kind: str  # "sqlite" or "postgresql": named in the doctor's report and the startup line

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    @property
    def read(self) -> Reads: ...
    @property
    def search(self) -> Searches: ...
    def write(self) -> AbstractAsyncContextManager[Writes]: ...
    async def integrity(self) -> list[str]:
        """Problems the database itself reports (its own integrity check, indexes, pending migrations)."""
        ...

    async def scrub(self, *, full: bool = False) -> list[str]:
        """After deletions: make what they removed unreadable in the store's own files as far as the database
        allows (docs/operations.md#deleting-data); ``full`` rewrites the tables (slow, and blocking on PostgreSQL). What
        could not be done, one line each (nothing: done). Its cost grows with the store, so it works in bounded
        steps and never holds the store's writer for long (``proxy.store.sqlite.delete``)."""
        ...


class BlobBatch(Protocol):
    """One request's new payloads, from preparation (outside the transaction) to publication (inside it)."""

    def add(self, data: bytes, file_id: str | None = None) -> tuple[str, str]:
        """(sha256, path) of ``data``, which this batch will publish if asked."""
        ...

    def location(self, file_id: str) -> tuple[str, str] | None: ...
    @property
    def unwritten(self) -> bool: ...
    def write(self) -> None:
        """Make what was added durable where it waits (blocking: call it off the event loop)."""
        ...

    async def publish(self, tx: Writes, paths: Sequence[str]) -> None:
        """Make ``paths`` visible to readers as part of ``tx``: call it last, just before the commit."""
        ...

    @property
    def holds_files(self) -> bool: ...
    def discard(self) -> None:
        """Delete what was not published (blocking)."""
        ...


class Blobs(Protocol):
    def batch(self, scope: str) -> BlobBatch: ...
    async def load(self, path: str) -> bytes:
        """The content stored at ``path`` (a ``files`` row's path). Raises ``UnsafePathError`` or ``OSError``
        when it cannot be read."""
        ...

    async def check(self, files: Sequence[tuple[str, str, str]], *, verify_hashes: bool) -> list[str]:
        """Problems with the contents of ``files`` ((id, path, sha256) rows): missing, unreadable, changed."""
        ...

    async def forget(self, tx: Writes, paths: Sequence[str]) -> int:
        """Delete the contents at ``paths`` that no ``files`` row names any more, in a write transaction that
        begins after the one that removed the rows committed (a content deleted with its rows' transaction
        still open would be missing if that transaction rolled back). How many went."""
        ...
