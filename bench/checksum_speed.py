"""How fast are the file checksums a run can list, and the per-tensor fingerprint, in memory?

Times SHA-256 (hashlib), XXH3-128 (xxhash, what the Recorder writes) and the fingerprint (the
int64 sum of float32 bit patterns, runs/digests.py) over the same random buffer, one thread,
medians of the repetitions. These are the rates a background writer pays per byte written.

    .venv/bin/python bench/checksum_speed.py [--mib 64] [--reps 7] [--json FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import xxhash

from gradalign.runs.digests import bitsum


def rate(work, nbytes: int, reps: int) -> float:
    """Median GB/s of `work()` over `reps` timed runs (after one untimed)."""
    work()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="buffer size in MiB")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    data = np.random.default_rng(0).standard_normal(args.mib << 18, dtype=np.float32)
    view, nbytes = memoryview(data).cast("B"), data.nbytes
    found = {
        "sha256": rate(lambda: hashlib.sha256(view).digest(), nbytes, args.reps),
        "xxh3-128": rate(lambda: xxhash.xxh3_128(view).digest(), nbytes, args.reps),
        "fingerprint": rate(lambda: bitsum(data), nbytes, args.reps),
    }
    for name, gbs in found.items():
        print(f"{name:12} {gbs:6.2f} GB/s")
    print(f"xxh3-128 / sha256: {found['xxh3-128'] / found['sha256']:.1f}x ({args.mib} MiB)")
    if args.json is not None:
        args.json.write_text(json.dumps({"mib": args.mib, "gb_per_s": found}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
