"""Regular expressions written by someone else (a model, possibly prompt-injected, or an admin API caller),
made safe to compile and run.

The ``regex`` engine unrolls counted repeats when it compiles: ``a{1000000000}`` allocates for every copy
(about 256 bytes each) and froze the proxy at 15 GB. ``check_pattern`` therefore bounds the pattern's size
*before* anything is compiled: the length, the nesting depth, every repeat count, and the compiled size
(the sum over all atoms of the product of the counts that enclose them). Fuzzy constraints (``{e<=2}``),
whose matching cost explodes, are refused. What remains compiles in microseconds to milliseconds.

Matching time is bounded separately: ``search`` takes a timeout (the engine checks it while it runs) and
releases the GIL (``concurrent=True``), so a catastrophic pattern such as ``(a|aa)+$`` run in a worker
thread neither stalls the event loop nor outlives its deadline.
"""

from __future__ import annotations

import re
from typing import Any

import regex

MAX_PATTERN_CHARS = 300
MAX_REPEAT = 1000  # the largest count one {m,n} may name (RE2's limit too)
MAX_UNITS = 5000  # compiled size: atoms, each multiplied by the counts of the repeats around it
MAX_GROUP_DEPTH = 20

_COUNTED = re.compile(r"\{(\d*)(?:,(\d*))?\}")
_FUZZY = re.compile(r"\{[^}]*[<=>][^}]*\}")


class UnsafePattern(ValueError):
    """The pattern is refused before compiling; the message says why, for the caller to fix it."""


def _skip_class(pattern: str, i: int) -> int:
    """Index just after the character class that starts at ``pattern[i] == "["``."""
    i += 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1  # a leading ] is literal
    depth = 1  # the regex module allows nested sets ([[a-z]--[aeiou]] in version 1)
    while i < len(pattern) and depth:
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        i += 1
    return i


def check_pattern(pattern: str) -> None:
    """Raise ``UnsafePattern`` unless ``pattern`` is small enough to compile without risk."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise UnsafePattern(f"the pattern is longer than {MAX_PATTERN_CHARS} characters")
    if _FUZZY.search(pattern):
        raise UnsafePattern("fuzzy matching constraints such as {e<=1} are not supported")
    # One frame per open group: [units so far, units of the last atom].
    stack: list[list[int]] = [[0, 0]]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        frame = stack[-1]
        if char == "\\":
            frame[0] += 1
            frame[1] = 1
            i += 2
            continue
        if char == "[":
            frame[0] += 1
            frame[1] = 1
            i = _skip_class(pattern, i)
            continue
        if char == "(":
            if len(stack) > MAX_GROUP_DEPTH:
                raise UnsafePattern(f"groups are nested more than {MAX_GROUP_DEPTH} deep")
            stack.append([0, 0])
            i += 1
            continue
        if char == ")":
            if len(stack) > 1:
                inner = max(1, stack.pop()[0])
                stack[-1][0] += inner
                stack[-1][1] = inner
            i += 1
            continue
        counted = _COUNTED.match(pattern, i) if char == "{" else None
        if counted and (counted.group(1) or counted.group(2)):
            low, high = counted.group(1), counted.group(2)
            numbers = [int(n) for n in (low, high) if n]
            if max(numbers) > MAX_REPEAT:
                raise UnsafePattern(f"repeat counts above {MAX_REPEAT} are not supported")
            factor = max(numbers) if high is not None or low else 1
            frame[0] += frame[1] * (factor - 1)
            frame[1] *= factor
            i = counted.end()
        else:
            if char not in "*+?|^$":
                frame[0] += 1
                frame[1] = 1
            i += 1
        if stack[-1][0] > MAX_UNITS or frame[0] > MAX_UNITS:
            raise UnsafePattern("the pattern would compile too large; use fewer or smaller repeat counts")
    total = sum(frame[0] for frame in stack)
    if total > MAX_UNITS:
        raise UnsafePattern("the pattern would compile too large; use fewer or smaller repeat counts")


def compile_pattern(pattern: str) -> Any:
    """Check, then compile case-insensitively. ``UnsafePattern`` for refused or invalid patterns."""
    check_pattern(pattern)
    try:
        return regex.compile(pattern, regex.IGNORECASE)
    except (regex.error, OverflowError, RecursionError) as error:
        raise UnsafePattern(f"invalid regular expression: {error}") from None


def search(compiled: Any, text: str, timeout: float) -> tuple[int, int] | None:
    """First match span, or None. Raises ``TimeoutError`` past ``timeout`` seconds; releases the GIL."""
    found = compiled.search(text, timeout=timeout, concurrent=True)
    return found.span() if found else None
