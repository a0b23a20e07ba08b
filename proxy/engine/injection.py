"""Instruction-like text in material that reaches a model as data: summaries, fallbacks, exploration summaries.

Conversation text, tool output and pasted documents may carry a prompt injection; a summary model may copy it
or be talked into writing one. The summaries the proxy places in the context are marked untrusted, and on top
of that the sentences that try to take over their reader are removed here.
"""

from __future__ import annotations

import re

# Sentences that read like orders to a model are dropped from deterministic fallbacks: the fallback is
# raw conversation text re-presented as a summary, and it must not smuggle instructions into the context.
INSTRUCTION_LIKE = re.compile(
    r"\b(ignore (all|any|the)? ?(previous|prior|above)|disregard|you are now|you must|system prompt|"
    r"new instructions|do not tell|act as|pretend to be|from now on)\b",
    re.I,
)

# Model-written summaries get a narrower filter. A summary must keep what the user asked for ("From now on
# answer in French", "You must use metric units", "act as a reviewer"): those are facts the next turns
# depend on, so the fallback's orders-in-general pattern would delete exactly what a summary is for. What
# is removed here is text that tries to take over whoever reads the summary, as a prompt injection in the
# transcript might get the summary model to copy or write: overriding earlier instructions, a new identity,
# announced new instructions or system prompt, role play. Mentions that give no order ("we designed the
# system prompt of the support bot") are kept.
INSTRUCTION_OVERRIDE = re.compile(
    r"\b(ignore|disregard|forget|override)\b[^.!?\n]{0,40}?\b(previous|prior|above|earlier|preceding|original|your)\b"
    r"[^.!?\n]{0,40}?\b(instructions?|prompts?|rules|guidelines|directions)\b"
    r"|\b(ignore|disregard|forget|override)\s+(all|any)\s+(instructions|prompts|rules|guidelines)\b"
    r"|\b(ignore|disregard|forget)\s+(the|everything|anything|all)(\s+of\s+the)?\s+above\b"
    r"|\byou are now\b"
    r"|\bnew instructions\s*:"
    r"|\bsystem prompt\s*:"
    r"|\b(new|updated|real|actual|true|reveal|print|repeat|replace|override|ignore)\b[^.!?\n]{0,20}?\bsystem prompt"
    r"|\bpretend (to be|you are|that you)\b",
    re.I,
)
REMOVED_MARKER = "[instruction-like text removed]"
# A sentence: up to a ".", "!" or "?" followed by whitespace, a line break, or the end. One character of
# look-ahead and a lazy scan keep this linear on hostile input (long runs of "!!!" or no punctuation at all).
SENTENCE = re.compile(r"[^\n]*?(?:[.!?](?=\s)|\n|\Z)")
LIST_PREFIX = re.compile(r"[ \t]*(?:[-*\u2022][ \t]+)?")


def remove_instruction_overrides(text: str) -> str:
    """``text`` with each sentence that tries to override the reader's instructions replaced by a marker,
    the rest (line breaks and list bullets included) as it was."""

    def scrub(match: re.Match[str]) -> str:
        sentence = match.group(0)
        if not INSTRUCTION_OVERRIDE.search(sentence):
            return sentence
        prefix = LIST_PREFIX.match(sentence)
        lead = prefix.group(0) if prefix else ""
        return lead + REMOVED_MARKER + ("\n" if sentence.endswith("\n") else "")

    return SENTENCE.sub(scrub, text)
