"""A compiled loop recorded and judged: does recording add a compile, and are its verdicts right?

A LayerNorm MLP under AdamW, compiled by torch.compile (default backend: inductor), in float32
and under bfloat16 CPU autocast: the baseline (K=1, with its float64 reference), a clean merged
run (K=4) and one whose loss is not divided by K. Prints each run's compiled graphs (dynamo's
count: 1 is one compile) and the verdicts with and without the reference; exit 0 when every run
compiled once, the clean runs pass and the bug fails as `loss-scale`.

    .venv/bin/python bench/compiled_loop.py [--backend inductor|eager]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch._dynamo.utils import counters

import gradalign
from gradalign import api

UPDATES, BATCH = 6, 32


def record(out: Path, k: int, backend: str, dtype=torch.float32, bf16=False, bug=False, ref=None):
    """One run; returns dynamo's count of the graphs it compiled."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 4))
    model = model.to(dtype)
    net = torch.compile(model, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * BATCH, 16, generator=g).to(dtype)
    y = torch.randint(0, 4, (UPDATES * BATCH,), generator=g)
    autocast = bf16 and dtype == torch.float32
    with gradalign.Recorder(out, net, opt, accum_steps=k, reference=ref) as rec:
        for update in range(UPDATES):
            for j in range(k):
                rows = slice(update * BATCH + j * BATCH // k, update * BATCH + (j + 1) * BATCH // k)
                with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                    logits = net(x[rows])
                loss = nn.functional.cross_entropy(logits.float(), y[rows])
                (loss if bug else loss / k).backward()
                rec.micro(loss, batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()
    return counters["stats"]["unique_graphs"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for bf16 in (False, True):
            root, what = Path(tmp) / str(bf16), "bfloat16 autocast" if bf16 else "float32"
            graphs = [
                record(root / "ref", 1, args.backend, torch.float64),
                record(root / "base", 1, args.backend, bf16=bf16, ref="../ref"),
                record(root / "k4", 4, args.backend, bf16=bf16),
                record(root / "bug", 4, args.backend, bf16=bf16, bug=True),
            ]
            ok &= graphs == [1, 1, 1, 1]
            print(f"{what}: graphs compiled per run (reference, baseline, K=4, bug): {graphs}")
            for reference in (None, "none"):
                clean = api.compare(root / "base", root / "k4", reference=reference)
                bug = api.compare(root / "base", root / "bug", reference=reference)
                code = bug.diagnosis[0].code if bug.diagnosis else None
                ok &= clean.verdict == "pass" and bug.verdict == "fail" and code == "loss-scale"
                said = "with the reference" if reference is None else "--reference none"
                print(f"  {said}: clean {clean.verdict}, bug {bug.verdict} ({code})")
    print("every run compiled once and judged as expected" if ok else "NOT as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
