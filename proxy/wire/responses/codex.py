"""What the Responses door knows of Codex (FIELD-NOTES, checked with Codex 0.169 against fakes): its session ids,
its two ways of compacting, and where its compacted history stands in a later request.

* **Identity.** ``X-LCM-Conversation-Id``, else Codex's ``session-id`` header (the same for a whole session,
  ``exec resume`` and compactions included), else the body's ``prompt_cache_key`` (Codex sets it to the session
  id; other clients use it to name a conversation). A sub-agent (``agent_name`` other than ``/root`` in
  ``x-codex-turn-metadata``) is a conversation of its own, linked to its session's.
* **Local compaction** (a provider Codex does not take for OpenAI): an ordinary turn whose last user message is
  Codex's compaction prompt (``request_kind: compaction`` in ``x-codex-turn-metadata``). The door answers it with
  the stored conversation's digest and a checkpoint marker (``proxy.wire.responses.issued``). Codex then rebuilds
  its history as its instructions, the user messages it keeps, and the summary as a user message.
* **Remote compaction** (the provider named ``OpenAI``): the input ends with one ``{"type":
  "compaction_trigger"}``; the answer is exactly one ``compaction`` item whose ``encrypted_content`` is a
  checkpoint handle, which Codex replays in place of everything it compacted.

After either, Codex's next request holds its base prompt, the user messages it kept, its other instructions
(re-inserted before the last kept user message), then the checkpoint and the new prompt. ``checkpoints``
finds the checkpoint; the user messages before it stand for the conversation's first messages, and the door puts
those messages back (``rebuilt``), so the engine sees the conversation it stores, continued, with its
instructions in their first place, and nothing Codex compacted away is lost.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import orjson

from proxy.dialects.responses import RESPONSES, kind
from proxy.errors import InvalidRequestError
from proxy.relay.turn import CONVERSATION_HEADER
from proxy.types import Messages
from proxy.wire.responses.issued import CHECKPOINT, CHECKPOINT_PREFIX

SESSION_HEADER = "session-id"
METADATA_HEADER = "x-codex-turn-metadata"
COMPACTION_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION"
TRIGGER = "compaction_trigger"
MAIN_AGENT = "/root"


def _key(value: Any, name: str) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    if not text or len(text) > 200 or not text.isprintable():
        raise InvalidRequestError(
            f"Invalid {name}: expected 1-200 printable characters.", param=name, code="invalid_value"
        )
    return text


def conversation_key(headers: Mapping[str, str], body: dict[str, Any]) -> str | None:
    own = _key(headers.get(CONVERSATION_HEADER), CONVERSATION_HEADER)
    if own is not None:
        return own
    session = _key(headers.get(SESSION_HEADER), SESSION_HEADER)
    if session is not None:
        agent = _agent(headers)
        return f"codex:{session}" + (f":agent:{agent}" if agent else "")
    cache_key = _key(body.get("prompt_cache_key"), "prompt_cache_key")
    return f"responses:{cache_key}" if cache_key is not None else None


def _agent(headers: Mapping[str, str]) -> str | None:
    """A sub-agent's path in Codex's turn metadata (``agent_name``; the main agent is ``/root``)."""
    name = metadata(headers).get("agent_name")
    if not isinstance(name, str) or name in ("", MAIN_AGENT) or len(name) > 200 or not name.isprintable():
        return None
    return str(name)


def parent_key(headers: Mapping[str, str]) -> str | None:
    """A sub-agent's request: the key of its session's main conversation."""
    if headers.get(CONVERSATION_HEADER) is not None or _agent(headers) is None:
        return None
    session = _key(headers.get(SESSION_HEADER), SESSION_HEADER)
    return f"codex:{session}" if session is not None else None


def metadata(headers: Mapping[str, str]) -> dict[str, Any]:
    raw = headers.get(METADATA_HEADER)
    if not raw or len(raw) > 16_384:
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def is_local_compaction(headers: Mapping[str, str], items: Messages) -> bool:
    """Codex's compaction turn: its metadata says so, or its last user message is the compaction prompt."""
    if metadata(headers).get("request_kind") == "compaction":
        return True
    for item in reversed(items):
        if kind(item) == "message" and item.get("role") == "user":
            return RESPONSES.text(item).lstrip().startswith(COMPACTION_PROMPT)
    return False


def is_trigger(items: Messages) -> bool:
    return bool(items) and kind(items[-1]) == TRIGGER


class Checkpoint(NamedTuple):
    at: int  # the item standing for the compacted history
    handle: str
    item: bool  # a compaction item (its handle must be the proxy's), else a marker in a summary message


def checkpoints(items: Messages) -> Iterator[Checkpoint]:
    """The request's compaction items, and its user messages that end with a checkpoint marker (as the summary
    the proxy wrote for Codex's local compaction does), after its leading instructions, newest first."""
    start = RESPONSES.instruction_count(items)
    for at in range(len(items) - 1, start - 1, -1):
        item = items[at]
        if kind(item) == "compaction":
            yield Checkpoint(at, str(item.get("encrypted_content") or ""), True)
        elif kind(item) == "message" and item.get("role") == "user":
            text = RESPONSES.text(item)
            if CHECKPOINT_PREFIX in text and (found := MARKER.search(text)):
                yield Checkpoint(at, found.group(1), False)


def rebuilt(items: Messages, found: Checkpoint, history: Messages) -> Messages:
    """The request with its compacted part put back: its leading instructions, the instructions Codex re-inserted
    between them and the checkpoint (its second developer message, AGENTS.md: kept, in their order), the stored
    history, then what follows the checkpoint. The user messages Codex kept before it are in the history."""
    start = RESPONSES.instruction_count(items)
    again = [item for item in items[start : found.at] if RESPONSES.instruction_count([item]) == 1]
    return [*items[:start], *again, *history, *items[found.at + 1 :]]


def summary_text(digest: str, handle: str) -> str:
    """The answer to Codex's local compaction: the digest, and the marker that names what it stands for (last:
    only a message that ends with it is taken for the summary, not one that quotes it)."""
    return (
        f"{digest}\n\n[lcm-proxy checkpoint {handle}: lcm-proxy keeps every earlier message of this session and"
        " puts them back in context as they are needed.]"
    )


MARKER = re.compile(r"\[lcm-proxy checkpoint (" + CHECKPOINT.pattern + r"):[^\[\]]*\]\s*\Z")
