"""A counter a hand-written optimizer keeps in its param groups (Adam's t for its bias
correction) is state, not a setting: the Recorder lists the group entries that changed between
the first two steps (`optimizer.counters`), and a merged run that advanced one per micro-step
is `step-count`, naming it. A cold probe's loop was `optimizer-settings` ("t 1 in the baseline,
4 in the merged run") with a fix about giving the merged optimizer the baseline's settings; a
setting that never changes and differs (an accumulation setting kept in the groups) stays a
setting."""

from __future__ import annotations

import json

import pytest
import torch

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier, train

BATCH, K, UPDATES = 24, 4, 5


class HandAdam(torch.optim.Optimizer):
    """Adam written by hand, its step count `t` in each param group; `tick()` advances it."""

    def __init__(self, params, lr=1e-2, **extra):
        super().__init__(params, dict(lr=lr, t=0, **extra))

    def tick(self):
        for group in self.param_groups:
            group["t"] += 1

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            t = max(group["t"], 1)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                state["m"].mul_(0.9).add_(p.grad, alpha=0.1)
                state["v"].mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                m_hat, v_hat = state["m"] / (1 - 0.9**t), state["v"] / (1 - 0.999**t)
                p.addcdiv_(m_hat, v_hat.sqrt().add_(1e-8), value=-group["lr"])


def record(out, k: int, per_micro: bool = False, scale: float = 1.0, **extra):
    model, x, y = classifier(UPDATES * BATCH)
    opt = HandAdam(model.parameters(), **extra)

    def before_micro(update: int, micro: int) -> None:
        if per_micro or micro == 0:
            opt.tick()

    train(out, model, opt, x, y, k, batch=BATCH, before_micro=before_micro, scale=scale)
    return read_run_dir(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("counters")
    return {
        "base": record(root / "base", 1, accum=1),
        "merged": record(root / "merged", K, accum=1),
        "ticked": record(root / "ticked", K, per_micro=True, accum=1),
        "set": record(root / "set", K, scale=K, accum=K),  # and the loss not divided by K
        "root": root,
    }


def test_the_recorder_lists_what_changed_between_the_first_two_steps(runs):
    optimizer = json.loads((runs["root"] / "merged" / "manifest.json").read_text())["optimizer"]
    assert optimizer["counters"] == ["t"]
    assert optimizer["groups"][0]["t"] == 1 and optimizer["groups"][0]["accum"] == 1


def test_a_counter_advanced_per_micro_step_is_step_count(runs):
    assert compare(runs["base"], runs["merged"]).verdict == "pass"
    result = compare(runs["base"], runs["ticked"])
    lead = result.diagnosis[0]
    assert result.verdict == "fail" and lead.code == "step-count", result.diagnosis
    assert lead.evidence["counters"] == {"t": {"baseline": 1, "merged": K}}
    assert "optimizer-settings" not in {d.code for d in result.diagnosis}


def test_a_setting_that_never_changed_stays_a_setting(runs):
    """Its value K against the baseline's 1 is no count: the run failing for another reason
    (its loss not divided by K) is not named `step-count`."""
    result = compare(runs["base"], runs["set"])
    named = {d.code: d.message for d in result.diagnosis}
    assert result.verdict == "fail" and "step-count" not in named, named
    assert "accum 1 in the baseline, 4 in the merged run" in named["optimizer-settings"]


def test_only_whole_numbers_that_rose_are_counters():
    """A schedule that moves a setting between steps (OneCycleLR's betas) moves no count: those
    stay settings, compared as the first step used them."""
    from gradalign.record.optimizer_settings import with_counters

    first = {"groups": [{"t": 1, "betas": [0.95, 0.999], "lr_floor": 3, "amsgrad": False}]}
    later = {"groups": [{"t": 2, "betas": [0.94, 0.999], "lr_floor": 2, "amsgrad": True}]}
    assert with_counters(first, later)["counters"] == ["t"]
