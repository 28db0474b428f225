"""Record a `transformers.Trainer` run: `attach(trainer, "runs/k4")` before `trainer.train()`.

    trainer = Trainer(model, TrainingArguments(..., gradient_accumulation_steps=4), ...)
    attach(trainer, "runs/k4")                      # the one added line
    trainer.train()

The Trainer's callbacks never see a micro-batch's inputs or loss, and `on_substep_end` misses
the last micro-batch of each window, so `attach` also wraps this trainer's `training_step`:
after each micro-batch's backward it records the loss as the Trainer computed it, turned back
into the micro-batch's summed loss and its own item count (the Trainer's `num_items_in_batch`
convention: labels other than -100, shifted for a causal LM), and a digest of its samples with
padding left out (the attention mask). The Recorder's hooks see the rest: the clipped gradient
handed to `optimizer.step()`, `clip_grad_norm_`'s norm before clipping, each step's lr. A window
closes in `on_step_end`, after the step, the scheduler and `zero_grad`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from ...errors import BadInput
from .. import checks
from ..recorder import Recorder
from . import batches
from .micro_loss import MicroLoss, record_micro

__all__ = ["GradalignCallback", "attach"]


class GradalignCallback(TrainerCallback):
    """Records the run of the Trainer it is attached to (use `attach`, which also wraps the
    trainer's `training_step`)."""

    def __init__(
        self,
        trainer: Trainer,
        out_dir: str | os.PathLike[str],
        *,
        reference: str | None = None,
        config: dict[str, Any] | None = None,
        pad: Any = batches.PAD,
    ) -> None:
        self.trainer = trainer
        self.out_dir = out_dir
        self.reference = reference
        self.extra_config = checks.config_of(config)
        self.pad = pad
        self.recorder: Recorder | None = None
        self.finished = False
        self._window_items = 0.0
        self._trainer_items: float | None = None
        self._trainer_counts: set[float] = set()  # the num_items_in_batch seen in the window
        self._micro = 0  # micro-batches in the window

    # -- the Trainer's events ----------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recorder is not None or self.finished:
            raise BadInput("gradalign records one trainer.train() per attach(); attach again")
        if args.n_gpu > 1:
            raise BadInput(
                f"gradalign records one process per GPU, this Trainer drives {args.n_gpu} GPUs "
                "from one (torch.nn.DataParallel): launch it with torchrun, one process per GPU"
            )
        model = self.trainer.model
        config = {**run_config(args, model), **self.extra_config}
        if state.global_step:  # resumed from a checkpoint: its updates are not from 0
            config["resumed_at_update"] = int(state.global_step)
        self.recorder = Recorder(
            self.out_dir,
            model,
            self.trainer.optimizer,
            accum_steps=args.gradient_accumulation_steps,
            config=config,
            reference=self.reference,
        )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recorder is None:
            return
        self._check_items(state.global_step - 1)
        self.recorder.update()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
            self.finished = True

    # -- one micro-batch, from the wrapped training_step -----------------------------------------

    def micro(self, inputs: dict[str, Any], loss: torch.Tensor, num_items: Any) -> None:
        """Record one micro-batch after its backward: `loss` is what `training_step` returned."""
        if self.recorder is None:
            return
        trainer = self.trainer
        items = _own_items(trainer, inputs)
        by_items = (
            trainer.model_accepts_loss_kwargs and num_items is not None
        ) or trainer.compute_loss_func is not None
        # how the Trainer normalized this loss: by the window's items it counted itself, or each
        # micro-batch's mean by K (the judge reads it: `token-normalization` needs the second);
        # a compute_loss of the loop's own is given num_items_in_batch, and may ignore it
        own = type(trainer).compute_loss is not Trainer.compute_loss
        self.recorder.config["loss_normalized_by"] = (
            "a compute_loss of its own"
            if own
            else "num_items_in_batch"
            if by_items
            else "micro-batch mean / K"
        )
        if not by_items:  # the loss was this micro-batch's mean, divided by the window's length
            mean = loss.detach().double() * trainer.current_gradient_accumulation_steps
            record_micro(self.recorder, MicroLoss(loss=mean, items=items), inputs, None, self.pad)
            return
        if num_items is None or items is None:
            raise BadInput("gradalign needs labels in the batch to read a compute_loss_func's loss")
        window = float(num_items)
        self._trainer_items = window
        self._trainer_counts.add(window)
        self._window_items += items
        self._micro += 1
        # the Trainer divided the summed loss by it, and times the ranks where it counted
        # the items of all of them (DistributedDataParallel averages the ranks' gradients)
        total = loss.detach().double() * window / _ranks_counted(trainer)
        record_micro(self.recorder, MicroLoss(loss_sum=total, items=items), inputs, None, self.pad)

    def abort(self) -> None:
        if self.recorder is not None:
            self.recorder.abort()
            self.recorder = None

    def _check_items(self, update: int) -> None:
        """Our items must add up to the Trainer's `num_items_in_batch`, or the losses are wrong."""
        counted, trainer_count = self._window_items, self._trainer_items
        if trainer_count is not None and _ranks_counted(self.trainer) > 1:
            counted = _all_ranks(self.trainer, counted)  # the Trainer's count is of all ranks
        counts, micro = sorted(self._trainer_counts), self._micro
        self._window_items, self._trainer_items = 0.0, None
        self._trainer_counts, self._micro = set(), 0
        if trainer_count is None or counted == trainer_count:
            return
        k = self.recorder.accum_steps if self.recorder is not None else micro
        said = f"at update {update} gradalign counted {counted:g} items in the window's {micro} "
        if micro != k or len(counts) > 1:  # the Trainer's windows are not the steps' windows
            raise BadInput(
                said + f"micro-batches, the Trainer {' and '.join(f'{n:g}' for n in counts)} "
                f"(num_items_in_batch), for windows of its own, not this window of {micro} "
                f"micro-batches where K={k}: an IterableDataset whose epoch ends inside a window "
                "carries its last micro-batches into the next one; give it a length that is a "
                "multiple of the batch of B (drop its tail), or a map-style dataset"
            )
        raise BadInput(
            said + f"micro-batches, the Trainer {trainer_count:g} (num_items_in_batch): this "
            "transformers version counts items another way; please report it"
        )


def attach(
    trainer: Trainer,
    out_dir: str | os.PathLike[str],
    *,
    reference: str | None = None,
    config: dict[str, Any] | None = None,
    pad: Any = batches.PAD,
) -> GradalignCallback:
    """Record `trainer`'s next `train()` into `out_dir` (a run directory, written on success).

    `reference`: the path of a float64 rerun of the baseline, relative to `out_dir` (e.g.
    "../k1-fp64"), for `gradalign compare` to calibrate by. `config`: extra keys for the
    manifest. `pad`: integer values left out of the sample digest besides masked positions."""
    if not isinstance(trainer, Trainer):
        raise BadInput(f"attach() needs a transformers.Trainer, got {type(trainer).__name__}")
    callback = GradalignCallback(trainer, out_dir, reference=reference, config=config, pad=pad)
    trainer.add_callback(callback)
    trainer.training_step = _recording_step(trainer.training_step, callback)
    trainer.train = _aborting_on_error(trainer.train, callback)
    return callback


def _recording_step(step: Any, callback: GradalignCallback) -> Any:
    @functools.wraps(step)
    def training_step(model: Any, inputs: Any, num_items_in_batch: Any = None, *a: Any, **kw: Any):
        loss = step(model, inputs, num_items_in_batch, *a, **kw)
        callback.micro(inputs, loss, num_items_in_batch)
        return loss

    return training_step


def _aborting_on_error(train: Any, callback: GradalignCallback) -> Any:
    """A failed `train()` leaves no run behind (and an earlier one at the path intact)."""

    @functools.wraps(train)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return train(*args, **kwargs)
        except BaseException:
            callback.abort()
            raise

    return guarded


def _ranks_counted(trainer: Trainer) -> int:
    """The ranks whose items the Trainer's `num_items_in_batch` counts (1 where it counts this
    rank's alone): its `compute_loss` multiplies the loss by them, as DistributedDataParallel
    averages the ranks' gradients (a compute_loss of the loop's own that does not is a loss
    scaled by 1/W, backpropagated and recorded alike)."""
    args = trainer.args
    if args.world_size <= 1 or not args.average_tokens_across_devices:
        return 1
    ranks = trainer.accelerator.num_processes
    config = getattr(trainer.accelerator, "parallelism_config", None)
    return ranks // config.tp_size if config is not None else ranks


def _all_ranks(trainer: Trainer, count: float) -> float:
    """`count` summed over the ranks, as the Trainer sums `num_items_in_batch`."""
    mine = torch.tensor(count, dtype=torch.float64, device=trainer.args.device)
    return float(trainer.accelerator.gather(mine).sum())


def _own_items(trainer: Trainer, inputs: Any) -> float | None:
    """This micro-batch's items as the Trainer counts `num_items_in_batch`: labels other than
    -100, over `labels[..., 1:]` when the model's loss shifts them (a causal LM). Labels kept
    under another name (`TrainingArguments(label_names=[...])`) count too: the Trainer then
    gives no `num_items_in_batch` and divides each micro-batch's mean by K, which these items
    tell apart (`token-normalization`)."""
    names = list(getattr(trainer, "label_names", None) or [])
    if isinstance(inputs, Mapping) and "labels" not in inputs and names and names[0] in inputs:
        inputs = {**inputs, "labels": inputs[names[0]]}
    if batches.labels(inputs) is None:
        return None
    shifts = getattr(trainer, "_loss_shifts_labels", None)
    if shifts is None:  # older transformers: the Trainer's own test for a causal LM
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        name = trainer.accelerator.unwrap_model(trainer.model)._get_name()
        shifts = name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
    return batches.count_items(inputs, "causal-lm" if shifts else "labels")


def run_config(args: Any, model: torch.nn.Module) -> dict[str, Any]:
    """The training settings a reference run must share (dtype, K and device may differ)."""
    first = next(model.parameters())
    return {
        "framework": "transformers",
        "accum_steps": args.gradient_accumulation_steps,
        "batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps,
        "lr": args.learning_rate,
        "optimizer": str(args.optim),
        "scheduler": str(args.lr_scheduler_type),
        "warmup_steps": args.warmup_steps,
        "weight_decay": args.weight_decay,
        "max_grad_norm": args.max_grad_norm,
        "seed": args.seed,
        "dtype": str(first.dtype).removeprefix("torch."),
    }
