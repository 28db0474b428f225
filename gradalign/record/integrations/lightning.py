"""Record a Lightning run: add `GradalignCallback("runs/k4")` to the Trainer's callbacks.

    trainer = L.Trainer(accumulate_grad_batches=4, callbacks=[GradalignCallback("runs/k4")])

Automatic optimization: the loss Lightning backpropagates is `training_step`'s loss divided by
`accumulate_grad_batches`, so the micro-batch's own loss is that times K. Manual optimization
(no `accumulate_grad_batches`): say K, `GradalignCallback(out, accum_steps=4)`, and the loss
given to `manual_backward` is read the same way (Lightning's documented `loss / N`, N being K or,
in an epoch's short last window, the batches left). A loop that
normalizes otherwise (by the window's token count) states each micro-batch's loss with
`record_loss(self, loss_sum=..., items=...)` in `training_step`, before its backward.

A micro-step is recorded in `on_after_backward`, before any optimizer step (the last micro-batch
of a window runs inside `optimizer.step(closure)`: in `on_train_batch_end` the weights have
already moved). In manual optimization a batch is one micro-step however many `manual_backward`
calls it makes (their losses add up), recorded when the optimizer steps or the batch ends. The
Recorder captures the gradient when that closure returns, after Lightning's clipping; a window
closes in `on_train_batch_end` of a batch in which the optimizer stepped: in automatic
optimization always, in manual optimization once the window holds K batches or at the epoch's
last batch (a short last window, as Lightning's own loop steps there). A manual step before that
is a step inside the window, recorded as one. A batch without a backward is no micro-step: its
window holds one fewer, and the judge names the micro-batch left out.
"""

from __future__ import annotations

import os
from typing import Any

import torch

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl  # type: ignore[no-redef]

from ...errors import BadInput, shown
from .. import checks, watched
from ..distributed import launched_by
from ..recorder import Recorder
from . import batches
from .micro_loss import MicroLoss, record_micro, summed

__all__ = ["GradalignCallback", "record_loss"]


class GradalignCallback(pl.Callback):
    """Records the Lightning run it is a callback of into `out_dir` (written when fit ends).

    `items`: the items each micro-batch's loss averages over, by a rule of `batches.ITEMS_RULES`
    ("causal-lm", "labels", "samples") or a function of the batch; with them the judge weighs
    micro-batches by their items and can name `token-normalization`. `accum_steps`: K, needed
    in manual optimization only. `reference`: a float64 rerun of the baseline, relative to
    `out_dir`. `pad`: integer values left out of the sample digest (and an `attention_mask`
    of a dict batch leaves padded positions out)."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        items: batches.ItemsRule = None,
        accum_steps: int | None = None,
        reference: str | None = None,
        config: dict[str, Any] | None = None,
        pad: Any = batches.PAD,
    ) -> None:
        batches.check_items_rule(items)
        if accum_steps is not None and (
            isinstance(accum_steps, bool) or not isinstance(accum_steps, int) or accum_steps < 1
        ):
            raise BadInput(f"accum_steps must be a positive integer, got {shown(accum_steps)}")
        self.out_dir = out_dir
        self.items = items
        self.accum_steps = accum_steps
        self.reference = reference
        self.extra_config = checks.config_of(config)
        self.pad = pad
        self.recorder: Recorder | None = None
        self.pending: MicroLoss | None = None  # from record_loss(), for the next backward
        self._k = 1
        self._divisor = 1  # what the loss given to the backward was divided by: K, or fewer
        self._automatic = True
        self._batch: Any = None
        self._backward_loss: torch.Tensor | None = None
        self._in_window = 0  # micro-steps recorded in the open window (batches with a backward)
        self._batches = 0  # batches of the open window, with a backward or not (manual)
        self._steps_at_start = 0
        self._stepped = False  # the watched optimizer stepped in this batch (manual)
        self._losses: list[MicroLoss] = []  # manual optimization: this batch's backward calls
        self._stop_step: Any = None

    # -- fit ---------------------------------------------------------------------------------------

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.recorder is not None:
            raise BadInput("a GradalignCallback records one fit(); give each run its own")
        if len(trainer.optimizers) != 1:
            raise BadInput(
                f"GradalignCallback records one optimizer, this fit has "
                f"{len(trainer.optimizers)}: record the loop with gradalign.Recorder instead "
                "(README, 'Your own training loop'), given the optimizer whose accumulation "
                "you check"
            )
        self._automatic = pl_module.automatic_optimization
        if self._automatic:
            first = _first_k(trainer)
            if self.accum_steps not in (None, first):
                raise BadInput(
                    f"accum_steps={self.accum_steps} but the Trainer accumulates {first} "
                    "batches; leave accum_steps out"
                )
            self._k = first
        elif self.accum_steps is None:
            raise BadInput(
                "manual optimization: give GradalignCallback(..., accum_steps=K), the batches "
                "your training_step accumulates per optimizer step"
            )
        else:
            self._k = self.accum_steps
        optimizer = trainer.optimizers[0]
        if not optimizer.param_groups:  # Lightning's stand-in when configure_optimizers gives None
            raise BadInput(
                "configure_optimizers() returned no optimizer: gradalign records its steps"
            )
        if not self._automatic:  # the batch's micro-step before the step it makes
            self._stop_step = watched.before_step(optimizer, self._on_step)
        with launched_by(lightning_launcher(trainer)):
            self.recorder = Recorder(
                self.out_dir,
                pl_module,
                optimizer,
                accum_steps=self._k,
                config={**_run_config(trainer, pl_module, optimizer, self._k), **self.extra_config},
                reference=self.reference,
            )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._unwatch()
        if self.recorder is not None:
            self.recorder.close()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._unwatch()
        if self.recorder is not None:
            self.recorder.abort()

    def _unwatch(self) -> None:
        if self._stop_step is not None:
            self._stop_step()
            self._stop_step = None

    # -- one batch ---------------------------------------------------------------------------------

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch = batch
        self._steps_at_start = trainer.global_step
        self._stepped = False
        self._batches += 1
        if self._in_window == 0:  # a window starts: K batches, or the fewer left in the epoch
            left = trainer.num_training_batches - batch_idx
            self._divisor = self._k if self._automatic else int(max(1, min(self._k, left)))
        if self._automatic and trainer.accumulate_grad_batches != self._k:
            raise BadInput(
                f"accumulate_grad_batches changed during the fit, from {self._k} to "
                f"{trainer.accumulate_grad_batches} at epoch {trainer.current_epoch} (a "
                "GradientAccumulationScheduler?): a run has one K; record each stage as a fit "
                "of its own"
            )

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        self._backward_loss = loss.detach()

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.recorder is None or self._backward_loss is None:
            return
        given, self.pending = self.pending, None
        self._losses.append(given or MicroLoss.scaled_mean(self._backward_loss, self._divisor))
        self._backward_loss = None
        if self._automatic:  # one backward per batch, inside the step's closure
            self._flush()

    def _flush(self) -> None:
        """Record the batch's micro-step, if a backward made one."""
        if self.recorder is None or not self._losses:
            return
        losses, self._losses = self._losses, []
        record_micro(self.recorder, summed(losses), self._batch, self.items, self.pad)
        self._in_window += 1

    def _on_step(self) -> None:
        """Manual optimization: the optimizer starts a step; the batch's micro-step comes first."""
        self._flush()
        self._stepped = True

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.recorder is None:
            return
        self._flush()
        stepped = self._stepped or trainer.global_step > self._steps_at_start
        if stepped and self._in_window == 0:
            raise BadInput(
                "the optimizer stepped, but Lightning saw no backward in its window: in manual "
                "optimization call self.manual_backward(loss), not loss.backward()"
            )
        if stepped and (
            self._automatic or self._batches >= self._k or _last_batch(trainer, batch_idx)
        ):
            self.recorder.update()
            self._in_window = self._batches = 0


def record_loss(
    module: pl.LightningModule,
    loss: torch.Tensor | float | None = None,
    *,
    loss_sum: torch.Tensor | float | None = None,
    items: int | float | torch.Tensor | None = None,
) -> None:
    """State this micro-batch's loss for the GradalignCallback of `module`'s Trainer (a no-op
    when none records): its own mean `loss`, or `loss_sum` with `items`. Call it in
    `training_step` before the backward, when the loss you backpropagate is not the micro-batch's
    mean divided by K (e.g. a summed loss divided by the window's token count)."""
    given = MicroLoss.of(loss, loss_sum, items)
    trainer = getattr(module, "_trainer", None)
    for callback in getattr(trainer, "callbacks", None) or []:
        if isinstance(callback, GradalignCallback):
            callback.pending = given


def _last_batch(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Whether this batch is its epoch's last (Lightning's own loop steps there)."""
    progress = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "batch_progress", None)
    if progress is not None:
        return bool(progress.is_last_batch)
    return batch_idx + 1 >= trainer.num_training_batches


def _run_config(
    trainer: pl.Trainer, module: pl.LightningModule, optimizer: Any, k: int
) -> dict[str, Any]:
    """The training settings a reference run must share (dtype, K and device may differ)."""
    group = optimizer.param_groups[0]
    first = next(module.parameters())
    return {
        "framework": "lightning",
        "accum_steps": k,
        "optimizer": type(optimizer).__name__,
        "lr": group.get("initial_lr", group["lr"]),
        "weight_decay": group.get("weight_decay", 0.0),
        "gradient_clip_val": trainer.gradient_clip_val,
        "dtype": str(first.dtype).removeprefix("torch."),
    }


def _first_k(trainer: pl.Trainer) -> int:
    """The K of the fit's first batch: a GradientAccumulationScheduler sets it only when the
    first epoch starts, after on_train_start."""
    for callback in trainer.callbacks:
        if isinstance(callback, pl.callbacks.GradientAccumulationScheduler):
            return int(callback.get_accumulate_grad_batches(trainer.current_epoch))
    k = trainer.accumulate_grad_batches
    if not isinstance(k, int) or isinstance(k, bool):  # a schedule given where a K goes
        raise BadInput(
            f"Trainer(accumulate_grad_batches={k!r}) is no number of batches; a schedule is a "
            "GradientAccumulationScheduler callback"
        )
    return k


def lightning_launcher(trainer: pl.Trainer) -> str | None:
    """The launcher Lightning started this run's processes with, for the run's manifest:
    'lightning' (`strategy="ddp"` from a script: the script started again per rank) or
    'lightning (spawn)' (`"ddp_spawn"`; fork, forkserver alike); None where the processes were
    started outside Lightning (torchrun, srun) or Lightning runs one."""
    launcher = getattr(trainer.strategy, "launcher", None)
    if launcher is None or trainer.world_size < 2:
        return None
    method = getattr(launcher, "_start_method", None)
    return f"lightning ({method})" if isinstance(method, str) else "lightning"
