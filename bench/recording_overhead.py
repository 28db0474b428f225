"""How much slower is training with the Recorder than without it?

Times the built-in training (`gradalign.record.trainer.setup` + `run_loop`, the one loop the CLI
uses) in one process, once with a no-op recorder and once with the real `Recorder` writing a run
directory to a temporary directory (timed through `close()`, which writes the series and the
manifest and renames the run into place). Both the baseline (K=1) and the merged run (K) are timed,
as a full verification trains both. The two variants alternate (plain, recorded, plain, recorded,
...) after one uncounted warm-up pair, so slow drift of a noisy machine hits both alike.

    python bench/recording_overhead.py [--updates N] [--batch-size B] [--accum-steps K]
                                       [--size default|mlp-1m|mlp-10m|mlp-50m|mlp-100m]
                                       [--record full|sketch] [--threads T] [--device cpu|cuda]
                                       [--reps R] [--malloc default|keep] [--json FILE]

`--size mlp-*` times a user's own loop instead (bench/user_loop.py: an MLP of about 1M, 10M, 54M
or 107M parameters, AdamW, recorded through the public Recorder); `--device cuda` trains on the
GPU (each timing waits for the device). `--record sketch` records with
sketches (full snapshots at the first and last update only). Torch runs on `--threads` threads
(default 1: torch's default of one thread per core made training 10x slower on a loaded 2-core
machine).

The figure of merit is median(recorded) / median(plain) over the repetitions, for both runs
together (the per-repetition sum); the targets are at most 1.10x at the default size (full
snapshots) and at most 1.05x at ~10M parameters with sketches.

`--floor` times two more variants in the same alternation: the loop with `CopyFloor`, which per
update only copies the weights and the gradient into reused buffers and writes nothing; and with
`WriteFloor`, which also writes each update's copies to a file on a background thread (no
header, checksum, fingerprint, losses, sample digests, lock, manifest or swap). Any recording of
every update that lets training go on must at least make that copy (a full snapshot writes it; a
host sketch summarizes it), and a full one must also write those bytes: the two ratios are
floors under the recorded one.

`--malloc keep` fixes glibc's mmap and trim thresholds for the process (both variants), as the
`gradalign` command does for itself: with the adaptive thresholds as they come, the 10M-parameter
loop's training thread faulted 151,000 to 477,000 pages back in a repetition of both runs,
recorded or not (docs/PERFORMANCE.md, "At `abbb816`": the heap trimmed and regrown around its
16 MiB gradients), and the variants, alternating in one process, inherit each other's heap.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_info import cpu_model, filesystem
from overhead_timing import add_loop_arguments, measure, merged_config, summarize
from user_loop import SIZES

from gradalign.allocator import keep_freed_memory

TARGETS = {("default", "full"): 1.10, ("mlp-10m", "sketch"): 1.05}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_loop_arguments(parser, reps=7)
    parser.add_argument("--size", default="default", choices=["default", *SIZES])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to train")
    parser.add_argument("--record", default="full", choices=["full", "sketch"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--malloc",
        default="default",
        choices=["default", "keep"],
        help="keep: fix glibc's mmap and trim thresholds for this process, as the gradalign "
        "command does for itself (gradalign/allocator.py), so freed memory stays for both "
        "variants' next allocations; default: glibc's adaptive thresholds as they come",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time the copies alone (CopyFloor) and the copies written (WriteFloor)",
    )
    args = parser.parse_args(argv)
    merged = merged_config(parser, args, record=args.record, device=args.device)
    if args.malloc == "keep" and not keep_freed_memory():
        parser.error("--malloc keep: this C library has no glibc mallopt")
    torch.set_num_threads(args.threads)
    configs = {"baseline": merged.replace(accum_steps=1), "merged": merged}

    with tempfile.TemporaryDirectory(prefix="gradalign-bench-", dir=args.dir) as tmp:
        scratch = Path(tmp)
        fs = filesystem(scratch)
        times = measure(configs, args.reps, scratch, args.size, args.floor)
    summary = summarize(times)
    target = TARGETS.get((args.size, args.record))

    info = {
        "updates": merged.updates,
        "batch_size": merged.batch_size,
        "accum_steps": merged.accum_steps,
        "hidden": merged.hidden,
        "size": args.size,
        "record": args.record,
        "reps": args.reps,
        "torch_threads": torch.get_num_threads(),
        "malloc": args.malloc,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "scratch_filesystem": fs,
        "scratch_dir": str(args.dir or tempfile.gettempdir()),
        "target_ratio": target,
    }
    model = f"MLP 784-{merged.hidden}-10" if args.size == "default" else f"user {args.size}"
    print(
        f"{model}, record {args.record}, B={merged.batch_size}, N={merged.updates}, "
        f"K={merged.accum_steps}; {args.reps} reps + 1 warm-up pair, alternating"
    )
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {info['cpu']}; "
        f"scratch in {args.dir or tempfile.gettempdir()} ({fs}); malloc "
        + ("thresholds fixed (--malloc keep)" if args.malloc == "keep" else "as it comes")
    )
    print()
    floor_head = (
        f"{'copies (ms)':>13}{'ratio':>8}{'written (ms)':>14}{'ratio':>8}" if args.floor else ""
    )
    print(
        f"{'run':<22}{'plain (ms)':>12}{'recorded (ms)':>15}{'ratio':>9}{'min ratio':>12}"
        + floor_head
    )
    labels = {
        "baseline": "baseline (K=1)",
        "merged": f"merged (K={merged.accum_steps})",
        "both": "both",
    }
    for name, row in summary.items():
        print(
            f"{labels[name]:<22}{row['plain_median_s'] * 1e3:>12.1f}"
            f"{row['recorded_median_s'] * 1e3:>15.1f}{row['ratio']:>8.2f}x"
            f"{row['min_ratio']:>11.2f}x"
            + (
                f"{row['floor_median_s'] * 1e3:>13.1f}{row['floor_ratio']:>7.2f}x"
                f"{row['written_median_s'] * 1e3:>14.1f}{row['written_ratio']:>7.2f}x"
                if args.floor
                else ""
            )
        )
    both = summary["both"]
    thread_plain, thread_recorded = (
        both["plain_thread_cpu_median_s"],
        both["recorded_thread_cpu_median_s"],
    )
    print(
        f"\nCPU, both runs (medians): training thread {thread_plain * 1e3:.1f} ms plain, "
        f"{thread_recorded * 1e3:.1f} ms recorded ({thread_recorded / thread_plain:.2f}x); "
        f"all threads recorded {both['recorded_process_cpu_median_s'] * 1e3:.1f} ms "
        f"({both['recorded_process_cpu_median_s'] / thread_plain:.2f}x)"
    )
    if "recorded_faults_median" in both:
        print(
            f"Page faults of the training thread, both runs (medians): "
            f"{both['plain_faults_median']:,.0f} plain, {both['recorded_faults_median']:,.0f} "
            "recorded"
        )
    if "recorded_fixed_median_s" in both:
        fixed = both["recorded_fixed_median_s"]
        print(
            f"Recorder(...) and close(), both runs (medians): {fixed * 1e3:.1f} ms, "
            f"{fixed / both['plain_median_s']:.2f}x of plain: a run's start and finish, "
            "paid once whatever its length"
        )
    if "recorded_gpu_peak_mib" in both:
        plain_gpu, recorded_gpu = both["plain_gpu_peak_mib"], both["recorded_gpu_peak_mib"]
        print(
            f"GPU memory, peak allocated (medians): {plain_gpu:.0f} MiB plain, "
            f"{recorded_gpu:.0f} MiB recorded (+{recorded_gpu - plain_gpu:.0f} MiB)"
        )
    ratio = summary["both"]["ratio"]
    met = None if target is None else ratio <= target
    verdict = "no target" if target is None else f"target <= {target:.2f}x (both runs, medians): "
    print(
        f"\nmedians over {args.reps} reps (min ratio: fastest recorded / fastest plain); "
        f"{verdict}{'' if met is None else 'met' if met else 'NOT met'}"
    )

    if args.json is not None:
        figures = {
            "info": info,
            "summary": summary,
            "times_s": times,
            "target_met": met,
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
