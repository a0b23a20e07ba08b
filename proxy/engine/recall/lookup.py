"""Lookups within a recall scope: a summary, a stored file and its content, or an error the model can read.

Every tool opens ids through these, so an id from another conversation, an ancestor's later part or another
scope reads as "not in this conversation", exactly like an id that does not exist.
"""

from __future__ import annotations

from typing import Any

from proxy.engine.errors import RecallError
from proxy.engine.recall.scope import Scope
from proxy.store.base import Blobs, Store
from proxy.store.errors import UnsafePathError
from proxy.store.records import FileRecord, SummaryRecord


def int_arg(args: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    """An integer tool argument clamped to ``[low, high]``; a non-number is the model's error to correct."""
    value = args.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecallError(f"'{key}' must be an integer", param=key)
    return max(low, min(high, int(value)))


class Lookup:
    def __init__(self, store: Store, files: Blobs) -> None:
        self.store = store
        self.files = files

    async def summary(self, scope: Scope, summary_id: str) -> SummaryRecord:
        summary = await self.store.read.summary(summary_id)
        if summary is None or not scope.sees_summary(summary):
            raise RecallError(f"no summary {summary_id} in this conversation")
        return summary

    async def file(self, scope: Scope, file_id: str) -> FileRecord:
        record = await self.store.read.file(scope.owner, file_id)
        in_scope = record is not None and await self.store.search.file_visible(file_id, scope.bounds)
        if record is None or not in_scope:
            raise RecallError(f"no stored file {file_id} in this conversation")
        return record

    async def read(self, record: FileRecord) -> bytes:
        try:
            return await self.files.load(record.path)
        except (UnsafePathError, OSError) as error:
            raise RecallError(f"the content of {record.id} cannot be read") from error
