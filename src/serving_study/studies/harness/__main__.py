"""Command line: the benchmark parts that need a fresh process of their own."""

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from serving_study.studies.harness.shm_copy import shm_copy_figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving_study.studies.harness")
    commands = parser.add_subparsers(dest="command", required=True)
    shm = commands.add_parser(
        "shm-copy", help="time each variant's ShmPointerMMData and memcpy; print JSON"
    )
    shm.add_argument("--variant", action="append", required=True, help="NAME=ROOT")
    shm.add_argument("--rows", type=int, nargs="+", required=True)
    shm.add_argument("--columns", type=int, default=1536)
    shm.add_argument("--repeats", type=int, default=10)
    shm.add_argument("--niceness", type=int, help="run at this niceness if allowed")
    arguments = parser.parse_args(argv)
    if arguments.niceness is not None:
        # Threads started later (torch's OpenMP pool) inherit it.
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, 0, arguments.niceness)
    variants = dict(item.split("=", 1) for item in arguments.variant)
    figures = shm_copy_figures(
        {name: Path(root) for name, root in variants.items()},
        arguments.rows,
        arguments.columns,
        arguments.repeats,
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
