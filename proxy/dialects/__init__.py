"""Dialects: what the engine may ask of a stored message of each wire format (``proxy.dialects.base``)."""

from proxy.dialects.base import Dialect, Site, ToolCall, count_messages, cut_allowed, split_instructions
from proxy.dialects.chat import CHAT
from proxy.dialects.messages import MESSAGES
from proxy.dialects.responses import RESPONSES

DIALECTS: dict[str, Dialect] = {d.name: d for d in (CHAT, MESSAGES, RESPONSES)}


def by_name(name: str | None) -> Dialect:
    """The dialect a conversation was stored in (chat for every conversation stored before dialects)."""
    return DIALECTS[name or CHAT.name]


__all__ = [
    "CHAT",
    "DIALECTS",
    "MESSAGES",
    "RESPONSES",
    "Dialect",
    "Site",
    "ToolCall",
    "by_name",
    "count_messages",
    "cut_allowed",
    "split_instructions",
]
