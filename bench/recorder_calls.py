"""Where the Recorder's time on the training thread goes, call by call.

Records the built-in default-size training as bench/recording_overhead.py does (the baseline,
K=1, and the merged run, K, one after the other, through `close()`) and times each of the
Recorder's calls on the training thread: `Recorder(...)`, `micro()` and, inside it, the
micro-batch's sample digest (`checks.digest_of`), `grads()`, `update()` and `close()`. Each
figure is the call's total over both runs, in thread CPU milliseconds (`time.thread_time`; wall
milliseconds beside it), the median over the repetitions after one warm-up pair. What no call
holds (the background writer slowing the training thread's own work) is not here:
bench/recording_overhead.py times the whole.

    python bench/recorder_calls.py [--reps R] [--dir DIR] [--updates N] [--accum-steps K]
                                   [--batch-size B] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead_timing import add_loop_arguments, merged_config, time_recorded

from gradalign.config import TrainConfig
from gradalign.record import checks, recorder

CALLS = ("Recorder(...)", "micro()", "  of which the digest", "grads()", "update()", "close()")
_TIMED = {  # the call's label: where it is looked up
    "Recorder(...)": (recorder.Recorder, "__init__"),
    "micro()": (recorder.Recorder, "micro"),
    "  of which the digest": (checks, "digest_of"),
    "grads()": (recorder.Recorder, "grads"),
    "update()": (recorder.Recorder, "update"),
    "close()": (recorder.Recorder, "close"),
}


def timed_calls(totals: dict[str, list[float]]) -> Callable[[], None]:
    """Wrap each call of `_TIMED` to add its wall and thread CPU seconds to `totals[label]`
    ([wall, cpu]); returns the function that puts the originals back."""
    originals = []
    for label, (owner, name) in _TIMED.items():
        original = getattr(owner, name)
        originals.append((owner, name, original))

        def wrapper(*args: Any, _f: Any = original, _label: str = label, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return _f(*args, **kwargs)
            finally:
                totals[_label][0] += time.perf_counter() - wall
                totals[_label][1] += time.thread_time() - cpu

        setattr(owner, name, wrapper)

    def restore() -> None:
        for owner, name, original in originals:
            setattr(owner, name, original)

    return restore


def measure(configs: list[TrainConfig], reps: int, scratch: Path) -> dict[str, list[list[float]]]:
    """Per call, one [wall, cpu] pair per repetition: its totals over the runs of `configs`."""
    found: dict[str, list[list[float]]] = {label: [] for label in CALLS}
    for rep in range(-1, reps):  # rep -1 warms up
        totals = {label: [0.0, 0.0] for label in CALLS}
        restore = timed_calls(totals)
        try:
            for index, config in enumerate(configs):
                out = scratch / f"run-{rep}-{index}"
                time_recorded(config, out)
                shutil.rmtree(out)
        finally:
            restore()
        if rep >= 0:
            for label in CALLS:
                found[label].append(totals[label])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_loop_arguments(parser, reps=9)
    args = parser.parse_args(argv)
    merged = merged_config(parser, args)
    torch.set_num_threads(1)
    configs = [merged.replace(accum_steps=1), merged]
    with tempfile.TemporaryDirectory(prefix="gradalign-calls-", dir=args.dir) as tmp:
        found = measure(configs, args.reps, Path(tmp))
    print(
        f"MLP 784-{merged.hidden}-10, B={merged.batch_size}, N={merged.updates}, K=1 and "
        f"K={merged.accum_steps}; torch 1 thread; {args.reps} reps + 1 warm-up"
    )
    found["all calls"] = [
        [sum(found[label][rep][part] for label in CALLS if label[0] != " ") for part in (0, 1)]
        for rep in range(args.reps)
    ]
    medians = {
        label.strip(): {
            "cpu_ms": statistics.median(c for _, c in pairs) * 1e3,
            "wall_ms": statistics.median(w for w, _ in pairs) * 1e3,
        }
        for label, pairs in found.items()
    }
    print(f"{'call (both runs)':<24}{'CPU ms':>9}{'wall ms':>10}")
    for label in found:
        row = medians[label.strip()]
        print(f"{label:<24}{row['cpu_ms']:>9.2f}{row['wall_ms']:>10.2f}")
    if args.json is not None:
        info = {"updates": merged.updates, "batch_size": merged.batch_size, "reps": args.reps}
        figures = {"info": {**info, "accum_steps": merged.accum_steps}, "medians": medians}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
