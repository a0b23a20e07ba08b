"""What the Responses door issued and a client may hand back: stored responses (``previous_response_id``
chains, ``GET /v1/responses/{id}``) and compaction checkpoints (Codex's compaction item, or the marker in a
summary the proxy wrote for Codex's local compaction).

* **Responses.** A request with ``store`` not false keeps the response object it got and where its input is:
  the first messages of its stored conversation (a reference: nothing is stored twice, pasted files and images
  stay stored once, and a chain is one read however long), or, when the proxy stores no conversation, the
  request's own items after its ``previous_response_id``'s. A response is found only by the scope that
  received it; an id the proxy never issued, another tenant's or end user's, one made with ``store: false``,
  or one whose conversation was deleted is a 404, as OpenAI answers an unknown id. Its rows are deleted with
  their conversation, but for those a kept fork still shares (``position`` below what the fork keeps).
* **Checkpoints.** A checkpoint is a 256-bit random handle recorded with its scope, its conversation and the
  number of that conversation's messages it stands for. It is opaque and unforgeable (a lookup, not a
  decoding: nothing in it can be edited into another conversation), bound to its tenant, and gone with its
  conversation when that is deleted. A handle the scope never received is refused.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import InvalidRequestError, NotFoundError
from proxy.store.base import Store
from proxy.store.records import ResponseRecord
from proxy.types import Messages

MAX_CHAIN = 10_000  # responses one previous_response_id chain may walk back
CHECKPOINT_PREFIX = "lcm_ckpt_"
CHECKPOINT = re.compile(CHECKPOINT_PREFIX + r"[A-Za-z0-9_-]{43}")


def response_id() -> str:
    return "resp_lcm_" + secrets.token_hex(24)


def not_found(response: str) -> NotFoundError:
    return NotFoundError(f"Previous response with id '{response[:100]}' not found.", param="previous_response_id")


History = Callable[[str, str, int], Awaitable[Messages | None]]  # ``ContextEngine.history``


class Issued:
    def __init__(self, store: Store, history: History) -> None:
        self.store = store
        self.history = history

    async def chain(self, scope: str, previous: str) -> Messages:
        """The items of ``previous``'s chain, oldest first: every earlier input, each followed by its output.
        A response stored with its conversation holds them by reference (that conversation's first messages,
        after its instructions): one read. Without one (``lcm_settings.enabled: false``) each response holds
        its own input, and the chain is walked back to the first response, or to one with a conversation."""
        deltas: list[ResponseRecord] = []
        cursor: str | None = previous
        base: Messages = []
        while cursor is not None:
            record = await self.store.read.response(scope, cursor)
            if record is None or record.kind != "response" or len(deltas) >= MAX_CHAIN:
                raise not_found(previous)
            if record.conversation_id is not None:
                stored = await self.history(scope, record.conversation_id, record.position)
                if stored is None:  # the conversation was deleted
                    raise not_found(previous)
                base = [*orjson.loads(record.input_json or "[]"), *stored, *_output(record)]
                break
            deltas.append(record)
            cursor = record.previous_id
        items = base
        for record in reversed(deltas):
            items.extend(orjson.loads(record.input_json or "[]"))
            items.extend(_output(record))
        return items

    async def save(self, scope: str, response: dict[str, Any], saved: Saved) -> None:
        record = ResponseRecord(
            response["id"], scope, "response", saved.conversation, saved.position, saved.previous,
            orjson.dumps(saved.instructions if saved.conversation is not None else saved.own).decode(),
            orjson.dumps(response).decode(), time.time(),
        )  # fmt: skip
        async with self.store.write() as tx:
            await tx.put_response(record)

    async def stored(self, scope: str, response: str) -> dict[str, Any] | None:
        record = await self.store.read.response(scope, response)
        if record is None or record.kind != "response" or not record.body_json:
            return None
        body: dict[str, Any] = orjson.loads(record.body_json)
        return body

    async def checkpoint(self, scope: str, conversation: str, position: int) -> str:
        """A new handle standing for the first ``position`` messages of ``conversation``."""
        handle = CHECKPOINT_PREFIX + secrets.token_urlsafe(32)
        record = ResponseRecord(handle, scope, "checkpoint", conversation, position, None, None, None, time.time())
        async with self.store.write() as tx:
            await tx.put_response(record)
        return handle

    async def point(self, scope: str, handle: str) -> tuple[str, int] | None:
        """(conversation, position) of a handle issued to ``scope``; None for any other string."""
        if not CHECKPOINT.fullmatch(handle):
            return None
        record = await self.store.read.response(scope, handle)
        if record is None or record.kind != "checkpoint" or record.conversation_id is None:
            return None
        return record.conversation_id, record.position


@dataclass(frozen=True)
class Saved:
    """Where a stored response's input is: the first ``position`` messages of ``conversation`` after the
    ``instructions`` items, or (no conversation) ``own``, the request's own items after ``previous``'s."""

    conversation: str | None
    position: int
    instructions: Messages
    own: Messages
    previous: str | None


def _output(record: ResponseRecord) -> Messages:
    body = orjson.loads(record.body_json or "{}")
    return [i for i in body.get("output") or [] if isinstance(i, dict)]


def foreign(param: str) -> InvalidRequestError:
    return InvalidRequestError(
        "The encrypted content of this compaction item could not be verified: lcm-proxy did not issue it to this"
        " key, or the conversation it stood for was deleted. Start a new session, or send the items it replaced.",
        param=param,
        code="invalid_encrypted_content",
    )
