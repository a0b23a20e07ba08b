"""One Responses request between the door and the upstream (``Turn``): its upstream body, its call (native or
translated, with the one compacted retry), and the response as the client gets it, stored and recorded; and
the request's items with a Codex checkpoint put back into the stored messages it stands for (``expand``)."""

from __future__ import annotations

from typing import Any

from proxy.dialects.responses import RESPONSES
from proxy.engine.engine import Prepared
from proxy.errors import UpstreamError
from proxy.relay.turn import Call, compacted_retry
from proxy.types import Messages
from proxy.wire.responses import codex
from proxy.wire.responses.calls import Opened, complete, open_stream, upstream_body
from proxy.wire.responses.issued import Issued, Saved, foreign, response_id


async def expand(call: Call, issued: Issued, items: Messages) -> Messages:
    """``items`` with their newest checkpoint (Codex's compaction item, or a summary ending in the proxy's marker)
    and what Codex kept before it replaced by the stored messages it stands for. A compaction item the proxy did
    not issue to this scope is refused (it must never reach an upstream); a marker that names nothing the
    scope was given is only text, and the search goes on to older items."""
    for found in codex.checkpoints(items):
        where = f"input[{found.at}].encrypted_content"
        point = await issued.point(call.scope, found.handle)
        history = await call.state.engine.history(call.scope, *point) if point is not None else None
        if history is not None:
            return codex.rebuilt(items, found, history)
        if found.item:
            raise foreign(where)
    return items


class Turn:
    """One Responses request between the door and the upstream."""

    def __init__(self, call: Call, native: bool, headers: dict[str, str], issued: Issued, own: Messages) -> None:
        self.call = call
        self.native = native  # the deployment speaks Responses (else it gets Chat Completions)
        self.headers = headers  # the client headers a Responses upstream receives
        self.issued = issued
        self.own = own  # the request's own input items (what a stored response keeps)
        self.id = response_id()
        self.model = str(call.body["model"])

    @property
    def stores(self) -> bool:
        return self.call.body.get("store") is not False

    def shift(self, prepared: Prepared | None) -> int:
        if prepared is None or self.call.state.config.lcm_settings.client_usage != "client":
            return 0
        return max(0, prepared.tokens_sent - prepared.tokens_forwarded)

    def out(self, prepared: Prepared | None) -> dict[str, Any]:
        return upstream_body(self.call.body, prepared.messages if prepared is not None else self.call.transcript)

    async def finished(self, response: dict[str, Any], prepared: Prepared | None) -> dict[str, Any]:
        """The response as the client gets it, stored and recorded."""
        body = self.call.body
        response = {**response, "id": self.id, "model": self.model, "store": self.stores}
        response["previous_response_id"] = body.get("previous_response_id")
        shift = self.shift(prepared)
        usage = response.get("usage")
        if shift and isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
            response["usage"] = {**usage, "input_tokens": usage["input_tokens"] + shift}
        if response.get("status") == "completed":
            output = [i for i in response.get("output") or [] if isinstance(i, dict)]
            record = self.call.answer_to(prepared)
            if record is not None and len(output) == 1:  # one item: the conversation's next message
                await record(output[0])
        if self.stores:
            await self.issued.save(self.call.scope, response, self.saved(prepared))
        return response

    def saved(self, prepared: Prepared | None) -> Saved:
        """Where the stored response's input is: its conversation's messages, or its own items."""
        items = self.call.transcript
        start = RESPONSES.instruction_count(items)
        previous = self.call.body.get("previous_response_id")
        if prepared is None or prepared.conversation_id is None:
            return Saved(None, 0, [], self.own, previous)
        return Saved(prepared.conversation_id, prepared.transcript_length, items[:start], [], previous)

    async def complete(self, prepared: Prepared | None) -> tuple[dict[str, Any], Prepared | None]:
        state, target = self.call.state, self.call.target
        try:
            return await complete(state, target, self.out(prepared), self.headers, self.native, self.id), prepared
        except UpstreamError as error:
            retry = await compacted_retry(self.call, prepared, error)
            if retry is None:
                raise
            return await complete(state, target, self.out(retry), self.headers, self.native, self.id), retry

    async def open(self, prepared: Prepared | None) -> tuple[Opened, Prepared | None]:
        state, target = self.call.state, self.call.target
        try:
            return await open_stream(state, target, self.out(prepared), self.headers, self.native, self.id), prepared
        except UpstreamError as error:
            retry = await compacted_retry(self.call, prepared, error)
            if retry is None:
                raise
            return await open_stream(state, target, self.out(retry), self.headers, self.native, self.id), retry
