"""Regular expressions written by someone else (a model, possibly prompt-injected, or an admin API caller),
compiled and run by RE2.

A backtracking engine cannot be made safe by inspecting patterns: ``a{1000000000}`` unrolled to 15 GB at
compile time, ``(a|aa)+$`` backtracks for ever, and a hand-written checker misreads some corner of the syntax
(nested sets, comments, verbose mode) that the engine then expands. RE2 is built for untrusted patterns: it
matches in time linear in the text, refuses repetitions that would compile past 1,000 copies, and caps the
memory a compiled pattern may use (``MAX_PATTERN_MEMORY``). The price is the features that need
backtracking: look-around and back-references are refused with a clear message.

Searching a few megabytes takes milliseconds; callers still run it in a worker thread and keep an overall
deadline, since a search may cover many texts.
"""

from __future__ import annotations

from typing import Any

import re2

from proxy.engine.errors import UnsafePattern as UnsafePattern  # re-exported: the compiler's callers catch it

MAX_PATTERN_CHARS = 300
MAX_PATTERN_MEMORY = 8 << 20  # bytes a compiled pattern may use (RE2's max_mem)


def _options() -> Any:
    options = re2.Options()
    options.max_mem = MAX_PATTERN_MEMORY
    options.case_sensitive = False
    options.log_errors = False  # RE2 would print the refused pattern (a query, maybe private) to stderr
    return options


def compile_pattern(pattern: str) -> Any:
    """Compile case-insensitively with RE2; ``UnsafePattern`` for refused or invalid patterns."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise UnsafePattern(f"the pattern is longer than {MAX_PATTERN_CHARS} characters")
    try:
        return re2.compile(pattern, _options())
    except re2.error as error:
        reason = error.args[0].decode(errors="replace") if error.args and isinstance(error.args[0], bytes) else error
        raise UnsafePattern(
            f"invalid regular expression: {reason} (RE2 syntax: no look-around or back-references, and"
            " repetitions may not expand past 1,000 copies)"
        ) from None


def search(compiled: Any, text: str) -> tuple[int, int] | None:
    """First match span, or None. Linear in ``len(text)``."""
    found = compiled.search(text)
    return found.span() if found else None
