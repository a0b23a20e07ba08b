"""Export: a conversation's transcript exactly as the client last sent it (the Lossless invariant)."""

from __future__ import annotations

import orjson

from proxy.engine.errors import NotFound
from proxy.engine.intercept import restore
from proxy.store.base import LONG_RANGE, Blobs, Store
from proxy.types import Messages


async def export_conversation(store: Store, files: Blobs, tenant: str | None, conversation_id: str) -> Messages:
    """The transcript exactly as the client last sent it: instructions + restored messages."""
    conversation = await store.read.conversation(tenant, conversation_id)
    if conversation is None:
        raise NotFound(f"no conversation {conversation_id}")
    out: Messages = list(orjson.loads(conversation.instructions_json)) if conversation.instructions_json else []
    return out + await _restored(store, files, conversation_id, conversation.message_count)


async def history(store: Store, files: Blobs, scope: str, conversation_id: str, upto: int) -> Messages | None:
    """The conversation's first ``upto`` messages (its instructions not among them) exactly as the client sent
    them; None when ``scope`` has no such conversation or it holds fewer messages. A deleted conversation kept
    for its forks still has the prefix they share (what a fork's chain or checkpoint may point into)."""
    conversation = await store.read.conversation(scope, conversation_id, deleted=True)
    if conversation is None or conversation.message_count < upto:
        return None
    return await _restored(store, files, conversation_id, upto)


async def _restored(store: Store, files: Blobs, conversation_id: str, end: int) -> Messages:
    out: Messages = []
    for start in range(0, end, LONG_RANGE):  # a page at a time, off the event loop
        for record in await store.search.messages(conversation_id, start, min(end, start + LONG_RANGE)):
            original = orjson.loads(record.original_json)
            if record.payload_paths:
                contents = {f.id: await files.load(f.path) for f in await store.read.files_of_message(record.id)}
                original = restore(original, orjson.loads(record.payload_paths), contents.__getitem__)
            out.append(original)
    return out
