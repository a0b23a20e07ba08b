"""Instruction-like text in material that reaches a model as data: summaries, fallbacks, exploration summaries.

Conversation text, tool output and pasted documents may carry a prompt injection; a summary model may copy it
or be talked into writing one. The summaries the proxy places in the context are marked untrusted, and on top
of that the sentences that try to take over their reader are removed. That filter
(``remove_instruction_overrides``, ``INSTRUCTION_OVERRIDE``) lives in ``proxy.engine.neutralise`` with the
rest of what every block the proxy wraps around untrusted content gets, and is re-exported here.
"""

from __future__ import annotations

from proxy.engine.neutralise import (
    INSTRUCTION_OVERRIDE,
    LIST_PREFIX,
    REMOVED_MARKER,
    SENTENCE,
    is_instruction_override,
    remove_instruction_overrides,
)

__all__ = [
    "INSTRUCTION_OVERRIDE",
    "LIST_PREFIX",
    "REMOVED_MARKER",
    "SENTENCE",
    "is_instruction_override",
    "remove_instruction_overrides",
]
