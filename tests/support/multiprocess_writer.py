"""Run as a separate process by test_multiprocess.py: drives the same conversations as its twin."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.support.engine import assistant, open_engine, user


async def main(data_dir: Path, clients: int, turns: int) -> None:
    async with open_engine(data_dir) as (ingestor, _store, _files):
        transcripts = {c: [user(f"client {c} opens")] for c in range(clients)}
        for turn in range(turns):
            await asyncio.gather(*(ingestor.ingest("t", t) for t in transcripts.values()))
            for c, t in transcripts.items():
                transcripts[c] = [*t, assistant(f"answer {turn} to {c}"), user(f"question {turn + 1} from {c}")]
        await asyncio.gather(*(ingestor.ingest("t", t) for t in transcripts.values()))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
