"""A user's own accumulation loop (not the built-in trainer) recording through `Recorder`: their
model, data, loss, optimizer and schedule, with each bug such a loop may have (`bug=`); the loop
of tests/test_user_loop_bugs.py and tests/test_recorder_in_loop.py."""

from __future__ import annotations

import torch
from torch import nn

import gradalign
from gradalign.runs.reader import read_run_dir


def make_data(batch: int, updates: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(batch * updates, 12, generator=g)
    y = (x[:, :3].sum(dim=1) > 0).long()
    return x, y


def user_loop(
    out,
    k: int,
    *,
    bug: str | None = None,
    batch: int = 32,
    updates: int = 5,
    optimizer: str = "sgd",
    schedule: bool = False,
    clip: float | None = None,
    clip_value: float | None = None,
    dropout: float = 0.0,
    dtype: torch.dtype = torch.float32,
    penalty: float = 0.0,
    fp16: bool = False,
    wrap=None,
    plateau: bool = False,
):
    """A user's own loop: their model, data, loss, optimizer and schedule; gradalign records.
    `wrap(model)`: the module the loop calls and gives the Recorder (torch.compile's);
    `plateau`: ReduceLROnPlateau stepped on each window's mean loss, after the step."""
    torch.manual_seed(3)
    layers = [nn.Linear(12, 20), nn.Tanh()] + ([nn.Dropout(dropout)] if dropout else [])
    model = nn.Sequential(*layers, nn.Linear(20, 2)).to(dtype)
    lr_scale = k if bug == "lr-times-k" else 1
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.5 * lr_scale, momentum=0.9)
        if optimizer == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-2 * lr_scale)
    )
    scaler = torch.amp.GradScaler("cpu") if fp16 and dtype == torch.float32 else None
    # linear decay: stepped per micro-step, it is no constant multiple of the baseline's (an
    # inverse-time schedule 1/(1+u) would be: then lr-scaled and lr-schedule look alike)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: max(0.05, 1 - u / 40))
    on_loss = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    x, y = make_data(batch, updates)
    x = x.to(dtype)
    micro = batch // k
    window_loss = 0.0
    order = torch.randperm(updates * k, generator=torch.Generator().manual_seed(1))
    net = model if wrap is None else wrap(model)
    # a budget of optimizer steps (max_steps) the loop stops at, spent by steps inside windows
    budget, taken = (updates if bug == "step-every-micro-budget" else None), 0
    with gradalign.Recorder(
        out, net, opt, accum_steps=k, config={"user": True}, scaler=scaler
    ) as rec:
        for update in range(updates):
            for j in range(k):
                step = update * k + j
                if bug == "zero-grad-every-micro":
                    opt.zero_grad()
                if bug == "dropout-reseed":
                    torch.manual_seed(100 + step)
                index = int(order[step]) if bug == "data-order" else step
                if bug == "late-repeat-no-loss-scale" and update >= 2:  # no set_epoch
                    index = (update % 2) * k + j
                rows = slice(index * micro, (index + 1) * micro)
                with torch.autocast("cpu", torch.float16, enabled=scaler is not None):
                    logits = net(x[rows])
                loss = nn.functional.cross_entropy(logits.float(), y[rows])
                scaled = {
                    "no-loss-scale": loss,
                    "late-repeat-no-loss-scale": loss,
                    "bf16-accum-no-loss-scale": loss,
                    "double-loss-scale": loss / k / k,
                    "double-loss-scale-logged": loss / k / k,
                    "loss-plus-scaled": loss + loss / k,
                }.get(bug or "", loss / k)
                if penalty:  # an L2 penalty in the loss: its share 1/K per micro-batch
                    share = {"penalty-every-micro": 1, "penalty-over-k-twice": k * k}.get(bug, k)
                    scaled = (
                        scaled + penalty * sum(p.pow(2).sum() for p in model.parameters()) / share
                    )
                if not (bug == "skip-last-backward" and j == k - 1):
                    (scaler.scale(scaled) if scaler is not None else scaled).backward()
                if bug in ("bf16-accum", "bf16-accum-no-loss-scale"):  # a bfloat16 running sum
                    for p in model.parameters():
                        low = p.grad.bfloat16()
                        if getattr(p, "low", None) is not None:
                            low = low + p.low
                        p.low, p.grad = (None, low.float()) if j == k - 1 else (low, None)
                logged = bug in ("log-scaled-loss", "double-loss-scale-logged")
                given = loss * 1.003 if bug == "log-loss-off" else loss
                rec.micro(given / k if logged else given, batch=(x[rows], y[rows]))
                window_loss += float(loss.detach()) / k
                if bug == "scaler-every-micro" and j < k - 1:
                    scaler.unscale_(opt)
                    scaler.update()
                if bug == "edit-weights-every-micro" and j < k - 1:
                    with torch.no_grad():
                        for p in model.parameters():
                            p.mul_(0.999)
                if bug == "clip-every-micro":
                    nn.utils.clip_grad_norm_(model.parameters(), clip)
                if bug == "clip-value-every-micro":
                    nn.utils.clip_grad_value_(model.parameters(), clip_value)
                if bug in ("step-every-micro", "step-every-micro-budget") and j < k - 1:
                    opt.step()
                    taken += 1
                    if taken == budget:
                        break
                if bug == "scheduler-every-micro" and j < k - 1:
                    sched.step()
            if taken == budget:
                break  # the budget spent inside the window: it never ends
            if scaler is not None and bug != "scaler-every-micro":
                scaler.unscale_(opt)
            norm = nn.utils.clip_grad_norm_(model.parameters(), clip) if clip else None
            if clip_value is not None:
                value = clip_value / k if bug == "clip-value-over-k" else clip_value
                nn.utils.clip_grad_value_(model.parameters(), clip_value=value)
            rec.grads(pre_clip_norm=norm)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            taken += 1
            if schedule:
                sched.step()
            if plateau:
                on_loss.step(window_loss)
            window_loss = 0.0
            if not (bug == "forget-update" and update == 1):
                rec.update()
            if bug != "no-zero-grad":
                opt.zero_grad()
            if taken == budget:
                break
    return read_run_dir(out)
