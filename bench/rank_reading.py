"""What reading a gradient's rank at a failing update costs (judge/kink_pair.py
`RANK_ELEMENTS`): one input's share searched in fused experts' error (experts x rows x columns,
float32, a spread error: the search runs every reading to its end) from the values, by power
iterations in float64, and from grid sums made of the values, as the judge reads tensors past
the bound. Seconds (median of `--reps`) and the peak of numpy's allocations on the way
(tracemalloc), as a multiple of one float32 tensor.

    OMP_NUM_THREADS=1 .venv/bin/python bench/rank_reading.py
        [--sizes 8x512x256,8x1024x512,8x2048x1024] [--reps 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from pathlib import Path

import numpy as np

from gradalign.judge import kink_pair
from gradalign.judge.kink_evidence import Whole


def reading(shape: tuple[int, ...], bound: int, reps: int) -> dict:
    """Seconds and peak allocation of `Whole.one_input` over a spread error of `shape`, the rank
    read from values up to `bound` elements."""
    rng = np.random.default_rng(0)
    second = rng.standard_normal(shape, dtype=np.float32)
    first = second + np.float32(1e-3) * rng.standard_normal(shape, dtype=np.float32)
    kink_pair.RANK_ELEMENTS = bound
    seconds, peaks, how = [], [], ""
    for _ in range(reps):
        pair = Whole({"g": first}, {"g": second})
        tracemalloc.start()
        start = time.perf_counter()
        found = pair.one_input("g")
        seconds.append(time.perf_counter() - start)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        how = pair.rank_read("g") or "values"
        assert found is None, found  # a spread error holds no input's share
    return {
        "shape": "x".join(map(str, shape)),
        "read": how.removeprefix(", read from its "),
        "seconds": statistics.median(seconds),
        "peak_tensors": statistics.median(peaks) / first.nbytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8x512x256,8x1024x512,8x2048x1024")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for size in args.sizes.split(","):
        shape = tuple(int(n) for n in size.split("x"))
        for bound in (1 << 62, 0):  # the values, then grid sums
            rows.append(reading(shape, bound, args.reps))
            row = rows[-1]
            print(
                f"{row['shape']:>14}  {row['read']:>9}  {row['seconds']:8.3f} s  "
                f"peak {row['peak_tensors']:5.2f} float32 tensors",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
