"""The errors the engine reports to its callers.

The engine knows nothing of HTTP: it says *what* went wrong (not found, a bad argument, busy), and each caller
decides how to tell its user. The wire layer maps these to OpenAI's error JSON in one function
(``proxy.wire.http.to_proxy_error``; the status each maps to is noted below); the operator's CLI prints the
message and exits with status 1 (``proxy.cli.operator.run_operator``). ``message`` is written for whoever made the
call and never quotes stored content; ``param`` names the argument at fault, when one is.

    EngineError                  anything the engine reports (unmapped subclasses: 500)
    ├── NotFound                 404: no such conversation, summary, file or message for this tenant
    ├── InvalidArgument          400 ``invalid_value``: an argument the caller can fix
    │   ├── RecallError          a recall tool's argument: a model reads the message as the tool's result
    │   ├── UnsafePattern        a regular expression RE2 refuses (too long, invalid, or needs backtracking)
    │   └── ContextTooLong       400 ``context_length_exceeded``: the newest message and what follows cannot fit
    ├── ConversationBusy         409: concurrent requests kept changing the conversation; retry
    └── SummarizerUnavailable    502: the summary model refuses the proxy's credentials (its breaker is open)

The store's own errors (``StoreBusy``, ``StoreUnavailable``, ``UnsafePathError``) are in ``proxy.store.errors``:
the store sits beneath the engine and imports nothing of it.

Internal exceptions are not here: they steer control flow inside one module and its caller, which always
catches them, so no user ever sees one. They are ``SummaryPreempted`` (a background summary gave way to a
chat request), ``TooLarge`` (assembly retries with the recall reserve), ``NeedsPreparation`` (ingestion
prepares the messages another request added, then commits again) and ``BatchClosedError`` (a request's
files were discarded under its transaction). ``SummarizerUnavailable`` is mostly of that kind too (a sweep
turns it into ``SweepReport.unavailable``), but is reported should it ever escape.
"""

from __future__ import annotations


class EngineError(Exception):
    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class NotFound(EngineError):
    """An id of another tenant is reported exactly like an unknown one."""


class InvalidArgument(EngineError):
    pass


class RecallError(InvalidArgument):
    """A recall tool call the model can fix (bad id, bad pattern, out of scope): returned to the model as text
    by ``RecallTools.run``; the admin API and the CLI report it as a bad argument."""


class UnsafePattern(InvalidArgument):
    def __init__(self, message: str, *, param: str | None = "pattern") -> None:
        super().__init__(message, param=param)


class ContextTooLong(InvalidArgument):
    """Raised before any summary call: compaction cannot make the request fit. ``conversation_id`` is the
    stored conversation the refused request belongs to (the client still learns it)."""

    def __init__(self, message: str, *, param: str | None = None, conversation_id: str | None = None) -> None:
        super().__init__(message, param=param)
        self.conversation_id = conversation_id


class ConversationBusy(EngineError):
    """Other requests kept extending the same conversation while this one was stored; nothing was written."""


class SummarizerUnavailable(EngineError):
    """The summary model refused the proxy's credentials (or its breaker is open): write no summary."""
