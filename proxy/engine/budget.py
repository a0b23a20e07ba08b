"""Budget policy: how one request's window is shared out, and the sizes compaction works to.

``Budget`` is what the request leaves for messages: window minus output reserve, in o200k tokens (divided by
the model's token margin), minus tool schemas (the instructions are subtracted by the engine, which knows
where they end). ``sizes`` splits that limit:

- the **recall block** (auto-recall excerpts in the request's last message) keeps a reserve;
- the **ledger** of standing instructions (``proxy.engine.standing``) keeps what its current items take, within
  its own share of the limit (``ledger_share``), so a conversation without any gives nothing up for it;
- the rest is the **context**: summaries (at most ``summary_room``, condensed to fit) then raw messages;
- above ``soft`` a compaction is scheduled after the response; it summarises the oldest raw messages only
  until the context is back under ``target`` (half the context, or two fifths of it below ``soft`` when the
  threshold is set higher): far enough that the next compaction is many turns away, since each one changes
  the assembled prefix (prompt caches, llama.cpp's KV cache), yet not down to the fresh tail alone;
- the **fresh tail** protected from compaction is at most ``fresh_tail_count`` messages *and* at most
  ``tail_tokens``: a long tail shrinks before anything fails. Only the newest user message and what follows
  it must be forwarded raw.

Every knob the configuration leaves unset scales with the window, bounded by defaults sized for large
models, so a 2k local model and a 200k hosted one both get sizes that fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from proxy.config.lcm import LcmSettings
from proxy.engine.errors import ContextTooLong

PROMPT_OVERHEAD = 700  # tokens of a summarizer call beyond its source: system prompt, framing, fact list
DEFAULT_WINDOW_LIMIT = 120_000  # the message limit assumed when no request is at hand (operator `compact`)


# Reserves the client set, not the proxy (max_output_tokens: the Responses API's name).
REQUESTED_RESERVES = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass(frozen=True)
class Budget:
    """One request's window, output reserve and schemas, and the model's ``margin``: how much more than o200k
    its own tokenizer may count (``proxy.tokens.token_margin``).

    The margin divides the window instead of multiplying the counts. Every count the engine works with is an
    o200k count: each message's is stored once, at ingest, and serves whichever model the conversation is
    continued with; thresholds, the fresh tail, summary sizes, recall caps and the tool loop's room all compare
    against those counts. Turning the window into o200k units once, here, keeps all of them in one unit and
    the stored counts valid for every model. The output reserve is the provider's own tokens (the provider
    sets it aside from its window), so it comes off before the division; tool schemas and instructions are
    o200k counts, so they come off after it.
    """

    window: int
    output_reserve: int
    tools: int
    # Where the window and the reserve came from, so that a refusal can name the setting to change.
    window_source: str = "model_info.max_input_tokens"
    reserve_source: str = "max_tokens"
    margin: float = 1.0
    margin_source: str = "model_info.token_margin"

    @property
    def counted_room(self) -> int:
        """The window less the output reserve, in o200k tokens: what the input may count."""
        return math.floor((self.window - self.output_reserve) / self.margin)

    @property
    def reserve_requested(self) -> bool:
        return self.reserve_source in REQUESTED_RESERVES

    def for_messages(self, instructions: int) -> int:
        return self.counted_room - self.tools - instructions

    def reserve_leaves_no_room(self, instructions: int) -> bool:
        """Whether the client's own output reserve is what leaves no room for any message (a ``max_tokens``
        of 2**31): without it the instructions and schemas would fit, so that is the parameter to name."""
        if not self.reserve_requested or self.for_messages(instructions) > 0:
            return False
        return math.floor(self.window / self.margin) - self.tools - instructions > 0

    def arithmetic(self, instructions: int) -> str:
        """How the message limit was reached, each term with the setting it came from (for refusals)."""
        room = f"context window {self.window} ({self.window_source}) - output reserve {self.output_reserve} " + (
            f"({self.reserve_source})"
        )
        if self.margin != 1.0:
            room = f"({room}) / token margin {self.margin:g} ({self.margin_source})"
        return f"{room} - instructions {instructions} - tool schemas {self.tools}"


@dataclass(frozen=True)
class Sizes:
    limit: int  # tokens for messages (instructions already subtracted)
    recall: int  # reserve for the auto-recall block (0 when off)
    ledger: int  # share of the standing-instructions block (0 when off)
    context: int  # limit - recall - ledger: what summaries and raw messages may use
    soft: int
    target: int
    summary_room: int
    tail_count: int
    tail_tokens: int
    leaf_chunk: int
    leaf_target: int
    condensed_target: int
    fallback: int
    large_file: int
    tool_result: int

    def chunk_for(self, excess: int) -> int:
        """Source tokens for the next leaf summary: enough to get ``excess`` tokens under the target once the
        summary replaces them, not the whole history (that would forward far less than the budget allows),
        and never less than a third of the context: a summary of a few messages saves little (the facts it
        keeps are verbatim) and costs a summarizer call all the same."""
        return min(self.leaf_chunk, max(excess + self.leaf_target, self.context // 3))


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


COMPACT_LEDGER_BELOW = 1000  # message limits under which the ledger's block is rendered compact


def ledger_share(settings: LcmSettings, limit: int) -> int:
    """The most the standing-instructions block may take of a message limit of ``limit`` tokens: up to half of
    it (2,000 tokens by default in large windows), so that in a small window the block outranks summaries and
    recalled excerpts, which give way first; the budget keeps only what the current items take."""
    if settings.standing_instructions == "off" or limit < 100:
        return 0
    return min(settings.standing_instructions_tokens or 2000, limit // 2)


def ledger_room(settings: LcmSettings, limit: int) -> int:
    """The most the block may take when its items need it: its share, and the recall block's reserve besides
    (recalled excerpts give way to the standing instructions when room is short, never the other way)."""
    share = ledger_share(settings, limit)
    return share + _recall_reserve(settings, limit) if share else 0


def _recall_reserve(settings: LcmSettings, limit: int) -> int:
    if settings.auto_recall == "off" or limit < 400:
        return 0
    return min(settings.auto_recall_tokens or 2000, limit // 10)


def compact_ledger(limit: int) -> bool:
    """Whether the block is rendered compact (short header, the items' words only) for this limit."""
    return limit < COMPACT_LEDGER_BELOW


def sizes(settings: LcmSettings, limit: int, summary_window: int | None = None, ledger: int = 0) -> Sizes:
    """The sizes for a message limit of ``limit`` tokens; ``summary_window`` is the summary model's own
    window, which caps what one summarizer call may be given; ``ledger`` what the conversation's standing
    instructions take (at most ``ledger_room``: past its share, it takes the recall block's reserve)."""
    limit = max(0, limit)
    recall = _recall_reserve(settings, limit)
    ledger = min(ledger, ledger_room(settings, limit))
    recall = max(0, recall - max(0, ledger - ledger_share(settings, limit)))  # what the block took of it
    context = limit - recall - ledger
    soft = int(context * settings.context_threshold)
    target = max(context // 2, soft - context * 2 // 5)
    summary_room = context // 4
    leaf_target = settings.leaf_target_tokens or _clamp(summary_room // 3, 48, 1200)
    condensed_target = settings.condensed_target_tokens or _clamp(summary_room // 2, 64, 2000)
    leaf_chunk = settings.leaf_chunk_tokens or _clamp(context // 2, 200, 20000)
    if summary_window:
        # One summarizer call must fit the summary model: source + prompt + previous summary + answer.
        room = summary_window - PROMPT_OVERHEAD - 2 * max(leaf_target, condensed_target)
        leaf_chunk = max(100, min(leaf_chunk, room))
    large_file = settings.large_file_token_threshold or _clamp(context // 2, 200, 25000)
    tool_result = settings.tool_result_token_threshold or _clamp(context // 8, 50, 2000)
    return Sizes(
        limit=limit,
        recall=recall,
        ledger=ledger,
        context=context,
        soft=soft,
        target=target,
        summary_room=summary_room,
        tail_count=settings.fresh_tail_count,
        tail_tokens=max(0, target - summary_room),
        leaf_chunk=leaf_chunk,
        leaf_target=leaf_target,
        condensed_target=condensed_target,
        fallback=settings.fallback_max_tokens or min(512, leaf_target),  # the fallback is the fact list
        large_file=large_file,
        tool_result=min(tool_result, large_file),
    )


def too_large(needed: int, limit: int, request_budget: Budget, instructions: int) -> ContextTooLong:
    """The refusal of a request whose newest user message and what follows it cannot fit at all."""
    b = request_budget
    return ContextTooLong(
        f"The newest user message and what follows it need {needed} tokens, but only {limit} are available "
        f"for messages: {b.arithmetic(instructions)}. Lower "
        f"{b.reserve_source}, shorten the message, or use a model with a larger window.",
        param="messages",
    )


def no_room(limit: int, request_budget: Budget, instructions: int) -> ContextTooLong:
    """The refusal of a request whose output reserve leaves no room for any message."""
    b = request_budget
    return ContextTooLong(
        f"{b.reserve_source} {b.output_reserve} leaves no room for messages in this model's context window of "
        f"{b.window} tokens: {b.arithmetic(instructions)} = {limit}. Lower {b.reserve_source}.",
        param=b.reserve_source,
    )
