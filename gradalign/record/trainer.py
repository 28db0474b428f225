"""Everything one built-in run needs, built from its config: seeded model and data, optimizer,
schedule, autocast and scaler; the float64 reference's config; the preflight."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import ENTRY_POINT_KEYS, TrainConfig
from ..errors import BadInput, cut
from .device import environment, make_deterministic, resolve_device
from .facts import model_facts
from .models import Batches, LossFn, build_data, build_loss, build_model
from .parallel import Parallel

Progress = Callable[[int], None]


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
    parallel: Parallel = field(default_factory=Parallel)  # set by setup()


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
    loss = build_loss(config, model)
    return Training(
        config, model, optimizer, scheduler, data, loss, autocast, scaler, Parallel(model)
    )


def reference_config(config: TrainConfig) -> TrainConfig:
    """The same training at K=1 in float64 without mixed precision: the noise floor's reference."""
    rounding = "float16" if config.param_dtype == "float16" else config.round_to
    return config.replace(
        accum_steps=1,
        nproc=1,
        dtype="float64",
        precision="fp32",
        amp_level=None,
        round_to=rounding,
    )


def compute_dtype(config: TrainConfig) -> str:
    """The dtype the forward and backward compute in."""
    return {"bf16": "bfloat16", "fp16": "float16"}.get(config.compute, config.param_dtype)


def preflight(config: TrainConfig) -> tuple[dict, dict, list[tuple[str, tuple, str]]]:
    """The model's structure facts, the numerical settings and its parameters (name, shape,
    "param") before any training; the model, data and loss are built and run once on the first
    micro-batch, so that a mistake in the user's own code stops the command before anything is
    written."""
    t = setup(config)
    try:
        with torch.no_grad():
            inputs, targets = t.data.micro_batch(0, config.micro_batch_size)
            t.loss(t.model(inputs), targets)
    except Exception as exc:  # the user's model on the user's data: their mistake, not ours
        named = {k: getattr(config, k) for k in ENTRY_POINT_KEYS}
        yours = [f"{k} {v!r}" for k, v in named.items() if ":" in str(v or "")]
        if isinstance(exc, BadInput) or not yours:
            raise
        text = " ".join(str(exc).split())
        raise BadInput(
            f"the first forward pass with your {', '.join(yours)} raised {type(exc).__name__}: "
            f"{cut(text, 160)}"
        ) from None
    first = next(t.model.parameters())
    params = [(name, tuple(p.shape), "param") for name, p in t.model.named_parameters()]
    return model_facts(t.model), environment(first.device, first.dtype, t.model), params


def reference_path(out_dir: str | os.PathLike[str]) -> Path:
    """Where a baseline's float64 reference run goes: a sibling named `<baseline>-fp64`."""
    out = Path(out_dir)
    return out.with_name(out.name + "-fp64")
