"""Run as a separate process by test_lease_heartbeat.py: takes a conversation's compaction lease the way a
sweep does (``Compactor.leases``, the heartbeat from ``lcm_settings``), says so on stdout, then holds it,
renewing, until it is killed. Arguments: data directory, database URL (empty: SQLite), conversation id,
heartbeat seconds."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from proxy.config.lcm import LcmSettings
from proxy.engine.engine import ContextEngine
from proxy.store.location import Location


async def main(data_dir: Path, url: str, conversation_id: str, heartbeat: float) -> None:
    store, files = Location(data_dir, url or None).stores()
    await store.open()
    engine = ContextEngine(
        store, files, LcmSettings().model_copy(update={"compaction_lease_heartbeat_seconds": heartbeat})
    )
    async with engine.compactor.leases.hold(conversation_id, 0) as held:
        owner = (await store.read.compaction_lease(conversation_id) or ("",))[0] if held else ""
        print(f"held {owner}" if held else "not held", flush=True)
        await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])))
