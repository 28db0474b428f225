"""The one training loop. The baseline is this loop with accum_steps=1."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import TrainConfig
from ..errors import BadInput
from .faults import NONE, Fault
from .models import Batches, LossFn, build_data, build_loss, build_model
from .recorder import Recorder, environment, model_facts

Progress = Callable[[int], None]


def resolve_device(name: str) -> torch.device:
    """cpu, cuda (must be present) or auto (cuda when present)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BadInput("device cuda was asked for, but torch sees no CUDA device")
    return torch.device(name)


def make_deterministic() -> None:
    """Same command, same bits: deterministic kernels, no autotuning, no TF32 shortcuts."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def build_optimizer(config: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    params, lr, wd = model.parameters(), config.learning_rate, config.weight_decay
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=config.momentum, nesterov=config.nesterov, weight_decay=wd
        )
    kind = torch.optim.Adam if config.optimizer == "adam" else torch.optim.AdamW
    return kind(params, lr=lr, betas=(config.beta1, config.beta2), eps=config.eps, weight_decay=wd)


def lr_factor(config: TrainConfig, update: int) -> float:
    """The base lr's multiplier at `update`: linear warmup, then constant, linear or cosine."""
    warm = config.warmup_updates
    if update < warm:
        return (update + 1) / (warm + 1)
    progress = min(1.0, (update - warm) / max(1, config.updates - warm))
    if config.scheduler == "linear":
        return 1.0 - progress
    if config.scheduler == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


@dataclass
class Training:
    """Everything one run needs, built from its config."""

    config: TrainConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    data: Batches
    loss: LossFn  # (summed loss, item count) of a batch
    autocast: torch.dtype | None = None  # the forward's autocast dtype (None: no autocast)
    scaler: torch.amp.GradScaler | None = None  # fp16's dynamic loss scaling


def setup(config: TrainConfig) -> Training:
    """Seeded model, data, optimizer and schedule on the configured device and dtype."""
    make_deterministic()
    device = resolve_device(config.device)
    dtype = getattr(torch, config.param_dtype)
    model = build_model(config)
    if config.round_to is not None:
        model = model.to(getattr(torch, config.round_to))
    model = model.to(device=device, dtype=dtype)
    optimizer = build_optimizer(config, model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: lr_factor(config, u))
    data = build_data(config, device, getattr(torch, config.round_to or config.param_dtype))
    if data.inputs.is_floating_point():
        data.inputs = data.inputs.to(dtype)
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.compute)
    scaler = torch.amp.GradScaler(device.type) if config.compute == "fp16" else None
    return Training(config, model, optimizer, scheduler, data, build_loss(config), autocast, scaler)


def reference_config(config: TrainConfig) -> TrainConfig:
    """The same training at K=1 in float64 without mixed precision: the noise floor's reference."""
    rounding = "float16" if config.param_dtype == "float16" else config.round_to
    return config.replace(
        accum_steps=1, dtype="float64", precision="fp32", amp_level=None, round_to=rounding
    )


def compute_dtype(config: TrainConfig) -> str:
    """The dtype the forward and backward compute in."""
    return {"bf16": "bfloat16", "fp16": "float16"}.get(config.compute, config.param_dtype)


def preflight(config: TrainConfig) -> tuple[dict, dict]:
    """The model's structure facts and the numerical settings, before any training; the model,
    data and loss are built and run once on the first micro-batch, so that a mistake in the
    user's own code stops the command before anything is written."""
    t = setup(config)
    with torch.no_grad():
        inputs, targets = t.data.micro_batch(0, config.micro_batch_size)
        t.loss(t.model(inputs), targets)
    first = next(t.model.parameters())
    return model_facts(t.model), environment(first.device, first.dtype)


def run_loop(
    t: Training, rec: Recorder, progress: Progress | None = None, fault: Fault = NONE
) -> None:
    """The training loop: K micro-batches per update, one optimizer step per window.

    `fault` injects one known bug (faults.py); every `fault.` line is a no-op when it is NONE.
    """
    model, optimizer, config = t.model, t.optimizer, t.config
    k, micro_size = config.accum_steps, config.micro_batch_size
    order, clip = fault.micro_order(config), config.clip_norm
    by_items = config.normalization == "items"  # else each micro-batch's mean / K
    for update in range(config.updates):
        window_items = 0
        for micro in range(k):
            step = update * k + micro
            if fault.zero_grad_each_micro:
                optimizer.zero_grad(set_to_none=True)
            if fault.reseed_each_micro:
                torch.manual_seed(config.seed + 1000 + step)
            inputs, targets = t.data.micro_batch(order[step], micro_size)
            with torch.autocast(
                inputs.device.type, t.autocast or torch.float32, t.autocast is not None
            ):
                outputs = model(inputs)
            loss_sum, items = t.loss(outputs.float() if t.autocast else outputs, targets)
            loss = loss_sum / items  # this micro-batch's own mean, as recorded
            window_items += items
            # items: sum now, divide the window's gradient by its item count below;
            # mean: right only when every micro-batch holds as many items
            scaled = fault.scale(loss_sum if by_items else loss / k, k)
            (t.scaler.scale(scaled) if t.scaler else scaled).backward()
            rec.micro(loss, items=items, batch=(inputs, targets))
            if fault.accumulate_in is not None:
                _accumulate_low(model, fault.accumulate_in, last=micro == k - 1)
            if fault.clip_each_micro:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if fault.step_each_micro and micro < k - 1:
                optimizer.step()
        if t.scaler is not None:
            t.scaler.unscale_(optimizer)  # once per window, before the item division and clipping
        if by_items:
            for param in model.parameters():
                if param.grad is not None:
                    param.grad.div_(window_items)
        pre_clip = (
            None if clip is None else torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        )
        rec.grads(pre_clip_norm=pre_clip)
        scale = None
        if t.scaler is not None:  # skips the step on inf/NaN; the scale changes once per window
            scale = t.scaler.get_scale()
            t.scaler.step(optimizer)
            t.scaler.update()
        else:
            optimizer.step()
        for _ in range(fault.scheduler_steps(k)):  # once
            t.scheduler.step()
        rec.update(loss_scale=scale)
        optimizer.zero_grad(set_to_none=True)
        if progress is not None:
            progress(update)


def _accumulate_low(model: torch.nn.Module, dtype: torch.dtype, last: bool) -> None:
    """Move this micro-step's gradient into a `dtype` accumulation buffer (the bf16-accum bug);
    after the window's last micro-step the buffer becomes the gradient again."""
    for param in model.parameters():
        if param.grad is None:
            continue
        buffer = getattr(param, "_low_buffer", None)
        total = param.grad.to(dtype) if buffer is None else (buffer + param.grad.to(dtype))
        if last:
            param.grad = total.to(param.dtype)
            param._low_buffer = None
        else:
            param._low_buffer = total
            param.grad = None


def reference_path(out_dir: str | os.PathLike[str]) -> Path:
    """Where a baseline's float64 reference run goes: a sibling named `<baseline>-fp64`."""
    out = Path(out_dir)
    return out.with_name(out.name + "-fp64")


def train(
    config: TrainConfig,
    out_dir: str | os.PathLike[str],
    progress: Progress | None = None,
    *,
    fault: Fault = NONE,
    reference: str | None = None,
) -> Path:
    """Train `config.updates` updates of `config.accum_steps` micro-batches; record to out_dir.

    `reference` is the path, relative to out_dir, of a float64 rerun of this training.
    """
    t = setup(config)
    fault_name = None if fault is NONE else fault.name
    with Recorder(
        out_dir,
        t.model,
        t.optimizer,
        config.accum_steps,
        config.to_dict(),
        fault=fault_name,
        reference=reference,
        compute_dtype=compute_dtype(config),
    ) as rec:
        run_loop(t, rec, progress, fault)
    return Path(out_dir)
