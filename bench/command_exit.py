"""How much of a recording command's wall time was the interpreter's own exit?

Times `gradalign baseline` (tiny: 4 updates, B=32, hidden 32, with its float64 reference) in a
fresh process two ways, alternated: through the installed entry point (`python -m gradalign`,
which ends the process once the command has settled its exit code, gradalign/__main__.py), and
through `cli.main` alone, after which Python tears the interpreter down (0.5 to 1.5 s with
torch imported). Medians over the repetitions, and their ratio.

    .venv/bin/python bench/command_exit.py [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = ["baseline", "--updates", "4", "--batch-size", "32", "--hidden", "32"]
WAYS = {
    "entry point": [sys.executable, "-m", "gradalign"],
    "Python's exit": [
        sys.executable,
        "-c",
        "import sys; from gradalign.cli import main; main(sys.argv[1:])",
    ],
}


def timed(prefix: list[str], out: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    subprocess.run([*prefix, *COMMAND, "-o", str(out)], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="repetitions of each way")
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    scratch = Path(tempfile.mkdtemp(prefix="gradalign-exit-"))
    try:
        for rep in range(args.reps):
            for way, prefix in WAYS.items():
                times[way].append(timed(prefix, scratch / f"{rep}-{len(times[way])}-{way[0]}"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {way: statistics.median(found) for way, found in times.items()}
    for way, value in medians.items():
        print(f"{way:14s} {value:6.2f} s  (median of {args.reps})")
    entry, python = medians.values()
    print(f"ratio {entry / python:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
