"""The recall tools the proxy serves to the model, behind one entry point: ``RecallTools.run`` executes one
tool call and always answers with text for the model.

Bad arguments produce an error *message*, not an exception, so a confused model can correct itself; a search
past the store's time limit says so, and the model may retry narrower.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy import tokens
from proxy.engine.errors import RecallError
from proxy.engine.recall import describe, expand, grep
from proxy.engine.recall.lookup import Lookup
from proxy.engine.recall.scope import Scope, resolve_scope
from proxy.engine.summarize import Summarizer
from proxy.store.errors import StoreBusy


def clip_to_tokens(text: str, cap: int) -> str:
    if tokens.count_text(text) <= cap:
        return text
    clipped = text[: cap * 3]
    while tokens.count_text(clipped) > cap and len(clipped) > 100:
        clipped = clipped[: int(len(clipped) * 0.8)]
    return clipped + "\n[… result cut to fit the context; ask for a narrower range]"


class RecallTools(Lookup):
    async def scope(self, owner: str, conversation_id: str, upto: int | None = None) -> Scope:
        """What ``conversation_id`` (one of ``owner``'s: a tenant, or an end user within it) may see as of its
        first ``upto`` messages (all of them by default)."""
        return await resolve_scope(self.store, owner, conversation_id, upto)

    async def run(self, scope: Scope, name: str, arguments: str, summarizer: Summarizer | None = None) -> str:
        """Execute one recall tool call; always returns text for the model."""
        try:
            args = orjson.loads(arguments or "{}")
            if not isinstance(args, dict):
                raise RecallError("arguments must be a JSON object")
            if name == "lcm_grep":
                return await self.grep(scope, args)
            if name == "lcm_describe":
                return await self.describe(scope, args)
            if name == "lcm_expand":
                return await self.expand(scope, args)
            if name == "lcm_expand_query":
                return await self.expand_query(scope, args, summarizer)
            raise RecallError(f"unknown tool {name}")
        except orjson.JSONDecodeError:
            return f"Error: the arguments of {name} are not valid JSON."
        except RecallError as error:
            return f"Error: {error}"
        except StoreBusy:  # a search past the store's time limit, or a database briefly away: the model may retry
            return f"Error: {name} could not finish in time; try a narrower pattern, scope or range."

    async def grep(self, scope: Scope, args: dict[str, Any]) -> str:
        return await grep.grep(self, scope, args)

    async def describe(self, scope: Scope, args: dict[str, Any]) -> str:
        return await describe.describe(self, scope, args)

    async def expand(self, scope: Scope, args: dict[str, Any]) -> str:
        return await expand.expand(self, scope, args)

    async def expand_query(self, scope: Scope, args: dict[str, Any], summarizer: Summarizer | None) -> str:
        return await expand.expand_query(self, scope, args, summarizer)
