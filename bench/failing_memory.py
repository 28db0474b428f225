"""How much memory does `gradalign compare` take where the runs differ, and it names a cause?

A failing compare reads more than a passing one: the diagnoses fit the gradient difference on
the model's tensors (a carry, a penalty, a scale), find the rows that hold it, read its rank.
Records (once, into --dir) a baseline (K=1) of a user MLP with its float64 reference
(bench/user_loop.py), a clean merged run (K=4) and one per bug of `user_loop.BUGS`, then runs
`gradalign compare BASE MERGED` on each in a fresh process: its exit code, first code, wall
seconds and peak RSS (bench/compare_speed.py's wrapper), as a multiple of the largest tensor.
Medians of --reps. `--record sketch`: every run recorded with sketches (full files at the
first and last update only). A folder given with --dir keeps one mode's runs.

    .venv/bin/python bench/failing_memory.py [--size mlp-10m] [--updates 4] [--reps 3]
                                             [--record full|sketch] [--dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_speed import child, largest_tensor, runs_folder


def record(folder: Path, size: str, updates: int, mode: str = "full") -> None:
    import torch
    from user_loop import BUGS, train

    torch.set_num_threads(1)
    if not (folder / "baseline" / "manifest.json").exists():
        ref, base = folder / "baseline-fp64", folder / "baseline"
        train(size, ref, k=1, updates=updates, dtype=torch.float64, record=mode)
        train(size, base, k=1, updates=updates, reference="../baseline-fp64", record=mode)
    for bug in (None, *BUGS):
        out = folder / (bug or "clean")
        if not (out / "manifest.json").exists():
            train(size, out, k=4, updates=updates, bug=bug, record=mode)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="mlp-10m")
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--record", choices=("full", "sketch"), default="full", help="what every run records"
    )
    parser.add_argument("--dir", type=Path, default=None, help="keep the runs here (reused)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from user_loop import BUGS

    rows = {}
    with runs_folder(args.dir, "gradalign-failing-bench-") as folder:
        record(folder, args.size, args.updates, args.record)
        largest = largest_tensor(folder)
        for merged in ("clean", *BUGS):
            seconds, peaks, codes = [], [], set()
            with tempfile.TemporaryDirectory() as scratch:
                report = Path(scratch) / "report.json"
                command = [sys.executable, "-m", "gradalign", "compare"]
                command += [str(folder / "baseline"), str(folder / merged), "--json", str(report)]
                for _ in range(args.reps):
                    wall, code, peak, *_ = child(command)
                    seconds.append(wall)
                    peaks.append(peak)
                    codes.add(code)
                found = json.loads(report.read_text()).get("diagnosis") or [{}]
            rows[merged] = {
                "exit_codes": sorted(codes),
                "first_code": found[0].get("code"),
                "seconds": statistics.median(seconds),
                "peak_rss_bytes": statistics.median(peaks),
                "peak_rss_over_largest_tensor": statistics.median(peaks) / largest,
            }
            row = rows[merged]
            print(
                f"{merged:>20}  exit {row['exit_codes']}  {row['first_code']!s:>20}  "
                f"{row['seconds']:6.2f} s  peak RSS {row['peak_rss_bytes'] / 2**20:6.1f} MiB "
                f"({row['peak_rss_over_largest_tensor']:.1f}x the largest tensor)",
                flush=True,
            )
    if args.json:
        figures = {"size": args.size, "updates": args.updates, "reps": args.reps}
        figures |= {"record": args.record}
        figures |= {"largest_tensor_bytes": largest, "rows": rows}
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
