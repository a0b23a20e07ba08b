"""A server collects at startup, in the background, the payload files that processes killed mid-request left
behind (issue 22, "Hardening"): the same deletion as ``doctor --repair``, limited to files older than any live
worker's request can have been writing, so another worker sharing the data directory loses nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from proxy.app import create_app
from proxy.cli.doctor import run_doctor
from proxy.engine.ingest import export_conversation
from proxy.store.files import PENDING
from proxy.store.location import Location
from tests.support.leftovers import PENDING_CONTENT, age, killed_writer, pending, stored_conversation
from tests.support.proxies import make_config


def test_startup_collects_old_leftovers_of_killed_processes_and_keeps_young_ones(
    tmp_path: Path, upstream_url: str
) -> None:
    data_dir = tmp_path / "data"
    conversation, transcript = stored_conversation(data_dir)  # a row and its file: never touched
    old_uncommitted = data_dir / killed_writer(data_dir)  # killed an hour ago (aged below)
    old_temp = old_uncommitted.with_name(".tmp-0123abcd")
    # Killed just now: as young as a file a live worker's request may be writing (another process sharing the
    # data directory, on this host or another where its lock cannot be seen), so it stays. (Its first write
    # swept the older process's pending file, as a new writer alone with the files does: one is put back.)
    young_uncommitted = data_dir / killed_writer(data_dir, b"young partial", b"young uncommitted")
    young = [*pending(data_dir), young_uncommitted, young_uncommitted.with_name(".tmp-0123abcd")]
    assert len(young) == 3 and all(p.exists() for p in young)
    old_pending = data_dir / "files" / PENDING / ("0" * 32)
    old_pending.write_bytes(PENDING_CONTENT)
    for path in (old_uncommitted, old_pending, old_temp):
        age(path, 3600)
    before = asyncio.run(run_doctor(data_dir))
    assert "files: 2 (1,017 bytes) stored file(s) that no row names (--repair deletes them)" in before, before

    app = create_app(make_config(upstream_url, data_dir, {}, request_timeout=600))
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        collecting = app.state.lcm.collecting
        assert collecting is not None

        async def collected() -> list[str]:
            return await collecting  # type: ignore[no-any-return]

        lines = client.portal.call(collected)

    assert lines == [
        "deleted 2 (1,130 bytes) partial file(s) left by interrupted writes",
        "deleted 1 (1,000 bytes) stored file(s) that no row named",
    ]
    assert not old_uncommitted.exists() and not old_pending.exists() and not old_temp.exists()
    assert all(p.exists() for p in young)

    async def exported() -> list[Any]:
        store, files = Location(data_dir).stores()
        await store.open()
        try:
            return await export_conversation(store, files, "t", conversation)
        finally:
            await store.close()

    assert asyncio.run(exported()) == transcript  # the file a row names is intact
    # What is left is the young leftovers, and only them.
    assert asyncio.run(run_doctor(data_dir)) == [
        "files: 1 (17 bytes) stored file(s) that no row names (--repair deletes them)",
        "files: 2 (23 bytes) partial file(s) left by interrupted writes (--repair deletes them)",
    ]
