"""Hand-written training loops of many shapes, recorded through `gradalign.Recorder`, for the
held-out-style matrix (bench/matrix.py). They play the part of loops nobody here wrote: their own
models, data, losses, optimizers and schedules; a `bug` is what a user's loop might get wrong.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import gradalign

VOCAB, SEQ, FEATURES, CLASSES = 24, 10, 20, 5


class Attention(nn.Module):
    """Separate q/k/v Linear layers with bias (softmax ignores the key bias), LayerNorm."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        a = torch.softmax(self.q(h) @ self.k(h).transpose(-1, -2) / math.sqrt(h.shape[-1]), -1)
        return self.out(self.ln(a @ self.v(h)).mean(dim=1))


class Recurrent(nn.Module):
    def __init__(self, d: int = 12) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.gru(self.emb(x))[0][:, -1])


class TiedLM(nn.Module):
    """A next-token model whose output layer shares the embedding's weight; padded tokens."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.mix = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, VOCAB, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        causal = torch.cumsum(h, dim=1) / torch.arange(1, x.shape[1] + 1).view(1, -1, 1)
        return self.out(self.norm(torch.tanh(self.mix(causal))))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, CLASSES))


def relu_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 48), nn.ReLU(), nn.Linear(48, CLASSES))


class WithUnused(nn.Module):
    """An MLP with a layer that forward never calls: its parameters get no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self.unused = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def embed_bag() -> nn.Module:
    return nn.Sequential(nn.Embedding(VOCAB, 16), nn.Flatten(), nn.Linear(16 * SEQ, CLASSES))


def embed_max_norm() -> nn.Module:
    """An Embedding that renormalizes the rows it looks up, in place, during forward."""
    return nn.Sequential(
        nn.Embedding(VOCAB, 16, max_norm=1.0), nn.Flatten(), nn.Linear(16 * SEQ, CLASSES)
    )


def conv_bn_eval() -> nn.Module:
    """A conv net whose BatchNorm is frozen in eval mode (fixed statistics, as in fine-tuning)."""
    norm = nn.BatchNorm1d(8)
    with torch.no_grad():
        norm.running_mean.uniform_(-0.2, 0.2)
        norm.running_var.uniform_(0.5, 2.0)
    norm.eval()
    return nn.Sequential(
        nn.Unflatten(1, (1, FEATURES)),
        nn.Conv1d(1, 8, 3, padding=1),
        norm,
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * FEATURES, CLASSES),
    )


def conv_gn() -> nn.Module:
    return nn.Sequential(
        nn.Unflatten(1, (1, FEATURES)),
        nn.Conv1d(1, 8, 3, padding=1),
        nn.GroupNorm(2, 8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * FEATURES, CLASSES),
    )


MODELS = {
    "mlp": (mlp, "features"),
    "relu-mlp": (relu_mlp, "features"),
    "unused": (WithUnused, "features"),
    "conv-gn": (conv_gn, "features"),
    "embed": (embed_bag, "tokens"),
    "embed-max-norm": (embed_max_norm, "tokens"),
    "conv-bn-eval": (conv_bn_eval, "features"),
    "gru": (Recurrent, "tokens"),
    "attention": (Attention, "tokens"),
    "tied-lm": (TiedLM, "padded"),
}


@dataclass(frozen=True)
class Setup:
    """One clean configuration of a user's loop."""

    model: str = "mlp"
    optimizer: str = "sgd"
    lr: float = 0.1
    k: int = 4
    batch: int = 48
    updates: int = 12
    autocast: str | None = None  # "bfloat16" | "float16" (float16 adds a GradScaler)
    clip: float | None = None
    schedule: bool = False
    uneven: bool = False  # micro-batches of unequal size, weighted by items
    groups: bool = False  # two param groups with their own lr and weight decay
    freeze: bool = False  # the first layer frozen
    penalty: float = 0.0  # an L2 penalty in the loss
    extra: dict = field(default_factory=dict)


def _optimizer(s: Setup, model: nn.Module, lr_scale: float) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    lr = s.lr * lr_scale
    groups: list = [{"params": params}]
    if s.groups:
        half = len(params) // 2
        groups = [
            {"params": params[:half], "lr": lr, "weight_decay": 0.0},
            {"params": params[half:], "lr": lr / 3, "weight_decay": 0.01},
        ]
    kinds = {
        "sgd": lambda: torch.optim.SGD(groups, lr=lr),
        "momentum": lambda: torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True),
        "adam": lambda: torch.optim.Adam(groups, lr=lr),
        "adamw": lambda: torch.optim.AdamW(groups, lr=lr, weight_decay=0.05),
        "rmsprop": lambda: torch.optim.RMSprop(groups, lr=lr),
        "adagrad": lambda: torch.optim.Adagrad(groups, lr=lr),
    }
    return kinds[s.optimizer]()


def _data(kind: str, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + seed)
    if kind == "features":
        x = torch.randn(rows, FEATURES, generator=g)
        return x, (x[:, :CLASSES] + 0.5 * torch.randn(rows, CLASSES, generator=g)).argmax(1)
    tokens = torch.randint(1, VOCAB, (rows, SEQ), generator=g)
    if kind == "tokens":
        return tokens, tokens[:, 0] % CLASSES
    lengths = torch.randint(3, SEQ + 1, (rows,), generator=g)
    pad = torch.arange(SEQ).view(1, -1) >= lengths.view(-1, 1)
    targets = torch.roll(tokens, -1, dims=1)
    targets[:, -1] = -100
    return tokens.masked_fill(pad, 0), targets.masked_fill(pad | torch.roll(pad, -1, 1), -100)


def _splits(s: Setup, k: int) -> list[int]:
    """Micro-batch sizes of a window (unequal when `uneven`, summing to the batch)."""
    base = [s.batch // k] * k
    if s.uneven and k > 1:
        base[0] += 2
        base[-1] -= 2
    return base


def run(
    out: Path,
    s: Setup,
    k: int,
    *,
    seed: int = 0,
    float64: bool = False,
    bug: str | None = None,
    record: str = "full",
    sketch_width: int | None = None,
) -> Path:
    """Record one run of the setup at K=k (the baseline is k=1, the reference float64);
    `sketch_width`: the Recorder's, with `record="sketch"` (None: its default)."""
    build, kind = MODELS[s.model]
    torch.manual_seed(seed)
    model = build()
    if s.freeze:
        next(model.parameters()).requires_grad_(False)
    model = model.double() if float64 else model
    opt = _optimizer(s, model, s.k if bug == "lr-times-k" else 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: max(0.1, 1 - u / (2 * s.updates)))
    autocast = None if float64 or s.autocast is None else getattr(torch, s.autocast)
    scaler = torch.amp.GradScaler("cpu") if autocast == torch.float16 else None
    x, y = _data(kind, s.batch * s.updates, seed)
    if bug == "data-order":  # the merged run reads the rows in another order
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(99))
        x, y = x[perm], y[perm]
    if x.is_floating_point() and float64:
        x = x.double()
    sizes = _splits(s, k)
    width = {} if sketch_width is None else {"sketch_width": sketch_width}
    with gradalign.Recorder(
        out, model, opt, accum_steps=k, scaler=scaler, record=record, updates=s.updates, **width
    ) as rec:
        for update in range(s.updates):
            start = update * s.batch
            bounds = [start + sum(sizes[:j]) for j in range(k + 1)]
            window = [(x[a:b], y[a:b]) for a, b in itertools.pairwise(bounds)]
            total = sum(int((yb != -100).sum()) for _, yb in window)
            for j, (xb, yb) in enumerate(window):
                _micro(rec, model, opt, scaler, autocast, s, xb, yb, j, k, total, bug)
                if bug == "scheduler-every-micro" and j < k - 1:
                    sched.step()
            if scaler is not None and bug != "scaler-every-micro":
                scaler.unscale_(opt)
            if s.clip:
                nn.utils.clip_grad_norm_(
                    model.parameters(), s.clip / (k if bug == "clip-norm-over-k" else 1)
                )
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if s.schedule:
                sched.step()
            if not (bug == "forget-update" and update == 1):
                rec.update(loss_scale=None)
            if bug != "no-zero-grad":
                opt.zero_grad()
    return out


def _micro(rec, model, opt, scaler, autocast, s, xb, yb, j, k, total, bug) -> None:
    """One micro-step: forward, the loss normalized by the window's items, backward, record."""
    if bug == "zero-grad-every-micro":
        opt.zero_grad()
    with torch.autocast("cpu", autocast or torch.float32, enabled=autocast is not None):
        logits = model(xb)
    flat = logits.float().reshape(-1, logits.shape[-1])
    loss_sum = nn.functional.cross_entropy(flat, yb.reshape(-1), reduction="sum")
    n = int((yb != -100).sum())
    share = loss_sum / total  # the right normalization: the window's item count
    if bug == "no-loss-scale":
        share = share * k
    if bug == "mean-per-micro":  # each micro-batch's own mean, divided by K
        share = loss_sum / n / k
    if bug == "mean-per-micro-over-k":  # as a framework that divides by K again
        share = loss_sum / n / k / k
    if bug == "mean-per-micro-not-over-k":  # a model that ignores the window's item count
        share = loss_sum / n
    if s.penalty:
        norm = sum(p.pow(2).sum() for p in model.parameters())
        share = share + s.penalty * norm / (1 if bug == "penalty-every-micro" else k)
    if not (bug == "skip-last-backward" and j == k - 1):
        (scaler.scale(share) if scaler is not None else share).backward()
    if bug == "bf16-accum":
        for p in model.parameters():
            if p.grad is not None:
                p.grad = p.grad.bfloat16().float()
    logged = loss_sum / n / (k if bug == "log-scaled-loss" else 1)
    rec.micro(logged, items=n, batch=(xb, yb), pad=(-100,))
    if bug == "clip-every-micro":
        nn.utils.clip_grad_norm_(model.parameters(), s.clip or 0.1)
    if bug == "step-every-micro" and j < k - 1:
        opt.step()
    if bug == "edit-weights-every-micro" and j < k - 1:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.999)
    if bug == "scaler-every-micro" and scaler is not None and j < k - 1:
        scaler.unscale_(opt)
        scaler.update()
