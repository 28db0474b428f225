"""The three framework examples on several processes, against their one-process baselines.

    python examples/frameworks/on_ranks.py runs/ranks    # one process: the baselines (K=1)
    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        examples/frameworks/on_ranks.py runs/ranks       # W processes: the merged runs

In one process it records each framework's baseline (batch 16, K=1) and its float64 rerun.
Under torchrun (W processes, gloo on the CPU) it records the merged runs, W x K micro-batches
of 16 / (W x K) per update, all in one launch: for each framework a clean run and the mistake
that framework makes easy on several processes. The runs go to OUT/acc, OUT/acc-pad,
OUT/acc-shuffled, OUT/acc-tail, OUT/hf, OUT/hf-tail and OUT/pl, each merged run named
`wWkK[-VARIANT]`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import accelerate_loop
import lightning_fit
import torch
import transformers_trainer
from tiny_data import processes

K = 2
# data that ends inside the last batch of B (a window of 10 rows there)
TAIL = {"padded": False, "samples": accelerate_loop.BATCH * accelerate_loop.UPDATES - 6}


def baselines(out: Path) -> None:
    """Each framework's baseline and float64 rerun; Lightning's also in the loader's own order."""
    for name, padded in (("acc", False), ("acc-pad", True)):
        accelerate_loop.train(out / name / "k1-fp64", 1, padded=padded, dtype=torch.float64)
        accelerate_loop.train(out / name / "k1", 1, padded=padded, reference="../k1-fp64")
    for name, seedable in (("k1", False), ("k1-seedable", True)):  # shuffled loaders
        shuffled = {"padded": False, "shuffle": True, "seedable": seedable}
        fp64 = f"{name}-fp64"
        accelerate_loop.train(out / "acc-shuffled" / fp64, 1, dtype=torch.float64, **shuffled)
        accelerate_loop.train(out / "acc-shuffled" / name, 1, reference=f"../{fp64}", **shuffled)
    accelerate_loop.train(out / "acc-tail" / "k1-fp64", 1, dtype=torch.float64, **TAIL)
    accelerate_loop.train(out / "acc-tail" / "k1", 1, reference="../k1-fp64", **TAIL)
    transformers_trainer.train(out / "hf" / "k1-fp64", 1, dtype=torch.float64)
    transformers_trainer.train(out / "hf" / "k1", 1, reference="../k1-fp64")
    short = {"samples": TAIL["samples"]}
    transformers_trainer.train(out / "hf-tail" / "k1-fp64", 1, dtype=torch.float64, **short)
    transformers_trainer.train(out / "hf-tail" / "k1", 1, reference="../k1-fp64", **short)
    pl = out / "pl"
    lightning_fit.train(pl / "k1-fp64", 1, padded=False, precision="64-true", sampler=True)
    lightning_fit.train(pl / "k1", 1, padded=False, reference="../k1-fp64", sampler=True)
    lightning_fit.train(pl / "k1-sequential", 1, padded=False)  # the loader's own order


def merged(out: Path) -> None:
    """The merged runs of every framework, on this launch's W processes."""
    w = processes()
    name = f"w{w}k{K}"
    accelerate_loop.train(out / "acc" / name, K, padded=False)
    # micro-batches of their own on each process: accelerate steps the scheduler W times,
    # which at W = K is also the pace of a scheduler stepped once per micro-step
    for k in (K, 4):
        accelerate_loop.train(
            out / "acc" / f"w{w}k{k}-unsplit", k, padded=False, split_batches=False
        )
    accelerate_loop.train(out / "acc-pad" / name, K)  # each micro-batch's mean, divided by K
    accelerate_loop.train(out / "acc-pad" / f"{name}-tokens", K, tokens=True)
    for suffix, seedable in (("", False), ("-seedable", True)):  # one process orders otherwise
        shuffled = {"padded": False, "shuffle": True, "seedable": seedable}
        accelerate_loop.train(out / "acc-shuffled" / f"{name}{suffix}", K, **shuffled)
    # accelerate fills the last batch of every process with rows from the data's start
    accelerate_loop.train(out / "acc-tail" / name, K, **TAIL)
    transformers_trainer.train(out / "hf" / name, K)
    transformers_trainer.train(out / "hf" / f"{name}-local-tokens", K, local_tokens=True)
    transformers_trainer.train(out / "hf-tail" / name, K, samples=TAIL["samples"])
    lightning_fit.train(out / "pl" / name, K, padded=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the runs")
    ns = parser.parse_args(argv)
    (merged if processes() > 1 else baselines)(ns.out)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # the frameworks leave their process group open: gloo's threads, still holding work at
        # the interpreter's exit, aborted a launch once after every run was written
        # ("terminate called without an active exception", exit -6; pytorch issue 190489)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    if processes() > 1:
        # even after a clean destroy gloo can abort the interpreter's teardown (exit -6, twice in
        # a row once in the suite here); every run is written and closed by now
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
