"""Files a killed process leaves behind: ``doctor`` reports them (counts and sizes, never contents), ``doctor
--repair`` deletes them, and neither touches what a running server may still be writing.

The leftovers are made by a real process that writes payloads the way a request does and is then SIGKILLed.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from proxy.cli.doctor import run_doctor, run_repair
from proxy.cli.main import main
from proxy.engine.ingest import export_conversation
from proxy.store.files import FileStore
from proxy.store.sqlite.store import SQLiteStore
from tests.support.engine import open_engine, run
from tests.support.leftovers import (
    UNCOMMITTED_CONTENT,
    age,
    killed_writer,
    pending,
    stored_conversation,
)

LEGACY_TEMP = b"x" * 10


def config_file(tmp_path: Path, data_dir: Path) -> str:
    path = tmp_path / "doctor.yaml"
    path.write_text(
        "model_list:\n"
        "  - {model_name: m, litellm_params: {model: openai/m, api_base: 'http://127.0.0.1:9/v1', api_key: k-12345678}}\n"
        f"general_settings: {{data_dir: '{data_dir}'}}\n"
    )
    return str(path)


def test_doctor_reports_and_repair_removes_what_a_killed_process_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    conversation, transcript = stored_conversation(data_dir)
    uncommitted = killed_writer(data_dir)
    config = config_file(tmp_path, data_dir)
    capsys.readouterr()

    assert main(["doctor", "--config", config]) == 1  # it said OK
    out = capsys.readouterr().out
    assert "files: 2 (1,130 bytes) partial file(s) left by interrupted writes" in out, out
    assert "files: 1 (1,000 bytes) stored file(s) that no row names" in out, out
    assert "half of a request" not in out and "published, but" not in out  # counts and sizes, not contents

    assert main(["doctor", "--repair", "--config", config]) == 0
    out = capsys.readouterr().out
    assert "repaired: deleted 2 (1,130 bytes) partial file(s)" in out, out
    assert "repaired: deleted 1 (1,000 bytes) stored file(s) that no row named" in out, out
    assert out.rstrip().endswith(": OK"), out
    assert pending(data_dir) == [] and not (data_dir / uncommitted).exists()
    assert not list((data_dir / uncommitted).parent.glob(".tmp-*"))
    assert asyncio.run(run_doctor(data_dir)) == []

    async def exported() -> list[dict[str, str]]:
        async with open_engine(data_dir) as (_, store, files):
            return await export_conversation(store, files, "t", conversation)

    assert run(exported()) == transcript  # the stored file with a row is still there


def test_repair_beside_a_running_server_only_removes_files_no_request_can_still_be_writing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    stored_conversation(data_dir)
    server = FileStore(data_dir)  # a live server of this data dir: one request's payload is in flight
    in_flight = server.batch("t")
    _, relative = in_flight.add(b"a payload whose request is still running")
    in_flight.write()
    (server_pending,) = pending(data_dir)
    uncommitted = killed_writer(data_dir)  # a worker that died an hour ago (aged below)
    (old_pending,) = [p for p in pending(data_dir) if p != server_pending]
    (data_dir / uncommitted).with_name(".tmp-0123abcd").unlink()
    # A worker that died just now: its leftovers cannot be told from files of the server's running requests.
    young = data_dir / killed_writer(data_dir, b"young partial", b"young uncommitted")
    young_files = [*(set(pending(data_dir)) - {server_pending, old_pending}), young, young.with_name(".tmp-0123abcd")]
    assert len(young_files) == 3
    for path in (old_pending, data_dir / uncommitted):
        age(path, 3600)

    problems = asyncio.run(run_doctor(data_dir))
    assert problems == [
        "files: 1 (1,000 bytes) stored file(s) that no row names (--repair deletes them)",
        "files: 1 (1,120 bytes) partial file(s) left by interrupted writes (--repair deletes them)",
    ]
    assert asyncio.run(run_repair(data_dir)) == [
        "deleted 1 (1,120 bytes) partial file(s) left by interrupted writes",
        "deleted 1 (1,000 bytes) stored file(s) that no row named",
    ]
    assert not old_pending.exists() and not (data_dir / uncommitted).exists()
    assert all(p.exists() for p in young_files)
    in_flight.publish_now([relative])  # the running request's pending file was left alone
    assert (data_dir / relative).read_bytes() == b"a payload whose request is still running"
    in_flight.discard()


def test_a_request_that_relied_on_a_file_repair_deleted_writes_it_again(tmp_path: Path) -> None:
    """A request finds its content already stored (a leftover without a row) and skips writing it; repair
    deletes that leftover before the request's transaction. Its publish, inside that transaction, writes the
    file again: no committed row names a missing file."""
    data_dir = tmp_path / "data"
    stored_conversation(data_dir)
    uncommitted = killed_writer(data_dir)
    request = FileStore(data_dir).batch("t")
    _, relative = request.add(UNCOMMITTED_CONTENT)
    assert relative == uncommitted
    request.write()  # nothing to write: the content is on disk already
    assert any("stored file(s)" in line for line in asyncio.run(run_repair(data_dir)))
    assert not (data_dir / relative).exists()
    request.publish_now([relative])
    assert (data_dir / relative).read_bytes() == UNCOMMITTED_CONTENT
    request.discard()


def test_the_first_write_of_a_process_sweeps_what_dead_processes_left_pending(tmp_path: Path) -> None:
    """The startup sweep: pending files of dead processes used to stay for an hour."""
    data_dir = tmp_path / "data"
    worker = FileStore(data_dir)
    worker.put("t", b"a live worker's payload")  # from its first write on, it holds the writers' lock
    killed_writer(data_dir)
    # While another process writes here, a young pending file may be one of its requests': it stays.
    second = FileStore(data_dir)
    second.put("t", b"first payload of a second worker")
    assert len(pending(data_dir)) == 1
    del worker, second  # both exit: the kernel drops their locks
    gc.collect()
    # With no live writer, the first write of a new process removes every pending file: nobody is writing it.
    FileStore(data_dir).put("t", b"first payload after a restart")
    assert pending(data_dir) == []


def test_doctor_exits_non_zero_when_problems_other_than_leftovers_remain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    stored_conversation(data_dir)
    killed_writer(data_dir)
    config = config_file(tmp_path, data_dir)
    capsys.readouterr()
    rows = asyncio.run(_row_paths(data_dir))
    (data_dir / rows[0]).unlink()  # a file a row names, gone: not a leftover, repair cannot bring it back
    assert main(["doctor", "--repair", "--config", config]) == 1
    out = capsys.readouterr().out
    assert "repaired: deleted 2 (1,130 bytes) partial file(s)" in out
    assert f"file {rows[0]} is missing" in out and "1 problem(s)" in out, out


async def _row_paths(data_dir: Path) -> list[str]:
    store = SQLiteStore(data_dir)
    await store.open()
    try:
        async with store.search_conn.execute("SELECT path FROM files") as cursor:
            return [str(r[0]) for r in await cursor.fetchall()]
    finally:
        await store.close()
