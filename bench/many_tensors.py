"""How does `gradalign compare` grow with the number of tensors?

A model of N small parameter tensors (a ParameterList of N x E elements feeding one linear head,
Adam, B=16, K=4) is recorded through `gradalign.Recorder` for each N given: a baseline (K=1)
with its float64 reference and a merged run. Then, interleaved in each repetition, `gradalign
compare BASE MERGED` runs in a fresh process for every N, with its CPU seconds (user and system,
all threads) from a small wrapper process. Per tensor and update is (median wall − median
start-up) / (N × updates); the growth is that figure at the largest N over the smallest
(1.0: linear in the tensors).

    .venv/bin/python bench/many_tensors.py [--tensors 100 400 1600] [--elements 64]
                                           [--updates 4] [--reps 5] [--reference-none]
                                           [--dir DIR] [--json FILE]

`--reference-none` judges by the fixed tolerances (`compare --reference none`), the path where
the drift of noise-dominated elements is kept for most tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_speed import child, runs_folder

B, K = 16, 4


def train(out: Path, n: int, elements: int, updates: int, k: int, **recorder) -> None:
    """N tensors of `elements` each, recorded for `updates` updates at K=k."""
    import torch
    from torch import nn

    import gradalign

    torch.set_num_threads(1)
    dtype = recorder.pop("dtype", torch.float32)
    torch.manual_seed(0)

    class Many(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.parts = nn.ParameterList(nn.Parameter(torch.randn(elements)) for _ in range(n))
            self.head = nn.Linear(elements, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mixed = torch.stack(list(self.parts)).mean(0)
            return self.head(torch.tanh(x * mixed))

    model = Many().to(dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(updates * B, elements, generator=g).to(dtype)
    y = torch.randint(0, 2, (updates * B,), generator=g)
    rows = B // k
    with gradalign.Recorder(out, model, opt, accum_steps=k, **recorder) as rec:
        for update in range(updates):
            for micro in range(k):
                take = slice(update * B + micro * rows, update * B + (micro + 1) * rows)
                loss = nn.functional.cross_entropy(model(x[take]), y[take])
                (loss / k).backward()
                rec.micro(loss.detach(), batch=(x[take], y[take]))
            opt.step()
            rec.update()
            opt.zero_grad()


def record(folder: Path, n: int, elements: int, updates: int) -> None:
    import torch

    if (folder / "merged" / "manifest.json").exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    train(folder / "baseline-fp64", n, elements, updates, 1, dtype=torch.float64)
    train(folder / "baseline", n, elements, updates, 1, reference="../baseline-fp64")
    train(folder / "merged", n, elements, updates, K)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, nargs="+", default=[100, 400, 1600])
    parser.add_argument("--elements", type=int, default=64)
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--reference-none", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="keep the runs here (reused)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sizes = sorted(set(args.tensors))
    with runs_folder(args.dir, "gradalign-many-tensors-") as root:
        for n in sizes:
            record(root / f"n{n}", n, args.elements, args.updates)
        python = sys.executable
        startup = [python, "-c", "import gradalign.cli"]
        wall: dict[int, list[float]] = {n: [] for n in sizes}
        cpu: dict[int, list[float]] = {n: [] for n in sizes}
        codes: dict[int, set[int]] = {n: set() for n in sizes}
        start_up: list[float] = []
        for _ in range(args.reps):
            start_up.append(child(startup)[0])
            for n in sizes:
                folder = root / f"n{n}"
                ours = [python, "-m", "gradalign", "compare"]
                ours += ["--reference", "none"] if args.reference_none else []
                seconds, code, _, used, _, _ = child(
                    [*ours, str(folder / "baseline"), str(folder / "merged")]
                )
                wall[n].append(seconds)
                cpu[n].append(used)
                codes[n].add(code)
    base = statistics.median(start_up)
    rows = {}
    for n in sizes:
        seconds = statistics.median(wall[n])
        rows[n] = {
            "seconds": seconds,
            "cpu_seconds": statistics.median(cpu[n]),
            "ms_per_tensor_update": 1e3 * (seconds - base) / (n * args.updates),
            "exit_codes": sorted(codes[n]),
        }
    growth = rows[sizes[-1]]["ms_per_tensor_update"] / rows[sizes[0]]["ms_per_tensor_update"]
    print(
        f"{args.elements} elements a tensor, {args.updates} updates, "
        f"{'no reference' if args.reference_none else 'reference included'}, "
        f"{args.reps} reps (medians); start-up {base:.2f} s"
    )
    for n, row in rows.items():
        print(
            f"N={n:5d}: {row['seconds']:6.2f} s, CPU {row['cpu_seconds']:6.2f} s, "
            f"{row['ms_per_tensor_update']:.3f} ms per tensor and update, exit {row['exit_codes']}"
        )
    print(f"per tensor and update at N={sizes[-1]} over N={sizes[0]}: {growth:.2f}x")
    if args.json is not None:
        figures = {
            "elements": args.elements,
            "updates": args.updates,
            "reps": args.reps,
            "reference": not args.reference_none,
            "startup_seconds": base,
            "rows": {str(n): row for n, row in rows.items()},
            "growth": growth,
            "times_s": {str(n): wall[n] for n in sizes},
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if all(row["exit_codes"] == [0] for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
