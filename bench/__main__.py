"""Run benchmarks: ``python -m bench`` (all) or ``python -m bench ingest``."""

from __future__ import annotations

import argparse
import os
import platform

from bench import compaction, ingest, load, overhead

BENCHMARKS = {"ingest": ingest.main, "compaction": compaction.main, "overhead": overhead.main, "load": load.main}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(BENCHMARKS)} (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (for smoke tests)")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}, {platform.system()}"
    )
    for name in args.names or list(BENCHMARKS):
        BENCHMARKS[name](quick=args.quick)


if __name__ == "__main__":
    main()
