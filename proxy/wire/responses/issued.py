"""What the Responses door issued and a client may hand back: stored responses (``previous_response_id``
chains, ``GET /v1/responses/{id}``) and compaction checkpoints (Codex's compaction item, or the marker in a
summary the proxy wrote for Codex's local compaction).

* **Responses.** A request with ``store`` not false keeps its own input items and the response object it got.
  A chain is rebuilt by walking ``previous_id`` back: every earlier input, each followed by its output. A
  response is found only by the scope that received it; an id the proxy never issued, another tenant's, or
  one made with ``store: false`` is a 404, as OpenAI answers it.
* **Checkpoints.** A checkpoint is a 256-bit random handle recorded with its scope, its conversation and the
  number of that conversation's messages it stands for. It is opaque and unforgeable (a lookup, not a
  decoding: nothing in it can be edited into another conversation), bound to its tenant, and gone with its
  conversation when that is deleted. A handle the scope never received is refused.
"""

from __future__ import annotations

import re
import secrets
import time
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


class Issued:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def chain(self, scope: str, previous: str) -> Messages:
        """The items of ``previous``'s chain, oldest first: each request's input, then its response's output."""
        records: list[ResponseRecord] = []
        cursor: str | None = previous
        while cursor is not None:
            record = await self.store.read.response(scope, cursor)
            if record is None or record.kind != "response" or len(records) >= MAX_CHAIN:
                raise not_found(previous)
            records.append(record)
            cursor = record.previous_id
        items: Messages = []
        for record in reversed(records):
            items.extend(orjson.loads(record.input_json or "[]"))
            body = orjson.loads(record.body_json or "{}")
            items.extend(i for i in body.get("output") or [] if isinstance(i, dict))
        return items

    async def save(
        self, scope: str, response: dict[str, Any], own_input: Messages, previous: str | None, conversation: str | None
    ) -> None:
        record = ResponseRecord(
            response["id"], scope, "response", conversation, 0, previous,
            orjson.dumps(own_input).decode(), orjson.dumps(response).decode(), time.time(),
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


def foreign(param: str) -> InvalidRequestError:
    return InvalidRequestError(
        "The encrypted content of this compaction item could not be verified: lcm-proxy did not issue it to this"
        " key, or the conversation it stood for was deleted. Start a new session, or send the items it replaced.",
        param=param,
        code="invalid_encrypted_content",
    )
