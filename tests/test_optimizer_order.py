"""The order a loop lists its parameters in is not the training's: an optimizer's param groups
listed otherwise, the same parameters in another order with some unfrozen mid-run, and clips of
disjoint parts made in another order record the same facts. A clip that only logs the norm
(`clip_grad_norm_(params, inf)` after the real one) leaves the norm before clipping as it was."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare

UPDATES, BATCH, FROZEN = 5, 16, 2


def _record(out, k: int, shape: str, swapped: bool = False, bug: str | None = None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    body, head = list(model[0].parameters()), list(model[2].parameters())
    if shape == "groups":  # decay and no-decay groups at other learning rates
        groups = [{"params": body, "lr": 3e-3}, {"params": head, "lr": 1e-3}]
        groups = groups[::-1] if swapped else groups
    elif shape == "decay groups":  # weights decayed, biases not (unless the bug decays all)
        weights, biases = (
            list(p for n, p in model.named_parameters() if n.endswith(end))
            for end in ("weight", "bias")
        )
        groups = [{"params": weights}, {"params": biases, "weight_decay": 0.0}]
        groups = [{"params": weights + biases}] if bug == "decay-on-bias" else groups
    else:
        groups = [{"params": head + body if swapped else body + head, "lr": 3e-3}]
    decay = 0.2 if bug and "weight-decay" in bug else 0.05
    lr = 3e-3 * (k if bug and "lr-times-k" in bug else 1)
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=decay)
    schedule = None
    if shape == "one cycle":  # cycles beta1 with the lr; the bug sizes it in micro-batches
        steps = UPDATES * k if bug in ("sized-in-batches", "stepped-per-micro") else UPDATES
        schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps + 1)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(UPDATES * BATCH, 6, generator=g), torch.randint(0, 3, (UPDATES * BATCH,))
    n = BATCH // k
    if shape == "unfrozen":
        model[0].requires_grad_(False)
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            if shape == "unfrozen" and u == FROZEN:
                model[0].requires_grad_(True)
            for j in range(k):
                rows = slice(u * BATCH + j * n, u * BATCH + (j + 1) * n)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss if bug and "no-loss-scale" in bug else loss / k).backward()
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
                if schedule is not None and bug == "stepped-per-micro" and j < k - 1:
                    schedule.step()  # before the window's first step: beta1 cycled already
            if shape == "clips":  # the body's and the head's own clips, in either order
                for part in (head, body) if swapped else (body, head):
                    nn.utils.clip_grad_norm_(part, 0.05)
            elif shape == "logged clip":  # the real clip engages; the second only logs
                nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                nn.utils.clip_grad_norm_(model.parameters(), math.inf)
            opt.step()
            if schedule is not None:
                schedule.step()
            rec.update()
            opt.zero_grad()
    return out


@pytest.mark.parametrize("shape", ["groups", "unfrozen", "clips"])
def test_parameters_listed_in_another_order_train_alike(tmp_path, shape):
    """Each was a false alarm: groups by index (`lr-scaled`, 0.333 times), the step counter of
    the first parameter holding state (`step-in-window`, with no reason given), the norm of the
    window's last clip (`norms before clipping`, without a reference)."""
    base = _record(tmp_path / "base", 1, shape)
    merged = _record(tmp_path / "merged", 4, shape, swapped=True)
    result = compare(base, merged, reference="none")
    assert result.verdict == "pass", [(d.code, d.message) for d in result.diagnosis]


def test_a_clip_that_only_logs_leaves_the_norm_before_clipping(tmp_path):
    """The logging call's norm (after the real clip) was recorded as the window's: a loss not
    divided by K, hidden while the clip engages, then passed without a reference."""
    base = _record(tmp_path / "base", 1, "logged clip")
    clean = compare(base, _record(tmp_path / "clean", 4, "logged clip"), reference="none")
    assert clean.verdict == "pass", [(d.code, d.message) for d in clean.diagnosis]
    bug = _record(tmp_path / "bug", 4, "logged clip", bug="no-loss-scale")
    result = compare(base, bug, reference="none")
    assert result.verdict == "fail" and result.diagnosis[0].code == "loss-scale", [
        (d.code, d.message) for d in result.diagnosis
    ]


@pytest.mark.parametrize(
    ("bug", "setting", "tensors"),
    [("weight-decay", "weight_decay 0.05", 2), ("decay-on-bias", "weight_decay 0.0", 2)],
)
def test_other_optimizer_settings_are_named(tmp_path, bug, setting, tensors):
    """Weight decay 0.2 against 0.05, or the biases moved into the decay group: the gradients
    agree at update 0 and the steps part; named `loss-scale` at update 1 (a 0.998 ratio of
    gradients computed from weights the steps had already moved), or `unexplained`."""
    base = _record(tmp_path / "base", 1, "decay groups")
    merged = _record(tmp_path / "merged", 4, "decay groups", bug=bug)
    result = compare(base, merged, reference="none")
    assert result.verdict == "fail"
    assert [d.code for d in result.diagnosis] == ["optimizer-settings"], result.diagnosis
    found = result.diagnosis[0]
    assert setting in found.message and found.evidence["differences"][0]["tensors"] == tensors


@pytest.mark.parametrize(
    ("setting", "code"), [("weight-decay", "optimizer-settings"), ("lr-times-k", "lr-scaled")]
)
def test_a_loss_scale_beside_other_optimizer_settings_is_named_first(tmp_path, setting, code):
    """The gradient fails at update 0, from the same weights: no setting of the step explains
    it, so its shape is read too. The learning rate K times the baseline's beside the loss not
    divided by K was `lr-scaled` alone."""
    base = _record(tmp_path / "base", 1, "decay groups")
    merged = _record(tmp_path / "merged", 4, "decay groups", bug=f"{setting}+no-loss-scale")
    codes = [d.code for d in compare(base, merged, reference="none").diagnosis]
    assert codes[:2] == ["loss-scale", code], codes
    alone = _record(tmp_path / "alone", 4, "decay groups", bug=setting)
    codes = [d.code for d in compare(base, alone, reference="none").diagnosis]
    assert codes == [code], codes


def test_a_gradient_from_weights_the_steps_parted_is_no_loss_scale(tmp_path):
    """Runs of another writer, without their optimizer settings: update 0's gradients agree and
    the merged step decays the weights more; update 1's gradient, computed from the weights the
    steps parted, is 0.998 times the baseline's in the same direction. It was named a loss
    scaled by the wrong factor, whose fix (scale each micro-batch's loss by 1/K) the loop
    follows (a Lightning fit with weight decay 0.2 against 0.05 did this)."""
    import numpy as np

    from gradalign.runs.portable import write_run

    rng = np.random.default_rng(0)
    w0 = {"w": rng.normal(size=(64, 16)).astype(np.float32)}
    grads = [{"w": rng.normal(size=(64, 16)).astype(np.float32)} for _ in range(3)]

    def run(out, decay, scale):
        weights, stepped, w = [], [], w0["w"]
        for u, g in enumerate(grads):
            g = g["w"] * np.float32(scale if u == 1 else 1.0)
            w = (w * np.float32(1 - decay) - np.float32(0.1) * g).astype(np.float32)
            weights.append({"w": w})
            stepped.append({"w": g})
        losses = [1.0 - 0.1 * u for u in range(3)]
        return write_run(
            out, accum_steps=1, micro_losses=losses, init_weights=w0, update_weights=weights,
            grads=stepped,
        )  # fmt: skip

    result = compare(run(tmp_path / "base", 0.005, 1.0), run(tmp_path / "m", 0.02, 0.998))
    codes = [d.code for d in result.diagnosis]
    assert result.verdict == "fail" and "loss-scale" not in codes, codes


@pytest.mark.parametrize("bug", ["sized-in-batches", "stepped-per-micro"])
def test_settings_a_schedule_moves_are_the_first_steps(tmp_path, bug):
    """The manifest's optimizer settings were read when the Recorder closed: a schedule sized in
    micro-batches had moved OneCycle's beta1 elsewhere by then, and `optimizer-settings` ("the
    optimizers were given other settings") stood beside the right `lr-schedule`. Stepped at each
    micro-step too, it had cycled beta1 before the first step: the betas moved with the lr,
    not at the baseline's schedule at another pace, yet where `lr-schedule` names it."""
    base = _record(tmp_path / "base", 1, "one cycle")
    merged = _record(tmp_path / "merged", 4, "one cycle", bug=bug)
    c = compare(base, merged, reference="none")
    codes = [d.code for d in c.diagnosis]
    assert c.verdict == "fail" and codes[0] == "lr-schedule", codes
    assert "optimizer-settings" not in codes
