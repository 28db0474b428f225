"""An `accelerator.accumulate(model)` loop recorded with gradalign: a tiny GPT-2 on token data.

    python examples/frameworks/accelerate_loop.py runs/acc --data full  # k1, k1-fp64, k4
    gradalign compare runs/acc/k1 runs/acc/k4                           # pass
    python examples/frameworks/accelerate_loop.py runs/acc-pad          # padded token data
    gradalign compare runs/acc-pad/k1 runs/acc-pad/k4                   # token-normalization
    python examples/frameworks/accelerate_loop.py runs/acc-pad --tokens # adds k4-tokens
    gradalign compare runs/acc-pad/k1 runs/acc-pad/k4-tokens            # pass

`accelerator.backward(loss)` divides each micro-batch's mean loss by K: right when every
micro-batch holds as many tokens (`--data full`), wrong on padded data. `--tokens` divides each
micro-batch's summed loss by the window's token count instead (`num_items_in_batch`, times K
since accelerate still divides by K). `--bug` trains the merged run with a known mistake.
`train(..., split="forward")` forwards each micro-batch in two chunks, `split="backward"`
backpropagates its loss in two halves: either is still one micro-step.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import tiny_data
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.state import AcceleratorState
from tiny_data import collate, processes, tiny_gpt2, token_rows
from torch.utils.data import DataLoader

from gradalign.record.integrations.accelerate import record
from gradalign.record.integrations.transformers_float64 import float64_reference

BATCH, UPDATES = 16, 6
BUGS = {
    "double-scale": "the loss divided by K before accelerator.backward, which divides again",
    "scheduler-per-batch": "a scheduler left out of accelerator.prepare, stepped every batch",
    "skip-backward": "each window's second micro-batch forwarded, never backpropagated",
}


def train(
    out: Path,
    k: int,
    *,
    padded: bool = True,
    dtype: torch.dtype = torch.float32,
    tokens: bool = False,
    bug: str | None = None,
    reference: str | None = None,
    mixed_precision: str = "no",
    device: str = "cpu",
    split: str | None = None,
    split_batches: bool = True,
    shuffle: bool = False,
    seedable: bool = False,
    samples: int = BATCH * UPDATES,
) -> Path:
    """Record one loop of UPDATES updates at batch BATCH, as K micro-batches, into `out`
    (`mixed_precision`: accelerate's, e.g. "bf16"; a float64 reference takes "no"; `device`:
    "cpu", or "cuda" for accelerate's own choice of GPU). Under torchrun each of W processes
    reads its share of every micro-batch (`split_batches`), or micro-batches of BATCH / (K x W)
    of its own (not split: accelerate then steps the scheduler W times per update). `shuffle`:
    a shuffled loader, ordered by accelerate's seedable sampler where `seedable`; `samples`: the
    data's length (one that does not fill the last batch ends in a short window)."""
    # accelerate keeps one state per process; these runs differ in mixed precision
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(
        gradient_accumulation_steps=k,
        cpu=device == "cpu",
        mixed_precision=mixed_precision,
        dataloader_config=DataLoaderConfiguration(
            split_batches=split_batches, use_seedable_sampler=seedable
        ),
    )
    rows = token_rows(samples, padded=padded)
    model = float64_reference(tiny_gpt2()) if dtype == torch.float64 else tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.5, total_iters=UPDATES)
    loader = DataLoader(
        rows,
        batch_size=BATCH // k // (1 if split_batches else processes()),
        collate_fn=collate,
        shuffle=shuffle,
    )
    counts = [int((b["labels"][:, 1:] != -100).sum()) for b in loader]  # items per micro-batch
    if bug == "scheduler-per-batch":
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    else:
        model, optimizer, loader, scheduler = accelerator.prepare(
            model, optimizer, loader, scheduler
        )
    with record(accelerator, model, optimizer, out, items="causal-lm", reference=reference) as rec:
        for step, batch in enumerate(loader):
            with accelerator.accumulate(model):
                if tokens:  # the window's items on every process (split batches)
                    window = sum(counts[step - step % k : step - step % k + k])
                    loss = model(**batch, num_items_in_batch=window).loss  # sum / window
                    mine = int((batch["labels"][:, 1:] != -100).sum())
                    rec.record_loss(loss_sum=loss * window, items=mine)
                    # accelerate divides by K, DistributedDataParallel averages the processes
                    loss = loss * k * accelerator.num_processes
                elif split == "forward":  # two chunks forwarded, their token-weighted mean
                    half = len(batch["input_ids"]) // 2
                    chunks = [{n: v[:half] for n, v in batch.items()}]
                    chunks.append({n: v[half:] for n, v in batch.items()})
                    items = [int((c["labels"][:, 1:] != -100).sum()) for c in chunks]
                    sums = [model(**c).loss * n for c, n in zip(chunks, items, strict=True)]
                    loss = sum(sums) / sum(items)
                else:
                    loss = model(**batch).loss
                if bug == "double-scale":
                    loss = loss / k
                if split == "backward":  # the loss backpropagated in two halves
                    accelerator.backward(loss / 2, retain_graph=True)
                    loss = loss / 2
                if bug != "skip-backward" or step % k != 1:
                    accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    return out


def record_all(
    root: Path,
    *,
    padded: bool = True,
    tokens: bool = False,
    bug: str | None = None,
    device: str = "cpu",
    mixed_precision: str = "no",
) -> dict[str, Path]:
    """k1 (batch 16), its float64 rerun k1-fp64, and k4 (4 x 4; -tokens, -BUG variants)."""
    return tiny_data.record_all(
        root,
        train,
        "k4" + ("-tokens" if tokens else "") + (f"-{bug}" if bug else ""),
        data={"padded": padded, "device": device, "mixed_precision": mixed_precision},
        reference={"dtype": torch.float64, "mixed_precision": "no"},
        changes={"tokens": tokens, "bug": bug},
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the runs")
    parser.add_argument("--data", choices=["padded", "full"], default="padded")
    parser.add_argument("--tokens", action="store_true", help="merged run: token-normalized")
    parser.add_argument("--bug", choices=sorted(BUGS), help="record the merged run with this bug")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--bf16", action="store_true", help="mixed_precision='bf16' (not the reference)"
    )
    ns = parser.parse_args(argv)
    runs = record_all(
        ns.out,
        padded=ns.data == "padded",
        tokens=ns.tokens,
        bug=ns.bug,
        device=ns.device,
        mixed_precision="bf16" if ns.bf16 else "no",
    )
    for name, path in runs.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
