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
                                       [--reps R] [--json FILE]

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
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from user_loop import SIZES

from gradalign.config import TrainConfig, build_config
from gradalign.errors import BadInput
from gradalign.record.loop import run_loop
from gradalign.record.recorder import Recorder
from gradalign.record.trainer import setup

TARGETS = {("default", "full"): 1.10, ("mlp-10m", "sketch"): 1.05}
VARIANTS = ("plain", "recorded")
FLOOR, WRITTEN = "floor", "written"  # CopyFloor's copies; WriteFloor's copies written


class NoRecorder:
    """Takes the loop's calls and does nothing with them."""

    def micro(self, loss: Any, items: Any = None, batch: Any = None) -> None:
        pass

    def grads(self, pre_clip_norm: Any = None) -> None:
        pass

    def update(self, loss_scale: Any = None) -> None:
        pass


class CopyFloor(NoRecorder):
    """Per update one copy of the weights and of the gradient into reused buffers, as the
    Recorder takes them, and nothing else: the least a recording of every update does on the
    training thread."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = list(model.parameters())
        self.buffers: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self.copied = False

    @staticmethod
    def _host(param: torch.Tensor) -> torch.Tensor:
        """A host buffer like `param` (pinned for a CUDA parameter, as the Recorder's are)."""
        return torch.empty(param.shape, dtype=param.dtype, pin_memory=param.is_cuda)

    def _take(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Buffers for one update's weights and gradient (here: the same ones every update)."""
        if self.buffers is None:
            self.buffers = (
                [self._host(p) for p in self.params],
                [self._host(p) for p in self.params],
            )
        return self.buffers

    def _copied(self, buffers: tuple[list[torch.Tensor], list[torch.Tensor]]) -> None:
        """One update's copies are complete."""

    def grads(self, pre_clip_norm: Any = None) -> None:
        self.current = self._take()
        with torch.no_grad():
            for buffer, param in zip(self.current[1], self.params, strict=True):
                if param.grad is not None:
                    buffer.copy_(param.grad, non_blocking=True)
        self.copied = True

    def update(self, loss_scale: Any = None) -> None:
        if not self.copied:  # the loop did not call grads(): the step left the gradient as is
            self.grads()
        with torch.no_grad():
            for buffer, param in zip(self.current[0], self.params, strict=True):
                buffer.copy_(param, non_blocking=True)
        self.copied = False
        self._copied(self.current)

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class WriteFloor(CopyFloor):
    """`CopyFloor`'s copies, each update's written to one file by a background thread (buffers
    from a pool, as the Recorder's): the least a recording of every update in full does. No
    header, checksum, fingerprint, loss, sample digest, lock, manifest or swap; `close()` waits
    for the last file."""

    def __init__(self, model: torch.nn.Module, folder: Path) -> None:
        super().__init__(model)
        self.folder = folder
        folder.mkdir(parents=True)
        self.pool: queue.SimpleQueue = queue.SimpleQueue()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.written = 0
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _take(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        try:
            return self.pool.get_nowait()
        except queue.Empty:
            return [self._host(p) for p in self.params], [self._host(p) for p in self.params]

    def _copied(self, buffers: tuple[list[torch.Tensor], list[torch.Tensor]]) -> None:
        landed = None
        if self.params[0].is_cuda:  # the writer waits for the asynchronous copies, not this thread
            landed = torch.cuda.Event()
            landed.record()
        self.jobs.put((self.folder / f"update_{self.written:06d}.bin", buffers, landed))
        self.written += 1

    def _write(self) -> None:
        while (job := self.jobs.get()) is not None:
            path, buffers, landed = job
            if landed is not None:
                landed.synchronize()
            with open(path, "wb") as handle:
                for tensor in (*buffers[0], *buffers[1]):
                    handle.write(memoryview(tensor.numpy()).cast("B"))
            self.pool.put(buffers)

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


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
    whole process, every thread ("VARIANT:process"), and on CUDA the peak GPU memory allocated,
    in MiB ("VARIANT:gpu")."""
    variants = (*VARIANTS, FLOOR, WRITTEN) if floor else VARIANTS
    keys = [f"{v}{part}" for v in variants for part in ("", ":thread", ":process", ":gpu")]
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
                for variant, (wall, thread, process, gpu) in timings.items():
                    times[run][variant].append(wall)
                    times[run][f"{variant}:thread"].append(thread)
                    times[run][f"{variant}:process"].append(process)
                    if gpu is not None:
                        times[run][f"{variant}:gpu"].append(gpu)
    return {run: {k: v for k, v in series.items() if v} for run, series in times.items()}


def _timed(work: Any) -> tuple[float, float, float, float | None]:
    """`work()`'s wall time (what it returns), the CPU seconds of this thread and of the whole
    process while it ran, and on CUDA the peak GPU memory it allocated (MiB; else None)."""
    gc.collect()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    thread, process = time.thread_time(), time.process_time()
    wall = work()
    gpu = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    return wall, time.thread_time() - thread, time.process_time() - process, gpu


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
                unit = {"gpu": "peak_mib", "fixed": "median_s"}.get(part, "cpu_median_s")
                out[name][f"{variant}_{part}_{unit}"] = statistics.median(series[key])
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def filesystem(path: Path) -> str:
    """The type of the filesystem holding `path`, from /proc/mounts (fsync cost depends on it)."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    target = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and target.startswith(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = TrainConfig()
    parser.add_argument("--updates", type=int, default=defaults.updates, help="updates N")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="batch B")
    parser.add_argument(
        "--accum-steps", type=int, default=defaults.accum_steps, help="K of the merged run"
    )
    parser.add_argument("--size", default="default", choices=["default", *SIZES])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to train")
    parser.add_argument("--record", default="full", choices=["full", "sketch"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per variant")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the recorded runs go (a temporary folder inside it; default: the system's "
        "temporary folder, TMPDIR)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time the copies alone (CopyFloor) and the copies written (WriteFloor)",
    )
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.dir is not None and not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: no such folder")

    torch.set_num_threads(args.threads)
    values = {"updates": args.updates, "batch_size": args.batch_size, "record": args.record}
    values["device"] = args.device
    try:
        merged = build_config({**values, "accum_steps": args.accum_steps}, "options")
    except BadInput as exc:
        parser.error(str(exc))
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
        f"scratch in {args.dir or tempfile.gettempdir()} ({fs})"
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
