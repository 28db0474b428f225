"""The timings of bench/recording_overhead.py: the training loop plain, recorded, or with a
floor's stand-in (`time_plain`, `time_recorded`), alternated over repetitions with the CPU
seconds and peak GPU memory beside each wall time (`measure`), and their medians and ratios
(`summarize`)."""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from stand_in_recorders import CopyFloor, NoRecorder, WriteFloor

from gradalign.config import TrainConfig, build_config
from gradalign.errors import BadInput
from gradalign.record.loop import run_loop
from gradalign.record.recorder import Recorder
from gradalign.record.trainer import setup

VARIANTS = ("plain", "recorded")
FLOOR, WRITTEN = "floor", "written"  # CopyFloor's copies; WriteFloor's copies written


def time_plain(config: TrainConfig, size: str = "default", floor: str | None = None) -> float:
    """The loop without recording; with a floor's stand-in: "copies" for `CopyFloor`, a path
    for `WriteFloor` (its files are written there)."""
    start = time.perf_counter()
    stand_in = _stand_in(floor)
    if size != "default":
        from user_loop import train

        k, batch, updates = config.accum_steps, config.batch_size, config.updates
        train(
            size, None, k=k, batch=batch, updates=updates, device=config.device, stand_in=stand_in
        )
        return time.perf_counter() - start
    training = setup(config)
    rec = NoRecorder() if stand_in is None else stand_in(training.model)
    run_loop(training, rec)  # type: ignore[arg-type]
    if stand_in is not None:
        rec.close()
    _finish(config)
    return time.perf_counter() - start


def _stand_in(floor: str | None) -> Any:
    if floor is None:
        return None
    if floor == "copies":
        return CopyFloor
    return lambda model: WriteFloor(model, Path(floor))


def time_recorded(
    config: TrainConfig, out: Path, size: str = "default", fixed: list[float] | None = None
) -> float:
    """The recorded loop, through close(); `config.record` says full or sketch. At the default
    size, `fixed` gets the seconds spent in `Recorder(...)` and `close()` (a run's start and
    finish, paid once per run whatever its length)."""
    start = time.perf_counter()
    modes = {"record": config.record, "updates": config.updates}
    if size != "default":
        from user_loop import train

        k, batch, updates = config.accum_steps, config.batch_size, config.updates
        mode = {"record": config.record, "device": config.device}
        train(size, out, k=k, batch=batch, updates=updates, **mode)
        return time.perf_counter() - start
    training = setup(config)
    opened = time.perf_counter()
    rec = Recorder(
        out, training.model, training.optimizer, config.accum_steps, config.to_dict(), **modes
    )
    looping = time.perf_counter()
    run_loop(training, rec)
    closing = time.perf_counter()
    rec.close()
    _finish(config)
    end = time.perf_counter()
    if fixed is not None:
        fixed.append(looping - opened + end - closing)
    return end - start


def _finish(config: TrainConfig) -> None:
    """On CUDA, wait for the device: a timing stops when the work is done, not queued."""
    if config.device == "cuda":
        torch.cuda.synchronize()


def measure(
    configs: dict[str, TrainConfig],
    reps: int,
    scratch: Path,
    size: str = "default",
    floor: bool = False,
) -> dict[str, Any]:
    """Per run ("baseline", "merged") and variant: `reps` timings in seconds, warm-up excluded;
    beside each wall time, the CPU seconds of the training thread ("VARIANT:thread") and of the
    whole process, every thread ("VARIANT:process"), on CUDA the peak GPU memory allocated, in
    MiB ("VARIANT:gpu"), and on Linux the training thread's minor page faults
    ("VARIANT:faults")."""
    variants = (*VARIANTS, FLOOR, WRITTEN) if floor else VARIANTS
    parts = ("", ":thread", ":process", ":gpu", ":faults")
    keys = [f"{v}{part}" for v in variants for part in parts]
    keys.append("recorded:fixed")
    times: dict[str, dict[str, list[float]]] = {run: {k: [] for k in keys} for run in configs}
    counter = 0
    for rep in range(-1, reps):  # rep -1 is the warm-up pair
        for run, config in configs.items():
            out = scratch / f"run-{counter}"
            counter += 1
            timings = {"plain": _timed(lambda c=config: time_plain(c, size))}
            fixed: list[float] = []
            timings["recorded"] = _timed(
                lambda c=config, o=out, f=fixed: time_recorded(c, o, size, f)
            )
            if rep >= 0 and fixed:
                times[run]["recorded:fixed"].append(fixed[0])
            shutil.rmtree(out)  # outside the timing
            if floor:
                timings[FLOOR] = _timed(lambda c=config: time_plain(c, size, "copies"))
                timings[WRITTEN] = _timed(lambda c=config, o=out: time_plain(c, size, str(o)))
                shutil.rmtree(out)
            if rep >= 0:
                for variant, (wall, thread, process, gpu, faults) in timings.items():
                    times[run][variant].append(wall)
                    times[run][f"{variant}:thread"].append(thread)
                    times[run][f"{variant}:process"].append(process)
                    if gpu is not None:
                        times[run][f"{variant}:gpu"].append(gpu)
                    if faults is not None:
                        times[run][f"{variant}:faults"].append(faults)
    return {run: {k: v for k, v in series.items() if v} for run, series in times.items()}


def _timed(work: Any) -> tuple[float, float, float, float | None, int | None]:
    """`work()`'s wall time (what it returns), the CPU seconds of this thread and of the whole
    process while it ran, on CUDA the peak GPU memory it allocated (MiB; else None), and the
    minor page faults this thread took (None where the system does not count them per thread)."""
    gc.collect()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    faults = _thread_faults()
    thread, process = time.thread_time(), time.process_time()
    wall = work()
    spent = time.thread_time() - thread, time.process_time() - process
    gpu = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    after = _thread_faults()
    return wall, *spent, gpu, None if faults is None or after is None else after - faults


def _thread_faults() -> int | None:
    """This thread's minor page faults so far (Linux), else None."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    except (ImportError, AttributeError, OSError):
        return None


def summarize(times: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Medians and ratio per run, and for both runs together (per repetition, summed)."""
    runs = list(times)
    reps = len(times[runs[0]]["plain"])
    rows = {run: times[run] for run in runs}
    variants = list(times[runs[0]])
    pick = lambda v: max if v.endswith(":gpu") else sum  # noqa: E731 (a peak is not a sum)
    rows["both"] = {
        v: [pick(v)(times[run][v][i] for run in runs) for i in range(reps)] for v in variants
    }
    out: dict[str, dict[str, float]] = {}
    for name, series in rows.items():
        plain = statistics.median(series["plain"])
        recorded = statistics.median(series["recorded"])
        out[name] = {
            "plain_median_s": plain,
            "recorded_median_s": recorded,
            "plain_min_s": min(series["plain"]),
            "recorded_min_s": min(series["recorded"]),
            "ratio": recorded / plain,
            "min_ratio": min(series["recorded"]) / min(series["plain"]),
        }
        for variant in (FLOOR, WRITTEN):
            if variant in series:
                out[name][f"{variant}_median_s"] = statistics.median(series[variant])
                out[name][f"{variant}_ratio"] = statistics.median(series[variant]) / plain
        for key in series:
            if ":" in key:
                variant, part = key.split(":")
                units = {"gpu": "peak_mib", "fixed": "median_s", "faults": "median"}
                unit = units.get(part, "cpu_median_s")
                out[name][f"{variant}_{part}_{unit}"] = statistics.median(series[key])
    return out


def add_loop_arguments(parser: argparse.ArgumentParser, reps: int) -> None:
    """The recording benchmarks' shared options: the loop's shape (`--updates`, `--batch-size`,
    `--accum-steps`), `--reps` (default `reps`), `--json` and `--dir`."""
    defaults = TrainConfig()
    parser.add_argument("--updates", type=int, default=defaults.updates, help="updates N")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="batch B")
    parser.add_argument(
        "--accum-steps", type=int, default=defaults.accum_steps, help="K of the merged run"
    )
    parser.add_argument("--reps", type=int, default=reps, help="timed repetitions")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the recorded runs go (a temporary folder inside it; default: the system's "
        "temporary folder, TMPDIR)",
    )


def merged_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace, **fields: Any
) -> TrainConfig:
    """The merged run's config from `add_loop_arguments`' options and `fields` (more of its
    fields), once `--reps` and `--dir` are checked; the parser's one-line error otherwise."""
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.dir is not None and not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: no such folder")
    values = {"updates": args.updates, "batch_size": args.batch_size, **fields}
    try:
        return build_config({**values, "accum_steps": args.accum_steps}, "options")
    except BadInput as exc:
        parser.error(str(exc))
