"""A Lightning run recorded with gradalign: a tiny GRU language model on token data.

    python examples/frameworks/lightning_fit.py runs/pl --data full     # k1, k1-fp64, k4
    gradalign compare runs/pl/k1 runs/pl/k4                             # pass
    python examples/frameworks/lightning_fit.py runs/pl-pad             # padded token data
    gradalign compare runs/pl-pad/k1 runs/pl-pad/k4                     # token-normalization
    python examples/frameworks/lightning_fit.py runs/pl-pad --manual    # adds k4-manual
    gradalign compare runs/pl-pad/k1 runs/pl-pad/k4-manual              # pass

`accumulate_grad_batches=K` divides each micro-batch's mean loss by K: right when every
micro-batch holds as many tokens (`--data full`), wrong on padded data, where the window's
mean over tokens weighs micro-batches by their token counts. `--manual` trains the merged run
with manual optimization, dividing each micro-batch's summed loss by the window's tokens.
`--bug` trains the merged run with a known mistake instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import lightning as L
import tiny_data
import torch
from tiny_data import TinyGRULM, collate_pairs, processes, token_loss_sum, token_rows
from torch.utils.data import DataLoader, DistributedSampler

from gradalign.record.integrations.lightning import GradalignCallback, record_loss

BATCH, UPDATES = 16, 6
BUGS = {
    "double-scale": "training_step returns loss / K, and Lightning divides by K again",
    "scheduler-per-batch": "the lr scheduler stepped after every batch, not every update",
}


class TokenLM(L.LightningModule):
    """Next-token prediction; `manual_k`: accumulate by hand over K batches."""

    def __init__(
        self, bug: str | None = None, manual_k: int = 0, window_tokens: list[int] | None = None
    ) -> None:
        super().__init__()
        self.net = TinyGRULM()
        self.bug, self.manual_k, self.window_tokens = bug, manual_k, window_tokens or []
        self.halves = False
        self.automatic_optimization = not manual_k

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        inputs, targets = batch
        total, tokens = token_loss_sum(self.net(inputs), targets)
        if not self.manual_k:
            loss = total / tokens  # this micro-batch's mean; Lightning divides it by K
            if self.bug == "double-scale":
                loss = loss / self.trainer.accumulate_grad_batches
            return loss
        record_loss(self, loss_sum=total, items=tokens)  # gradalign: what this batch's loss is
        loss = total / self.window_tokens[batch_idx // self.manual_k]
        if self.halves:  # backpropagated in two halves: still one micro-step
            self.manual_backward(loss / 2, retain_graph=True)
            loss = loss / 2
        self.manual_backward(loss)
        if (batch_idx + 1) % self.manual_k == 0:
            optimizer, scheduler = self.optimizers(), self.lr_schedulers()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
        return None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.bug == "scheduler-per-batch":
            self.lr_schedulers().step()

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.5, total_iters=UPDATES)
        interval = "epoch" if self.bug == "scheduler-per-batch" or self.manual_k else "step"
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": interval},
        }


def train(
    out: Path,
    k: int,
    *,
    padded: bool = True,
    precision: str = "32-true",
    bug: str | None = None,
    manual: bool = False,
    reference: str | None = None,
    device: str = "cpu",
    halves: bool = False,
    sampler: bool = False,
) -> Path:
    """Record one fit of UPDATES updates at batch BATCH, as K micro-batches, into `out`
    (`halves`: manual optimization backpropagates each batch's loss in two halves). Under
    torchrun each of W processes reads micro-batches of BATCH / (K x W), in the order of the
    DistributedSampler Lightning gives it (it shuffles); `sampler`: in one process, read in
    that order too (that sampler for one replica)."""
    rows = token_rows(BATCH * UPDATES, padded=padded)
    order = DistributedSampler(rows, num_replicas=1, rank=0, seed=0) if sampler else None
    loader = DataLoader(
        rows, batch_size=BATCH // (k * processes()), collate_fn=collate_pairs, sampler=order
    )
    window_tokens = [
        int((collate_pairs(rows[i : i + BATCH])[1] != -100).sum())
        for i in range(0, len(rows), BATCH)
    ]
    module = TokenLM(bug, k if manual else 0, window_tokens)
    module.halves = halves
    recorder = GradalignCallback(  # gradalign: the one added line
        out, items="labels", reference=reference, accum_steps=k if manual else None
    )
    trainer = L.Trainer(
        max_steps=UPDATES,
        accumulate_grad_batches=1 if manual else k,
        precision=precision,
        callbacks=[recorder],
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=processes(),
        strategy="ddp" if processes() > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)
    return out


def record_all(
    root: Path,
    *,
    padded: bool = True,
    bug: str | None = None,
    manual: bool = False,
    device: str = "cpu",
    precision: str = "32-true",
) -> dict[str, Path]:
    """k1 (batch 16), its float64 rerun k1-fp64, and k4 (4 x 4; -manual, -BUG variants)."""
    return tiny_data.record_all(
        root,
        train,
        "k4" + ("-manual" if manual else "") + (f"-{bug}" if bug else ""),
        data={"padded": padded, "device": device, "precision": precision},
        reference={"precision": "64-true"},
        changes={"bug": bug, "manual": manual},
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the runs")
    parser.add_argument("--data", choices=["padded", "full"], default="padded")
    parser.add_argument("--manual", action="store_true", help="merged run: manual optimization")
    parser.add_argument("--bug", choices=sorted(BUGS), help="record the merged run with this bug")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--bf16", action="store_true", help="precision='bf16-mixed' (not the reference)"
    )
    ns = parser.parse_args(argv)
    runs = record_all(
        ns.out,
        padded=ns.data == "padded",
        bug=ns.bug,
        manual=ns.manual,
        device=ns.device,
        precision="bf16-mixed" if ns.bf16 else "32-true",
    )
    for name, path in runs.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
