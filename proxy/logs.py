"""Logging for a serving proxy: one format on stderr, and no conversation content or credential in any line.

``log_level: debug`` is for debugging the proxy, not for dumping traffic. Several libraries under it log
content at DEBUG (and httpx logs URLs, which some providers give a ``?key=``, at INFO): aiosqlite every
statement with its parameters (message text, pasted secrets: 395 MB in one run), the OpenAI SDK every
request's options with its JSON body and headers, httpx/httpcore/hpack the traffic. Those loggers are held
at the most verbose level at which they say nothing of it, whatever the configured level, and a filter on
our handler drops whatever they log below it anyway (``OPENAI_LOG=debug`` re-levels the SDK's loggers when
it is imported). The proxy's own lines carry ids, counts and sizes; as a last guard, every formatted line
(tracebacks included: an upstream exception's chain holds the provider's raw text) goes through
``redact_credentials`` with the configured credentials.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable

from proxy.redaction import redact_credentials

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Logger (and its children) -> the most verbose level at which it logs no content.
CONTENT_FREE_LEVELS: dict[str, int] = {
    "aiosqlite": logging.INFO,  # DEBUG: "executing <partial: SQL, parameters>" for every statement
    "openai": logging.INFO,  # DEBUG: "Request options: {... json_data, headers ...}"
    "httpx": logging.WARNING,  # INFO: every request URL (a ?key= on some providers)
    "httpcore": logging.WARNING,  # DEBUG: connection and body events
    "hpack": logging.WARNING,  # DEBUG: every header, authorization included
    "h2": logging.WARNING,
    "urllib3": logging.WARNING,
    "aiohttp": logging.WARNING,  # LiteLLM's transport
    "LiteLLM": logging.WARNING,  # DEBUG/INFO: request payloads ("POST Request Sent from LiteLLM: ...")
    "LiteLLM Router": logging.WARNING,
    "LiteLLM Proxy": logging.WARNING,
}


def _content_free_level(name: str) -> int | None:
    while True:
        if name in CONTENT_FREE_LEVELS:
            return CONTENT_FREE_LEVELS[name]
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]


class ContentFilter(logging.Filter):
    """Drops records of the libraries above that are more verbose than their content-free level, and cuts
    the query string from uvicorn's access lines (an admin grep's ``?pattern=`` is a query over messages)."""

    def filter(self, record: logging.LogRecord) -> bool:
        floor = _content_free_level(record.name)
        if floor is not None and record.levelno < floor:
            return False
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) >= 3:
            path = record.args[2]
            if isinstance(path, str) and "?" in path:
                record.args = (*record.args[:2], path.split("?", 1)[0] + "?…", *record.args[3:])
        return True


class RedactingFormatter(logging.Formatter):
    """Formats as usual, then masks known credentials (and anything shaped like one) in the whole line."""

    def __init__(self, fmt: str = FORMAT, credentials: Iterable[str] = ()) -> None:
        super().__init__(fmt)
        self.credentials = tuple(credentials)

    def format(self, record: logging.LogRecord) -> str:
        return redact_credentials(super().format(record), self.credentials)


def clamp_library_loggers(level: int) -> None:
    """Set each library logger above to ``level`` or its content-free level, whichever is less verbose."""
    for name, floor in CONTENT_FREE_LEVELS.items():
        logging.getLogger(name).setLevel(max(level, floor))


def configure_logging(level: str, credentials: Iterable[str] = ()) -> None:
    """Root logging for ``lcm-proxy serve`` (and each worker process): ``level`` is the config's
    ``log_level``; ``credentials`` are masked in every line. Calling it again replaces the earlier setup."""
    numeric = logging.getLevelName(level.upper())
    numeric = numeric if isinstance(numeric, int) else logging.INFO
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "lcm_proxy", False)]:
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.lcm_proxy = True  # type: ignore[attr-defined]
    handler.setFormatter(RedactingFormatter(FORMAT, credentials))
    handler.addFilter(ContentFilter())
    root.addHandler(handler)
    root.setLevel(numeric)
    clamp_library_loggers(numeric)
