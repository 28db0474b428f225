"""How much memory does sketch mode's device summary take beside the tensor it summarizes?

Summarizes one float32 tensor wider than a block (`Sketcher._on_device`, the path a recording
takes on CUDA) and reports the peak of the memory it allocated on the way, per element of the
tensor: on CUDA from torch's peak-allocated counter, on the CPU from the profiler's allocation
records. The tensor, the signs table and the results are excluded (made before the peak is reset).

    .venv/bin/python bench/sketch_memory.py [--device cpu|cuda] [--elements N] [--json FILE]

`--block N` sets the summary's and the fingerprint's block (elements) to N, so a small tensor
shows whether the peak follows the block or the tensor (tests/test_bench.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gradalign.record import facts, sketcher
from gradalign.record.sketcher import Sketcher
from gradalign.runs.sketches import WIDTH


def peak_on_cuda(summary: Sketcher, x: torch.Tensor) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = summary._on_device(x, False)
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated() - before


def peak_on_cpu(summary: Sketcher, x: torch.Tensor) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        summary._on_device(x, False)
    records = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    now = peak = 0
    for event in sorted(records, key=lambda e: e.start_ns()):
        now += event.nbytes()
        peak = max(peak, now)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--elements", type=int, default=1 << 25, help="the tensor's size")
    parser.add_argument("--block", type=int, help="elements per block (default: gradalign's)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.block:
        sketcher._BLOCK = facts._FINGERPRINT_BLOCK = args.block
    x = torch.randn(args.elements, device=args.device)
    summary = Sketcher(None, [], {}, WIDTH)  # type: ignore[arg-type]
    summary._on_device(x, False)  # the signs table, kept per size, is made here
    measure = peak_on_cuda if args.device == "cuda" else peak_on_cpu
    peak = measure(summary, x)
    if args.json:
        figures = {"elements": args.elements, "device": args.device, "peak_bytes": peak}
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    print(
        f"{args.elements} float32 elements on {args.device}: the summary's peak allocation "
        f"{peak / 2**20:.1f} MiB, {peak / args.elements:.2f} bytes per element"
    )


if __name__ == "__main__":
    main()
