"""Text renderings: messages as a flat transcript for the summarizer, summaries as messages for the model.

Both must be deterministic functions of stored data (timestamps are ingest times, never "now"): the
assembled context is part of the provider's prompt-cache key, and the summarizer input is part of what a
test compares.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Sequence

from proxy.dialects import CHAT, Dialect
from proxy.engine.explore import redact_secrets
from proxy.engine.neutralise import defang_markers, neutralise_cached
from proxy.store.records import SummaryRecord
from proxy.types import Message

REASONING_BLOCK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>\s*", re.S | re.I)
UNCLOSED_REASONING = re.compile(r"^\s*<(think|thinking|reasoning)>.*\Z", re.S | re.I)
MAX_ARGUMENT_CHARS = 300


def strip_reasoning(text: str) -> str:
    """Remove <think>-style blocks (and an unterminated one at the start: a reasoning-only answer)."""
    text = REASONING_BLOCK.sub("", text)
    return UNCLOSED_REASONING.sub("", text)


def timestamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def render_message(
    message: Message, created_at: float, dialect: Dialect, file_refs: dict[str, str] | None = None
) -> str:
    """One message as summarizer input (and recall-tool output): ``[time | role]`` header, text, tool calls; no
    reasoning blocks. The message's own words cannot pass for a header or one of the proxy's tags
    (``defang_markers``)."""
    lines = [f"[{timestamp(created_at)} | {dialect.header(message)}]"]
    text = strip_reasoning(dialect.text(message)).strip()
    for placeholder, ref in (file_refs or {}).items():
        text = text.replace(placeholder, ref)
    if text:
        lines.append(defang_markers(text))
    for call in dialect.tool_calls(message):
        arguments = call.arguments
        if len(arguments) > MAX_ARGUMENT_CHARS:
            arguments = arguments[:MAX_ARGUMENT_CHARS] + "…"
        lines.append(defang_markers(f"-> calls {call.name}({arguments})"))
    return redact_secrets("\n".join(lines))


def _attribute(value: object) -> str:
    return html.escape(str(value), quote=True)


def summary_block(summary: SummaryRecord) -> str:
    """One summary in the wrapper the model sees (docs/architecture.md#compaction): its id (to recall the sources), the
    time it covers, and the untrusted mark; ids of levels and counts stay in the admin views, where they cost
    the model nothing."""
    attributes = (
        f'id="{_attribute(summary.id)}" from="{timestamp(summary.earliest_at)}" to="{timestamp(summary.latest_at)}" '
        'trust="untrusted"'
    )
    # The content neutralised (``proxy.engine.neutralise``): it can neither close the wrapper early nor open a
    # forged one (<summary trust="trusted">, in any disguise), nor carry an instruction override.
    return f"<summary {attributes}>\n{neutralise_cached(summary.content)}\n</summary>"


def render_summary(summary: SummaryRecord, dialect: Dialect = CHAT) -> Message:
    return dialect.summary_message(summary_block(summary))


def summaries_text(summaries: Sequence[SummaryRecord]) -> str:
    return "\n".join(summary_block(s) for s in summaries)


def render_summaries(summaries: Sequence[SummaryRecord], dialect: Dialect) -> Message:
    """All summaries as one user message: chat templates that require strict user/assistant alternation
    (Gemma, older Mistral) accept one message where a run of them would be refused."""
    return dialect.summary_message(summaries_text(summaries))


def summary_tokens(summaries: Sequence[SummaryRecord], dialect: Dialect) -> int:
    """What the summaries cost in the assembled context (one message, see ``render_summaries``)."""
    return dialect.count(render_summaries(summaries, dialect)) if summaries else 0
