"""The one training loop: K micro-batches per update, one optimizer step per window. The baseline
is this loop with K=1; a fault (faults.py) is a small named deviation inside it."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from ..config import TrainConfig
from ..errors import BadInput
from .dp_faults import LOCAL_ITEMS
from .facts import RecorderError
from .faults import NONE, Fault
from .recorder import Recorder
from .trainer import Progress, Training, compute_dtype, setup

_NO_GRADIENT = (
    "the model's loss has no gradient (no parameter requires grad, or the forward detached "
    "its output: .detach(), torch.no_grad(), .item()): there is nothing to accumulate; "
    "give a model that trains"
)


def run_loop(
    t: Training, rec: Recorder, progress: Progress | None = None, fault: Fault = NONE
) -> None:
    """The training loop: K micro-batches per update, one optimizer step per window.

    `fault` injects one known bug (faults.py); every `fault.` line is a no-op when it is NONE.
    """
    model, optimizer, config, parallel = t.model, t.optimizer, t.config, t.parallel
    k, micro_size = config.accum_steps, config.micro_batch_size
    order, clip = fault.micro_order(config), config.clip_norm
    by_items = config.normalization == "items"  # else each micro-batch's mean / K
    if fault.lr_times_k:
        t.scheduler.base_lrs = [lr * k for lr in t.scheduler.base_lrs]
        for group, lr in zip(optimizer.param_groups, t.scheduler.base_lrs, strict=True):
            group["lr"] = lr * t.scheduler.lr_lambdas[0](0)
    local_items = by_items and fault.dp == LOCAL_ITEMS
    if fault.clamp_hook:
        for param in model.parameters():
            param.register_hook(_clamped)
    for update in range(config.updates):
        window_items = 0
        for micro in range(k):
            step = update * k + micro
            if fault.zero_grad_each_micro:
                optimizer.zero_grad(set_to_none=True)
            if fault.reseed_each_micro:
                torch.manual_seed(config.seed + 1000 + step)
            inputs, targets = t.data.micro_batch(parallel.block(order[step]), micro_size)
            with parallel.micro_step(micro, k):  # DDP: no_sync() for the first K-1, forward too
                with torch.autocast(
                    inputs.device.type, t.autocast or torch.float32, t.autocast is not None
                ):
                    outputs = parallel.forward(inputs)
                loss_sum, items = t.loss(outputs.float() if t.autocast else outputs, targets)
                loss = loss_sum / items  # this micro-batch's own mean, as recorded
                window_items += items
                if local_items and micro == k - 1:  # this rank's items only, before the sync
                    _divide_grads(model, window_items)
                    loss_sum = loss_sum / window_items
                # items: sum now, divide the window's gradient by its item count below;
                # mean: right only when every micro-batch holds as many items
                scaled = parallel.loss(fault.scale(loss_sum if by_items else loss / k, k))
                if config.l2_penalty and not by_items:  # the penalty's share of this micro-batch
                    share = 1 if fault.penalty_each_micro else k
                    scaled = scaled + config.l2_penalty * _squared_norm(model) / share
                if not scaled.requires_grad:
                    raise BadInput(_NO_GRADIENT)
                if not (fault.skip_last_backward and micro == k - 1):
                    (t.scaler.scale(scaled) if t.scaler else scaled).backward()
            logged = loss / k if fault.record_scaled_loss else loss
            rec.micro(logged, items=items, batch=(inputs, targets))
            if fault.unscale_each_micro and micro < k - 1:
                t.scaler.unscale_(optimizer)
                t.scaler.update()
            if fault.accumulate_in is not None:
                low = getattr(torch, fault.accumulate_in)
                _accumulate_low(model, low, micro == k - 1, in_place=parallel.world > 1)
            if fault.clip_each_micro:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if fault.step_each_micro and micro < k - 1:
                optimizer.step()
            if fault.edit_weights_each_micro and micro < k - 1:
                with torch.no_grad():
                    for param in model.parameters():
                        param.mul_(1 - 1e-3)
        if t.scaler is not None:
            t.scaler.unscale_(optimizer)  # once per window, before the item division and clipping
        if by_items and not local_items:
            _divide_grads(model, parallel.window_items(window_items))
        if by_items and config.l2_penalty:  # once per window, after the item division
            (config.l2_penalty * _squared_norm(model)).backward()
        pre_clip = None
        if clip is not None:
            max_norm = clip / k if fault.clip_over_k else clip
            pre_clip = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        rec.grads(pre_clip_norm=pre_clip)
        scale = None
        if t.scaler is not None:  # skips the step on inf/NaN; the scale changes once per window
            scale = t.scaler.get_scale()
            t.scaler.step(optimizer)
            t.scaler.update()
        else:
            optimizer.step()
        if fault.count_each_micro:  # Adam's t counted per micro-step, as a hand-written merge may
            for state in optimizer.state.values():
                state["step"] += k - 1
        for _ in range(parallel.scheduler_steps(fault.scheduler_steps(k))):  # once
            t.scheduler.step()
        if not (fault.forget_update and update == 1):
            rec.update(loss_scale=scale)
        if not fault.keep_grads:
            optimizer.zero_grad(set_to_none=True)
        if progress is not None:
            progress(update)


def _clamped(grad: torch.Tensor) -> torch.Tensor:
    """A gradient hook's clamp, to half the gradient's largest magnitude (`clamp-hook`)."""
    bound = grad.abs().max() / 2
    return grad.clamp(-bound, bound)


def _squared_norm(model: torch.nn.Module) -> torch.Tensor:
    """Σ ||w||² over the parameters: the L2 penalty's argument."""
    return sum(param.pow(2).sum() for param in model.parameters())


def _divide_grads(model: torch.nn.Module, divisor: float) -> None:
    for param in model.parameters():
        if param.grad is not None:
            param.grad.div_(divisor)


def _accumulate_low(
    model: torch.nn.Module, dtype: torch.dtype, last: bool, in_place: bool = False
) -> None:
    """Move this micro-step's gradient into a `dtype` accumulation buffer (the bf16-accum bug);
    after the window's last micro-step the buffer becomes the gradient again. `in_place` (under
    DDP, whose buckets hold .grad): the gradient itself is rounded to `dtype` every micro-step."""
    for param in model.parameters():
        if param.grad is None:
            continue
        if in_place:
            param.grad.copy_(param.grad.to(dtype))
            continue
        buffer = getattr(param, "_low_buffer", None)
        total = param.grad.to(dtype) if buffer is None else (buffer + param.grad.to(dtype))
        if last:
            param.grad = total.to(param.dtype)
            param._low_buffer = None
        else:
            param._low_buffer = total
            param.grad = None


def train(
    config: TrainConfig,
    out_dir: str | os.PathLike[str],
    progress: Progress | None = None,
    *,
    fault: Fault = NONE,
    reference: str | None = None,
    skip_updates: Sequence[int] = (),
) -> Path:
    """Train `config.updates` updates of `config.accum_steps` micro-batches; record to out_dir.

    `reference` is the path, relative to out_dir, of a float64 rerun of this training;
    `skip_updates`: updates whose step is skipped (a float64 rerun skips where the baseline's
    GradScaler did).
    """
    t = setup(config)
    if config.nproc > 1:
        _data_parallel(t, fault)
    fault_name = None if fault is NONE else fault.name
    try:  # the built-in loop calls it rightly: only its output can be refused (exit 2)
        with warnings.catch_warnings():  # the command said this one before training
            warnings.filterwarnings("ignore", "the model has BatchNorm", UserWarning)
            rec = Recorder(
                out_dir,
                t.model,
                t.optimizer,
                config.accum_steps,
                config.to_dict(),
                fault=fault_name,
                reference=reference,
                compute_dtype=compute_dtype(config),
                scaler=t.scaler,
                record=config.record,
                snapshot_every=config.snapshot_every,
                updates=config.updates,
                distributed=config.nproc > 1,
                skip_updates=skip_updates,
            )
    except RecorderError as exc:
        raise BadInput(str(exc)) from None
    with rec:
        run_loop(t, rec, progress, fault)
    return Path(out_dir)


def _data_parallel(t: Training, fault: Fault) -> None:
    """Make this process one rank of the merged run: DDP over the initialized process group."""
    import torch.distributed as dist

    from .parallel import DataParallel

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world != t.config.nproc:
        raise BadInput(
            f"nproc {t.config.nproc} needs {t.config.nproc} ranks of an initialized process "
            f"group (found {world}); `gradalign merged --nproc W` launches them"
        )
    t.parallel = DataParallel(t.model, fault, t.config.seed)
    t.model = t.parallel.module
