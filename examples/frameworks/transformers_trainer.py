"""A transformers Trainer run recorded with gradalign: a tiny GPT-2 on padded token data.

    python examples/frameworks/transformers_trainer.py runs/hf          # k1, k1-fp64, k4
    gradalign compare runs/hf/k1 runs/hf/k4                             # pass
    python examples/frameworks/transformers_trainer.py runs/hf --bug token-mean
    gradalign compare runs/hf/k1 runs/hf/k4-token-mean                  # token-normalization

The baseline (batch 16, K=1), its float64 rerun (the noise floor) and the merged run (4
micro-batches of 4, `gradient_accumulation_steps=4`) differ only in those settings; gradalign's
part is the `attach(...)` line. `--bug` trains the merged run with a known mistake instead.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import tiny_data
import torch
from tiny_data import collate, processes, tiny_gpt2, tiny_llama, token_rows
from transformers import Trainer, TrainerCallback, TrainingArguments

from gradalign.record.integrations.transformers import attach
from gradalign.record.integrations.transformers_float64 import float64_reference

BATCH, UPDATES = 16, 6
MODELS = {"gpt2": tiny_gpt2, "llama": tiny_llama}
BUGS = {
    "token-mean": "the pre-2024 Trainer: each micro-batch's mean loss divided by K",
    "double-scale": "compute_loss divides by K, and the Trainer divides again",
    "scheduler-per-batch": "the lr scheduler stepped after every micro-batch",
}


class DividesByK(Trainer):
    """A loss 'scaled for accumulation' by hand, on top of the Trainer's own scaling."""

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kw: Any) -> Any:
        loss = super().compute_loss(model, inputs, return_outputs, **kw)
        return loss / self.args.gradient_accumulation_steps


class SchedulerPerBatch(TrainerCallback):
    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        kwargs["lr_scheduler"].step()


def train(
    out: Path,
    k: int,
    *,
    dtype: torch.dtype = torch.float32,
    bug: str | None = None,
    reference: str | None = None,
    model: str = "gpt2",
    device: str = "cpu",
    bf16: bool = False,
    local_tokens: bool = False,
    samples: int = BATCH * UPDATES,
) -> Path:
    """Record one Trainer run of UPDATES updates at batch BATCH, as K micro-batches, into out
    (`device`: "cpu", or "cuda" for the Trainer's own choice of GPU; `bf16`: mixed precision).
    Under torchrun each of W processes reads micro-batches of BATCH / (K x W); `local_tokens`:
    each counts num_items_in_batch over its own micro-batches alone; `samples`: the data's
    length (one that does not fill the last batch ends in a short window)."""
    build = MODELS[model]
    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(
            output_dir=scratch,
            per_device_train_batch_size=BATCH // (k * processes()),
            gradient_accumulation_steps=k,
            max_steps=UPDATES,
            learning_rate=1e-2,
            lr_scheduler_type="linear",
            warmup_steps=2,
            seed=0,
            use_cpu=device == "cpu",
            bf16=bf16,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            ddp_backend="gloo" if device == "cpu" and processes() > 1 else None,
            average_tokens_across_devices=not local_tokens,
        )
        trainer = (DividesByK if bug == "double-scale" else Trainer)(
            model=float64_reference(build()) if dtype == torch.float64 else build(),
            args=args,
            train_dataset=token_rows(samples),
            data_collator=collate,
            callbacks=[SchedulerPerBatch()] if bug == "scheduler-per-batch" else None,
        )
        if bug == "token-mean":
            trainer.model_accepts_loss_kwargs = False  # no num_items_in_batch: mean / K
        attach(trainer, out, reference=reference)  # gradalign: the one added line
        trainer.train()
    return out


def record_all(
    root: Path,
    bug: str | None = None,
    *,
    model: str = "gpt2",
    device: str = "cpu",
    bf16: bool = False,
) -> dict[str, Path]:
    """k1 (batch 16), its float64 rerun k1-fp64, and k4 (4 x 4; `k4-BUG` with a bug)."""
    return tiny_data.record_all(
        root,
        train,
        "k4" + (f"-{bug}" if bug else ""),
        data={"model": model, "device": device, "bf16": bf16},
        reference={"dtype": torch.float64, "bf16": False},
        changes={"bug": bug},
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the runs")
    parser.add_argument("--bug", choices=sorted(BUGS), help="record the merged run with this bug")
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--bf16", action="store_true", help="bf16 mixed precision (not the reference)"
    )
    ns = parser.parse_args(argv)
    runs = record_all(ns.out, ns.bug, model=ns.model, device=ns.device, bf16=ns.bf16)
    for name, path in runs.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
