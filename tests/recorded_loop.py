"""The training loop of the tests that record their own runs with `gradalign.Recorder`: each
update K micro-batches of B/K rows, each loss divided by K, then one step; the hooks are where a
test's loop differs (its bug, or its schedule)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import gradalign


def train(
    out,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    k: int,
    *,
    batch: int,
    forward: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
    scale: float = 1.0,
    reference: str | None = None,
    before_micro: Callable[[int, int], None] | None = None,
    after_step: Callable[[int], None] | None = None,
    set_to_none: bool = True,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    record_scaled: bool = False,
    recording: dict | None = None,
    window_end: Callable[[gradalign.Recorder, torch.optim.Optimizer, int], None] | None = None,
    used: int | None = None,
) -> None:
    """`forward(rows, update)`: the logits (default `model(rows)`), whose cross-entropy is the
    loss; `scale` multiplies it before backward (a wrong loss scale); `before_micro(update,
    micro)` and `after_step(update)` run inside the loop; `loss_fn(logits, targets)` replaces
    the cross-entropy; `record_scaled` records the loss times `scale` (the one backpropagated,
    as the framework integrations read it back); `recording`: further Recorder arguments
    (`record="sketch"`, `updates=`); `window_end(rec, opt, update)`: what ends each window in
    place of step, `after_step`, zero_grad and update() (a loop that orders them otherwise);
    `used`: the micro-batches of the K drawn that each window forwards (default all).
    The samples are digested in float32, so a float64 rerun on the widened rows sees the same
    ones."""
    n, updates = batch // k, x.shape[0] // batch
    extra = recording or {}
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference, **extra) as rec:
        for u in range(updates):
            for j in range(k if used is None else used):
                if before_micro is not None:
                    before_micro(u, j)
                rows = slice(u * batch + j * n, u * batch + (j + 1) * n)
                logits = model(x[rows]) if forward is None else forward(x[rows], u)
                loss = (loss_fn or nn.functional.cross_entropy)(logits, y[rows])
                (loss * scale / k).backward()
                recorded = loss * scale if record_scaled else loss
                rec.micro(recorded.detach(), batch=(x[rows].float(), y[rows]))
            if window_end is not None:
                window_end(rec, opt, u)
                continue
            opt.step()
            if after_step is not None:
                after_step(u)
            opt.zero_grad(set_to_none=set_to_none)
            rec.update()


def classifier(rows: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A 12-16-3 tanh classifier (seeded 0) and `rows` samples of 12 features in 3 classes
    (seeded 5): the small model of the tests that write their loop around it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(rows, 12, generator=g)
    return model, x, torch.randint(0, 3, (rows,), generator=g)
