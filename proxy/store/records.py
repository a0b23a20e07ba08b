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
