"""``lcm-proxy doctor``: open the store a location names, check it (``proxy.engine.doctor``), repair what can
be repaired."""

from __future__ import annotations

from pathlib import Path

from proxy.engine.doctor import check_database, repair_files
from proxy.store.files import FileStore
from proxy.store.location import Location


async def run_doctor(where: Path | Location) -> list[str]:
    location = where if isinstance(where, Location) else Location(where)
    store, files = location.stores()
    await store.open()
    try:
        return await check_database(store, files)
    finally:
        await store.close()


async def run_repair(where: Path | Location) -> list[str]:
    """``doctor --repair``: delete leftover files (``repair_files``); what was deleted, one line per kind.
    Nothing to do for a store that keeps payloads in its database (they are written with their rows)."""
    location = where if isinstance(where, Location) else Location(where)
    store, files = location.stores()
    if not isinstance(files, FileStore):
        return []
    await store.open()
    try:
        return await repair_files(store, files)
    finally:
        await store.close()
