"""Run benchmarks: ``python -m bench`` (all) or ``python -m bench ingest``.

Options after the names that this command does not know go to the benchmarks that take their own
(``python -m bench fidelity --budget 1500``; ``python -m bench fidelity --help`` lists them).
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Callable

from bench import (
    clients,
    compaction,
    delete,
    fidelity,
    ingest,
    kit,
    ledger,
    load,
    local_turns,
    overhead,
    scale,
    standing_eval,
    store,
)

BENCHMARKS: dict[str, Callable[..., None]] = {
    "ingest": ingest.main,
    "ledger": ledger.main,
    "store": store.main,
    "delete": delete.main,
    "compaction": compaction.main,
    "scale": scale.main,
    "overhead": overhead.main,
    "clients": clients.main,
    "load": load.main,
    "fidelity": fidelity.main,
    "local-turns": local_turns.main,
    "kit": kit.main,
    "standing-eval": standing_eval.main,
}
# Benchmarks whose main() also takes ``argv``: the options this parser leaves over.
OWN_OPTIONS = {"delete", "fidelity", "kit", "ledger", "load", "local-turns", "scale", "standing-eval", "store"}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, add_help=False)
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(BENCHMARKS)} (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (for smoke tests)")
    parser.add_argument("-h", "--help", action="store_true", help="show this help (or a named benchmark's) and exit")
    args, extra = parser.parse_known_args()
    names = args.names or list(BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)} (put a benchmark's own options after its name)")
    takers = [name for name in args.names if name in OWN_OPTIONS]
    if args.help:
        if not takers:
            parser.print_help()
        for name in takers:
            BENCHMARKS[name](quick=args.quick, argv=["--help"])
        return
    if extra and not takers:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}, {platform.system()}"
    )
    for name in names:
        if name in OWN_OPTIONS:
            BENCHMARKS[name](quick=args.quick, argv=extra)
        else:
            BENCHMARKS[name](quick=args.quick)


if __name__ == "__main__":
    main()
