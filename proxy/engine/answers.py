"""The answer the proxy relayed, stored as the conversation's newest message.

Clients send the model's answer back with their next request, so the store used to learn it only then: after
a streamed reply ``export`` lacked the final answer, and the answer of a user's last turn was never stored.
Now the proxy appends the answer it relayed once the response is complete, and records it as *relayed*.

When the client later sends that answer back, the two usually agree: identity hashes a canonical form, so key
order and empty fields do not matter. When they differ (a client that trims whitespace, drops reasoning
fields, or lets the user edit the answer), the client's version wins and replaces the relayed one in place,
without a fork (``proxy.engine.ingest.replaces_relayed_answer``). A regenerate, where the same transcript
comes again without the answer, replaces the relayed answer with the new one in the same way. Replacing is
possible only while the answer is the conversation's last message and no summary or fork reaches it.

When several answers come for the same transcript (a retry while the first attempt still runs, a double
submit), the one of the request that arrived last stays. Only what is sure is stored: one choice, complete
(the stream reached its finish), at the tip of the conversation the request was served from. Anything else
(a re-send of an earlier point, a conversation that moved on meanwhile) stores nothing, and the client's own
re-send stores the answer as before.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.dialects import CHAT, Dialect
from proxy.engine.canonical import chain_next, chain_root
from proxy.engine.ingest import Ingestor
from proxy.engine.intercept import Interceptor
from proxy.types import Message

log = logging.getLogger("lcm_proxy.engine")


async def record_answer(
    ingestor: Ingestor,
    scope: str,
    conversation_id: str,
    length: int,
    tip_chain: str | None,
    answer: Message,
    asked_at: float,
    dialect: Dialect = CHAT,
) -> bool:
    """Append ``answer`` after the first ``length`` messages of the conversation (whose last chain hash is
    ``tip_chain``) if they are still all of it, or replace a relayed answer at that place given to a request
    that arrived earlier than this one (``asked_at``). True if stored."""
    previous = tip_chain if length > 0 else chain_root(scope, dialect.name)
    if previous is None:
        return False
    chain = chain_next(previous, answer, dialect.name)  # ``answer`` is a message of ``dialect``, as the client sends it
    store = ingestor.store
    current = await store.read.conversation(scope, conversation_id)
    if current is None or current.message_count not in (length, length + 1):
        return False  # the conversation moved on (the client's next request came first): it has the answer
    if current.message_count == length + 1 and await store.read.chain_in_conversation(conversation_id, length, chain):
        # This very answer is already stored (a re-send, a tool loop's next round): nothing to read or write.
        # The transaction checks again; this only spares its preparation.
        return False
    limits = ingestor.thresholds
    explorations: dict[str, str] = {}
    explorer = ingestor.explorer(scope, None, explorations)
    interceptor = Interceptor(scope, limits.large_file_tokens, limits.tool_result_tokens, explorer, dialect)
    batch = ingestor.files.batch(scope)
    try:
        interception, record = await ingestor.prepare_message(interceptor, answer, chain, {}, batch)
        # Its standing instructions are read after the response (``proxy.engine.standing.reader``).
        async with store.write() as tx:
            await tx.lock_conversation(conversation_id)
            q = tx.locked_reads  # (decided under the lock, before anything is written)
            conversation = await q.conversation(scope, conversation_id)
            if conversation is None:
                return False
            if length > 0 and not await q.chain_in_conversation(conversation_id, length - 1, previous):
                return False
            if conversation.message_count == length + 1:
                if await q.replaceable_answer(conversation_id) != length:
                    return False
                if await q.chain_in_conversation(conversation_id, length, chain):
                    return False  # this very answer is already stored
                if (await tx.relayed_answer_asked_at(conversation_id) or 0.0) > asked_at:
                    return False  # a later request's answer (a regenerate, a retry) is there: it stays
                # A regenerate replaces its predecessor.
                await tx.drop_relayed_answer(conversation_id, length)
            elif conversation.message_count != length:
                return False
            paths: list[str] = []
            for payload in interception.payloads:
                exploration = explorations.get(payload.file_id)
                file = ingestor.file_record(scope, conversation_id, payload, exploration, batch)
                paths.append(file.path)
                await tx.put_file(file)
            await tx.append_messages(conversation_id, length, [record])
            await tx.set_relayed_answer(conversation_id, length, asked_at)
            if not ingestor.standing and conversation.ledger_upto >= length:
                await tx.set_ledger_upto(conversation_id, length + 1)  # no ledger is kept: nothing to read later
            if paths:
                await batch.publish(tx, paths)
        return True
    finally:
        if batch.holds_files:
            await asyncio.to_thread(batch.discard)
