"""How fast does `gradalign compare` read a set of runs, and in how much memory?

Records (once, into --dir) a baseline (K=1) with its float64 reference and a merged run (K=4)
of a user MLP (bench/user_loop.py: AdamW, B=128, float32), then times, interleaved in each
repetition, on the warm page cache:

- raw: reading every file of the three runs into a 4 MiB buffer (the disk-speed ceiling);
- naive: a script that loads both runs' weight and gradient files with the safetensors package
  and takes each tensor's max abs diff (no reference, no noise floor, no diagnosis);
- gradalign: `gradalign compare BASE MERGED` in a fresh process (start-up included), with its
  peak RSS (the largest of its processes, ru_maxrss) and the peak of the RSS of all its
  processes summed (the judge forks for large runs: judge/owners.py), and once more with
  `--verify-files` (XXH3-128 of every file);
- default malloc: the same command line started without `gradalign.__main__`, so with glibc's
  malloc thresholds as they come (gradalign/allocator.py), with both runs' page faults.

Throughput is the bytes of the whole run set (baseline, merged, reference) over the wall time;
the naive script reads only baseline and merged, its rate is over those bytes. Medians over the
repetitions.

    .venv/bin/python bench/compare_speed.py [--size mlp-10m] [--updates 12] [--reps 3]
                                            [--dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

NAIVE = r"""
import sys, json, numpy as np
from pathlib import Path
from safetensors.numpy import load_file
base, merged = Path(sys.argv[1]), Path(sys.argv[2])
worst = 0.0
for folder in ("weights", "grads"):
    for file in sorted((base / folder).glob("*.safetensors")):
        a, b = load_file(file), load_file(merged / folder / file.name)
        for name in a:
            worst = max(worst, float(np.abs(a[name].astype(np.float64) - b[name]).max()))
print(worst)
"""


DEFAULT_MALLOC = (
    "import sys; from gradalign.cli import main; sys.argv[0] = 'gradalign'; sys.exit(main())"
)


def record(folder: Path, size: str, updates: int) -> None:
    import torch
    from user_loop import train

    torch.set_num_threads(1)
    if (folder / "merged" / "manifest.json").exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    train(size, folder / "baseline-fp64", k=1, updates=updates, dtype=torch.float64)
    train(size, folder / "baseline", k=1, updates=updates, reference="../baseline-fp64")
    train(size, folder / "merged", k=4, updates=updates)


@contextmanager
def runs_folder(given: Path | None, prefix: str) -> Iterator[Path]:
    """Where a benchmark keeps its runs: `given` (kept afterwards, its runs reused), or a
    temporary folder removed afterwards."""
    if given is not None:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as scratch:
        yield Path(scratch)


def files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def raw_read(paths: list[Path]) -> float:
    buffer = bytearray(4 << 20)
    view = memoryview(buffer)
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while handle.readinto(view):
                pass
    return time.perf_counter() - start


WRAP = r"""
import os, resource, subprocess, sys, time
PAGE = os.sysconf("SC_PAGE_SIZE")

def tree_rss(root):  # the resident bytes of a process and its descendants (shared pages twice)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                stack += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return total

start = time.perf_counter()
process = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
tree = 0
while process.poll() is None:
    tree = max(tree, tree_rss(process.pid))
    time.sleep(0.02)
seconds = time.perf_counter() - start
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print(seconds, process.returncode, used.ru_maxrss * 1024, used.ru_utime + used.ru_stime,
      used.ru_minflt, tree)
"""


def child(args: list[str]) -> tuple[float, int, int, float, int, int]:
    """Wall seconds, exit code, peak RSS (bytes; of its largest process), CPU seconds and page
    faults (minor) of a child and the processes it forks, and the peak of their RSS summed
    (sampled every 20 ms; pages they share count once per process: an upper bound), measured by
    a small wrapper process: a child forked from this one (which trained the runs) would count
    this process's memory in its peak RSS, since Linux keeps the peak across exec."""
    done = subprocess.run(
        [sys.executable, "-c", WRAP, *args], capture_output=True, text=True, check=True
    )
    seconds, code, peak, cpu, faults, tree = done.stdout.split()
    if int(code) not in (0, 1):
        raise SystemExit(f"{' '.join(args)} failed with exit code {code}: {done.stderr}")
    return float(seconds), int(code), int(peak), float(cpu), int(faults), int(tree)


def largest_tensor(folder: Path) -> int:
    manifest = json.loads((folder / "baseline-fp64" / "manifest.json").read_text())
    sizes = [4 * max(1, __import__("math").prod(t["shape"])) for t in manifest["tensors"]]
    return max(sizes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="mlp-10m")
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="keep the runs here (reused)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with runs_folder(args.dir, "gradalign-compare-bench-") as folder:
        record(folder, args.size, args.updates)
        everything = files(folder)
        total = sum(p.stat().st_size for p in everything)
        pair = [p for p in everything if "baseline-fp64" not in p.parts]
        pair_bytes = sum(p.stat().st_size for p in pair if p.parent.name in ("weights", "grads"))
        base, merged = folder / "baseline", folder / "merged"
        python = sys.executable
        naive = [python, "-c", NAIVE, str(base), str(merged)]
        ours = [python, "-m", "gradalign", "compare", str(base), str(merged)]
        startup = [python, "-c", "import gradalign.cli"]
        # the command line without `gradalign.__main__`, so with glibc's malloc as it comes
        default_malloc = [python, "-c", DEFAULT_MALLOC, "compare", str(base), str(merged)]
        raw_read(everything)  # warm the page cache
        kinds = ("raw", "naive", "gradalign", "verify", "default_malloc")
        times: dict[str, list[float]] = {k: [] for k in kinds}
        faults: dict[str, list[int]] = {"gradalign": [], "default_malloc": []}
        rss: list[int] = []
        tree_rss: list[int] = []
        cpu: list[float] = []
        codes = set()
        start_up = []
        for _ in range(args.reps):
            times["raw"].append(raw_read(everything))
            times["naive"].append(child(naive)[0])
            seconds, code, peak, used, faulted, tree = child(ours)
            tree_rss.append(tree)
            cpu.append(used)
            times["gradalign"].append(seconds)
            faults["gradalign"].append(faulted)
            rss.append(peak)
            codes.add(code)
            seconds, code, _, _, faulted, _ = child(default_malloc)
            times["default_malloc"].append(seconds)
            faults["default_malloc"].append(faulted)
            codes.add(code)
            times["verify"].append(child([*ours, "--verify-files"])[0])
            start_up.append(child(startup)[0])
        median = {k: statistics.median(v) for k, v in times.items()}
        largest = largest_tensor(folder)
        figures = {
            "size": args.size,
            "updates": args.updates,
            "reps": args.reps,
            "run_set_bytes": total,
            "naive_bytes": pair_bytes,
            "largest_tensor_bytes": largest,
            "seconds": median,
            "gb_per_s": {
                "raw": total / median["raw"] / 1e9,
                "naive": pair_bytes / median["naive"] / 1e9,
                "gradalign": total / median["gradalign"] / 1e9,
                "gradalign_verify_files": total / median["verify"] / 1e9,
            },
            "gradalign_share_of_raw": median["raw"] / median["gradalign"],
            "gradalign_cpu_seconds": statistics.median(cpu),
            "gradalign_gb_per_cpu_second": total / statistics.median(cpu) / 1e9,
            "peak_rss_bytes": max(rss),
            "peak_rss_over_largest_tensor": max(rss) / largest,
            "peak_rss_all_processes_bytes": max(tree_rss),
            "peak_rss_all_processes_over_largest_tensor": max(tree_rss) / largest,
            "startup_seconds": statistics.median(start_up),
            "page_faults": {k: statistics.median(v) for k, v in faults.items()},
            "default_malloc_over_gradalign": median["default_malloc"] / median["gradalign"],
            "verdict_exit_codes": sorted(codes),
            "times_s": times,
        }
    g = figures["gb_per_s"]
    print(
        f"{args.size}, {args.updates} updates: run set {total / 1e9:.2f} GB, largest tensor "
        f"{largest / 2**20:.1f} MiB, {args.reps} reps (medians)\n"
        f"raw read        {g['raw']:6.2f} GB/s  ({median['raw']:.2f} s)\n"
        f"naive script    {g['naive']:6.2f} GB/s  ({median['naive']:.2f} s, base+merged only)\n"
        f"gradalign       {g['gradalign']:6.2f} GB/s  ({median['gradalign']:.2f} s, "
        f"{figures['gradalign_share_of_raw']:.0%} of raw; "
        f"start-up {figures['startup_seconds']:.2f} s)\n"
        f"--verify-files  {g['gradalign_verify_files']:6.2f} GB/s  ({median['verify']:.2f} s)\n"
        f"default malloc  {total / median['default_malloc'] / 1e9:6.2f} GB/s  "
        f"({median['default_malloc']:.2f} s, "
        f"{figures['default_malloc_over_gradalign']:.2f}x gradalign's time; page faults "
        f"{figures['page_faults']['default_malloc']:.0f} against "
        f"{figures['page_faults']['gradalign']:.0f})\n"
        f"gradalign CPU   {figures['gradalign_cpu_seconds']:.2f} s (user + sys, all threads) = "
        f"{figures['gradalign_gb_per_cpu_second']:.2f} GB per CPU-second\n"
        f"peak RSS {max(rss) / 2**20:.0f} MiB = {figures['peak_rss_over_largest_tensor']:.1f}x the "
        f"largest tensor (its largest process); all its processes together "
        f"{max(tree_rss) / 2**20:.0f} MiB = "
        f"{figures['peak_rss_all_processes_over_largest_tensor']:.1f}x"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
