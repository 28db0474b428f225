"""The one training loop. The baseline is this loop with accum_steps=1."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .config import TrainConfig
from .errors import BadInput
from .recorder import Recorder
from .zoo import Batches, build_data, build_model

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
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=wd)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    return torch.optim.AdamW(params, lr=lr, weight_decay=wd)


def lr_factor(config: TrainConfig, update: int) -> float:
    """The base lr's multiplier at `update`: linear warmup, then constant, linear or cosine."""
    warm = config.warmup_updates
    if update < warm:
        return (update + 1) / (warm + 1)
    progress = (update - warm) / max(1, config.updates - warm)
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


def setup(config: TrainConfig) -> Training:
    """Seeded model, data, optimizer and schedule on the configured device and dtype."""
    make_deterministic()
    device = resolve_device(config.device)
    dtype = getattr(torch, config.dtype)
    model = build_model(config).to(device=device, dtype=dtype)
    optimizer = build_optimizer(config, model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: lr_factor(config, u))
    return Training(config, model, optimizer, scheduler, build_data(config, device, dtype))


def run_loop(t: Training, rec: Recorder, progress: Progress | None = None) -> None:
    """The training loop: K micro-batches per update, one optimizer step per window."""
    model, optimizer, config = t.model, t.optimizer, t.config
    k, micro_size = config.accum_steps, config.micro_batch_size
    for update in range(config.updates):
        for micro in range(k):
            inputs, targets = t.data.micro_batch(update * k + micro, micro_size)
            loss = F.cross_entropy(model(inputs), targets)
            (loss / k).backward()
            rec.micro(loss)
        pre_clip = None
        if config.clip_norm is not None:
            pre_clip = torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm)
        rec.grads(pre_clip_norm=pre_clip)
        optimizer.step()
        t.scheduler.step()
        rec.update()
        optimizer.zero_grad(set_to_none=True)
        if progress is not None:
            progress(update)


def train(
    config: TrainConfig, out_dir: str | os.PathLike[str], progress: Progress | None = None
) -> Path:
    """Train `config.updates` updates of `config.accum_steps` micro-batches; record to out_dir."""
    t = setup(config)
    with Recorder(out_dir, t.model, t.optimizer, config.accum_steps, config.to_dict()) as rec:
        run_loop(t, rec, progress)
    return Path(out_dir)
