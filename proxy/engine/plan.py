"""A sweep's working copy of a conversation's context, and stored messages as compaction reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from proxy.engine.intercept import SEGMENTS_KEY, apply_patches
from proxy.engine.standing.proposals import Plan as Proposal
from proxy.store.records import ConversationRecord, MessageRecord, SummaryRecord
from proxy.types import Message


def view_message(row: MessageRecord, stubbed: bool) -> tuple[Message, list[str]]:
    """A stored message as compaction sees it: stubs applied, payload references as ``[file_…]`` markers."""
    message = orjson.loads(row.original_json)
    file_ids: list[str] = []
    for path in orjson.loads(row.payload_paths) if row.payload_paths else []:
        target = message
        for key in path[:-1]:
            target = target[key]
        pieces = []
        for segment in target[path[-1]][SEGMENTS_KEY]:
            if isinstance(segment, str):
                pieces.append(segment)
            else:
                pieces.append(f"[{segment['ref']}]")
                file_ids.append(segment["ref"])
        target[path[-1]] = "".join(pieces)
    patches = orjson.loads(row.forward_json) if row.forward_json else []
    if stubbed and row.compact_json:
        patches += orjson.loads(row.compact_json)
    return apply_patches(message, [(p, v) for p, v in patches]), file_ids


@dataclass
class Plan:
    """A sweep's working copy of one conversation's context. Passes change the plan; ``commit`` swaps the
    whole result in with one transaction, so the assembled prefix changes once per sweep, not once per
    pass (provider prompt caches and prefix stability depend on that)."""

    conversation: ConversationRecord
    original_ids: list[str]
    summaries: list[SummaryRecord]
    summarized_upto: int
    stubbed_upto: int
    pending: list[tuple[SummaryRecord, list[int], list[str]]] = field(default_factory=list)
    proposed: list[Proposal] = field(default_factory=list)  # standing instructions the summariser read, verified

    @property
    def changed(self) -> bool:
        return bool(self.pending) or self.stubbed_upto != self.conversation.stubbed_upto
