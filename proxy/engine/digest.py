"""What the proxy answers when a client asks the model to summarise its own conversation (Claude Code's
``/compact`` and auto-compaction): a digest of the stored conversation, from the summary DAG, with no model call.

The client then replaces its transcript with this text and carries on; the proxy recognises the transcript
that follows as the same conversation continued (``ConversationRecord.continued``), so nothing is lost: every
original message stays searchable by auto-recall and the recall tools, and the digest says so.

The digest holds, within ``max_tokens``: the conversation's current summaries (the DAG's top nodes, oldest
first), then the newest messages after them, each clipped, as many as fit (newest kept first, shown in
order). The messages' stored text is what search reads: tool results as their text, pasted files as their
stubs.
"""

from __future__ import annotations

from proxy import tokens
from proxy.store.base import Store

HEADER = (
    "Summary of the conversation so far, written by lcm-proxy from its stored history. The proxy keeps every"
    " original message: when a detail is needed that is not below, ask for it and it is recalled."
)
PER_MESSAGE = 600  # tokens of one message's text at most
MIN_MESSAGE = 24  # a message is not shown in fewer tokens than this


def _clip(text: str, cap: int) -> str:
    text = " ".join(text.split())
    if tokens.count_text(text) <= cap:
        return text
    cut = text[: cap * 3]
    while cut and tokens.count_text(cut) > cap:
        cut = cut[: int(len(cut) * 0.8)]
    return cut.rstrip() + " …"


async def digest(store: Store, scope: str, conversation_id: str, max_tokens: int) -> str:
    """The digest of ``conversation_id`` (of ``scope``) in at most ``max_tokens`` (``tokens.count_text``)."""
    conversation = await store.read.conversation(scope, conversation_id)
    if conversation is None:
        return HEADER
    parts = [HEADER]
    room = max_tokens - tokens.count_text(HEADER) - 16
    summaries = await store.read.context_summaries(conversation_id)
    if summaries:
        parts.append("<earlier_summaries>")
        for summary in summaries:
            text = _clip(summary.content, max(MIN_MESSAGE, room // (2 * len(summaries))))
            room -= tokens.count_text(text) + 2
            parts.append(text)
        parts.append("</earlier_summaries>")
    recent = await store.read.messages(conversation_id, conversation.summarized_upto)
    shown: list[str] = []
    for record in reversed(recent):
        if room < MIN_MESSAGE:
            break
        text = _clip(record.text, min(PER_MESSAGE, room - 8))
        if not text:
            continue
        line = f"[{record.role}] {text}"
        room -= tokens.count_text(line) + 1
        shown.append(line)
    if shown:
        parts.append("<recent_messages>")
        parts.extend(reversed(shown))
        parts.append("</recent_messages>")
    return "\n".join(parts)
