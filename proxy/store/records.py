"""Plain records exchanged between the engine and a store. No SQL here, so another store can reuse them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ConversationRecord:
    id: str
    tenant: str
    external_key: str | None
    parent_id: str | None
    fork_seq: int | None
    instructions_json: str | None
    message_count: int
    token_count: int
    created_at: float
    updated_at: float
    summarized_upto: int = 0  # messages [0, summarized_upto) are covered by the context's summaries
    stubbed_upto: int = 0  # large tool results before this seq are forwarded as their stub
    last_model: str | None = None
    # Set when the conversation was deleted while live forks still share its prefix: it is kept, invisible to
    # every lookup made for a client, holding only what those forks need (``proxy.engine.deletion``).
    deleted_at: float | None = None
    dialect: str = "chat"  # the wire format its messages are stored in (``proxy.dialects``)
    # It continues its parent after the client compacted the transcript itself (Claude Code, Codex): nothing was
    # copied, and all of the parent's messages [0, fork_seq) stay in its recall scope.
    continued: bool = False
    # A sub-agent's conversation: the conversation of the agent that started it (Claude Code's session), if stored.
    linked_to: str | None = None
    # Messages [0, ledger_upto) have been read for standing instructions (``proxy.engine.standing.reader``): the
    # ledger holds what they state. The rest is read after the response, or before the ledger is next needed.
    ledger_upto: int = 0


@dataclass(frozen=True)
class MessageRecord:
    id: int
    conversation_id: str
    seq: int
    role: str
    original_json: str
    payload_paths: str | None
    forward_json: str | None
    compact_json: str | None
    text: str
    token_count: int
    sent_token_count: int
    chain_hash: str
    created_at: float
    compact_token_count: int | None = None


@dataclass(frozen=True)
class NewMessage:
    role: str
    original_json: str
    payload_paths: str | None
    forward_json: str | None
    compact_json: str | None
    text: str
    token_count: int
    sent_token_count: int
    chain_hash: str
    file_ids: tuple[str, ...] = field(default_factory=tuple)
    compact_token_count: int | None = None


@dataclass(frozen=True)
class FileRecord:
    id: str
    tenant: str
    conversation_id: str | None
    name: str
    mime: str
    kind: str
    bytes: int
    sha256: str
    path: str
    exploration: str | None
    created_at: float


@dataclass(frozen=True)
class SummaryRecord:
    id: str
    conversation_id: str
    kind: str  # leaf | condensed
    depth: int
    start_seq: int
    end_seq: int
    content: str
    token_count: int
    source_token_count: int
    earliest_at: float
    latest_at: float
    descendant_count: int
    file_ids: str | None
    summarizer_model: str | None
    escalation: int
    created_at: float


LEDGER_KINDS = ("rule", "constraint", "preference", "goal", "decision", "name")  # most important first
LEDGER_STATES = ("active", "pinned", "dropped")


@dataclass(frozen=True)
class LedgerItem:
    """One standing instruction of a conversation (``proxy.engine.standing.ledger``): what the user or the agent set
    to hold from then on, with the message it came from. An item is current until a later statement of the
    same ``kind`` and ``slot`` supersedes it (``superseded_seq``: the seq of that statement's message, so that
    a fork made before it still has the item current)."""

    id: str  # "led_" + 16 hex digits
    conversation_id: str
    kind: str  # one of LEDGER_KINDS
    slot: str  # what it is about, normalised ("budget", "budget travel", "push main"): the supersession key
    value: str  # the part an update changes ("$800", "metric units"): absent from the context once stale
    text: str  # the sentence as stated (credentials masked), what the model is shown
    seq: int  # seq of the message it came from
    message_id: int  # that message's row id (recall: lcm_describe / lcm_expand)
    role: str  # who set it: "user", "assistant", "system", ...
    created_at: float
    superseded_seq: int | None = None  # seq of the message whose statement replaced it
    superseded_by: str | None = None  # id of the item that replaced it
    state: str = "active"  # one of LEDGER_STATES: pinned items are kept first, dropped ones never forwarded

    @property
    def current(self) -> bool:
        return self.superseded_seq is None and self.state != "dropped"


@dataclass(frozen=True)
class Removed:
    """What one ``Writes.remove_conversation`` took away (and what it left for live forks)."""

    conversations: int = 0  # rows removed entirely (0: the conversation stays, marked deleted, for its forks)
    messages: int = 0
    summaries: int = 0
    files: int = 0  # ``files`` rows no message refers to any more
    paths: tuple[str, ...] = ()  # their payload contents, for ``Blobs.forget``
    kept_messages: int = 0  # messages [0, kept_messages) stay for live forks

    def __add__(self, other: Removed) -> Removed:
        return Removed(
            self.conversations + other.conversations,
            self.messages + other.messages,
            self.summaries + other.summaries,
            self.files + other.files,
            tuple(dict.fromkeys(self.paths + other.paths)),
            self.kept_messages,  # the first conversation's: the one a deletion was asked for
        )


@dataclass(frozen=True)
class ResponseRecord:
    """A Responses answer the proxy issued (``kind`` ``"response"``: ``previous_response_id`` chains and ``GET
    /v1/responses/{id}``), or a compaction checkpoint it handed a client (``kind`` ``"checkpoint"``: Codex's
    compaction item, or its marker in a summary) that stands for the first ``position`` messages of
    ``conversation_id``."""

    id: str
    scope: str
    kind: str
    conversation_id: str | None
    position: int
    previous_id: str | None  # the response this one continued (its ``previous_response_id``)
    input_json: str | None  # the request's own input items (those of ``previous_id``'s chain are not repeated)
    body_json: str | None  # the response object as the client received it
    created_at: float
