"""Client-side compaction the way Claude Code does it, replayed on a client's transcript: the baseline the
proxy's cache figures are measured against.

Claude Code sends the whole transcript until it reaches its auto-compact threshold: the window, less the
output reserve (up to 20,000 tokens), less a 13,000-token buffer, about 93% of ``window - output reserve`` on
a 200,000-token window. A fixed 13,000-token buffer makes no sense in an 8,000-token window, so the share is
kept: ``THRESHOLD_SHARE`` of ``window - output reserve``. At the threshold it sends one summarisation
request (the whole context, then an instruction; its prefix is the previous request's), and continues from
its summary (a user message) followed by the newest turn (the newest user message and what follows it; only
the newest tool rounds that fit under the threshold when the whole turn does not), growing again until the
next compaction. Not modelled: the files Claude Code re-reads after a compaction and its changed system block.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tests.support.cache import Segments, serialise, size

THRESHOLD_SHARE = (200_000 - 20_000 - 13_000) / (200_000 - 20_000)
SUMMARY_POINTS = 100  # a summary of about 600 tokens, ~8% of an 8,000-token window
INSTRUCTION = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools. Your task is to create a detailed summary of the"
    " conversation so far, paying close attention to the user's explicit requests and your previous actions."
    " Wrap your analysis in <analysis> tags, then write the summary in <summary> tags with these sections:"
    " 1. Primary Request and Intent; 2. Key Technical Concepts; 3. Files and Code Sections; 4. Errors and fixes;"
    " 5. Problem Solving; 6. All user messages; 7. Pending Tasks; 8. Current Work; 9. Optional Next Step."
)
CONTINUED = (
    "This session is being continued from a previous conversation that ran out of context. The summary below"
    " covers the earlier portion of the conversation.\n\n"
)


def threshold(window: int, output_reserve: int) -> int:
    return int((window - output_reserve) * THRESHOLD_SHARE)


def summary_message(n: int) -> dict[str, Any]:
    points = " ".join(f"point {n}.{i}." for i in range(SUMMARY_POINTS))
    return {"role": "user", "content": f"{CONTINUED}<summary>\n{points}\n</summary>"}


@dataclass(frozen=True)
class Sent:
    """One request the client sends: a chat turn, or a summarisation request."""

    body: dict[str, Any]
    summary: bool

    @property
    def segments(self) -> Segments:
        return serialise(self.body)


def _fits(body: dict[str, Any], limit: int) -> bool:
    return size(serialise(body)) < limit


def _newest_turn(head: list[dict[str, Any]], messages: list[dict[str, Any]], tools: Any, limit: int) -> int:
    """Where what a compaction keeps starts: the newest user message, else the first later tool round (an
    assistant message) after which the rest fits under ``limit``, else the newest tool round."""
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"][-1:]
    starts += [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > (starts or [-1])[0]]
    for start in starts:
        if _fits({"messages": [*head, *messages[start:]], "tools": tools}, limit):
            return start
    return starts[-1] if starts else len(messages)


def claude_code_requests(transcript: list[dict[str, Any]], ends: list[int], tools: Any, limit: int) -> Iterator[Sent]:
    """What a Claude Code-like client sends for the client requests that carried ``transcript[:end]`` for
    each of ``ends`` (``transcript[0]`` is the system message): each chat request, and a summarisation
    request whenever the context it is about to send reaches ``limit`` tokens."""
    system, summary, start, compactions = transcript[0], None, 1, 0
    for end in ends:
        head = [system] if summary is None else [system, summary]
        body = {"messages": [*head, *transcript[start:end]], "tools": tools}
        if not _fits(body, limit):
            instruction = {"role": "user", "content": INSTRUCTION}
            yield Sent({"messages": [*body["messages"], instruction], "tools": tools}, summary=True)
            compactions += 1
            summary = summary_message(compactions)
            head = [system, summary]
            start += _newest_turn(head, transcript[start:end], tools, limit)
            body = {"messages": [*head, *transcript[start:end]], "tools": tools}
        yield Sent(body, summary=False)
