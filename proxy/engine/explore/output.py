"""What every exploration summary goes through on its way out: secrets redacted before any cap (a cap that
splits a token could leave a prefix no pattern recognises), control characters replaced, lengths capped.

Summaries are shown to a model and stored, so this is the one module of the explorers that calls
``redact_secrets``; excerpts of the input are taken through ``redacted_prefix`` and ``redacted_suffix``, which
redact a bounded window, never all of a multi-megabyte paste.
"""

from __future__ import annotations

import re
import string

from proxy.redaction import redact_secrets

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def finish(lines: list[str], max_chars: int) -> str:
    # Redact before capping: a cap that splits a token could leave a prefix no pattern recognises.
    text = _CONTROL.sub("\ufffd", redact_secrets("\n".join(lines)))
    return text if len(text) <= max_chars else text[: max(0, max_chars - 1)] + "…"


_TOKEN_CHARS = string.ascii_letters + string.digits + "_-+/=."
_BOUNDARY = re.compile(r"[^\w+/=.-]")


def redacted_prefix(text: str, n: int) -> str:
    """Redacted text covering at least ``text[:n]`` when possible, without redacting all of a huge string.

    The window is wider than ``n`` (redaction may shrink it) and drops its trailing run of token characters:
    a token cut in the middle might be too short for its pattern, and once redaction has shrunk what comes
    before it, that fragment could land inside the first ``n`` characters.
    """
    window = text[: n + 256]
    if len(window) < len(text):
        window = window.rstrip(_TOKEN_CHARS) or window
    return redact_secrets(window)


def redacted_suffix(text: str, n: int) -> str:
    """Redacted text covering the last ``n`` characters of ``text``, or a little less.

    It starts on a line (or at least token) boundary: the anonymous end of a secret matches no pattern.
    """
    start = len(text) - n
    if start <= 0:
        return redact_secrets(text)
    cut = text.find("\n", start, start + n // 2)
    boundary = _BOUNDARY.search(text, start, start + n // 2) if cut < 0 else None
    cut = boundary.start() if boundary else cut
    return redact_secrets(text[cut + 1 if cut >= 0 else start :])


def clip(text: str, limit: int) -> str:
    text = redacted_prefix(text, limit)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_name(error: BaseException) -> str:
    """What a log line says of a swallowed exception: its class, never its message (which may quote the input)."""
    return type(error).__name__
