"""Hooks on the parameters' gradients run at every backward: on the batch's gradient in the
baseline, on each micro-batch's in the merged run. A clamp there (a recipe for clipping during
backward) changes the window's sum; the Recorder lists the hooked parameters
(`model.grad_hooks`) and the judge names `grad-hooks` where only they fail (a clamp in both
runs was `cross-sample-loss`, saying two micro-batches' gradients were left out; one that
engages from update 5 was `unexplained`). A hook linear in the gradient passes."""

from __future__ import annotations

import pytest
import torch

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier, train

BATCH, K, UPDATES = 32, 4, 8


def hooked(out, k: int, hook: str, dtype: torch.dtype = torch.float32) -> None:
    """The classifier trained with `hook` on its parameters' gradients (both runs alike):
    "clamp" (every parameter, at 0.01), "clamp-head" (the last layer's only), "clamp-late"
    (at 0.2, first engaging at update 1), "post-clamp" (the accumulated `.grad` clamped by a
    post-accumulate hook), "scale" (times 0.5: linear), "unseen" (a linear hook on the head,
    and the first layer's `.grad` clamped by hand before each micro-step, which no hook does)."""
    model, x, y = classifier(BATCH * UPDATES)
    model, x = model.to(dtype), x.to(dtype)
    layers = [model[0], model[2]]
    targets = [model[2]] if hook in ("clamp-head", "unseen") else layers
    bound = 0.2 if hook == "clamp-late" else 0.01

    def clamp_accumulated(param: torch.Tensor) -> None:
        param.grad.clamp_(-bound, bound)

    for p in (p for layer in targets for p in layer.parameters()):
        if hook == "post-clamp":
            p.register_post_accumulate_grad_hook(clamp_accumulated)
        elif hook in ("scale", "unseen"):
            p.register_hook(lambda g: g * 0.5)
        else:
            p.register_hook(lambda g: g.clamp(-bound, bound))

    def by_hand(update: int, micro: int) -> None:
        if hook == "unseen" and micro > 0:
            model[0].weight.grad.clamp_(-0.01, 0.01)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(out, model, opt, x, y, k, batch=BATCH, before_micro=by_hand)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hooks")
    for hook in ("clamp", "clamp-head", "clamp-late", "post-clamp", "scale", "unseen"):
        hooked(root / f"{hook}-base", 1, hook)
        hooked(root / f"{hook}-ref", 1, hook, torch.float64)
        hooked(root / f"{hook}-merged", K, hook)
    return root


def judged(runs, hook: str, reference: bool = True):
    base = read_run_dir(runs / f"{hook}-base")
    ref = read_run_dir(runs / f"{hook}-ref") if reference else None
    return compare(base, read_run_dir(runs / f"{hook}-merged"), reference=ref)


@pytest.mark.parametrize("reference", [True, False])
@pytest.mark.parametrize(
    ("hook", "first", "failing"),
    [
        ("clamp", 0, {"0.weight", "0.bias", "2.weight", "2.bias"}),
        ("clamp-head", 0, {"2.weight", "2.bias"}),
        ("clamp-late", 1, None),
        ("post-clamp", 0, None),
    ],
)
def test_a_hook_that_is_not_linear_is_named(runs, hook, first, failing, reference):
    c = judged(runs, hook, reference)
    d = c.diagnosis[0]
    assert d.code == "grad-hooks", [(x.code, x.message[:200]) for x in c.diagnosis]
    assert d.evidence["first_update"] == first
    if failing is not None:
        assert set(d.evidence["failing_tensors"]) == failing
    assert set(d.evidence["failing_tensors"]) <= set(d.evidence["hooked_parameters"])
    assert "as the baseline's do" in d.message and "before optimizer.step()" in d.fix


def test_the_hooked_parameters_are_recorded(runs):
    assert read_run_dir(runs / "clamp-head-merged").model_facts["grad_hooks"] == [
        "2.weight",
        "2.bias",
    ]
    every = read_run_dir(runs / "post-clamp-ref").model_facts["grad_hooks"]
    assert every == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_a_linear_hook_passes(runs):
    for reference in (True, False):
        c = judged(runs, "scale", reference)
        assert c.verdict == "pass", [(d.code, d.message[:200]) for d in c.diagnosis]


def test_a_failure_outside_the_hooked_parameters_is_not_the_hooks(runs):
    """The first layer's gradient clamped by hand at each micro-step, the head's hooked by a
    linear hook: what fails is no hooked parameter."""
    c = judged(runs, "unseen")
    assert c.verdict == "fail"
    assert "grad-hooks" not in [d.code for d in c.diagnosis], [
        (d.code, d.message[:200]) for d in c.diagnosis
    ]


@pytest.mark.parametrize("register", [False, True])
def test_a_hook_registered_after_the_recorder_opened_is_listed(tmp_path, register):
    model, x, y = classifier(BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradalign.Recorder(tmp_path / "run", model, opt, accum_steps=1) as rec:
        if register:
            model[2].bias.register_hook(lambda g: g.clamp(-1, 1))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        rec.micro(torch.tensor(1.0), batch=(x, y))
        opt.step()
        rec.update()
    facts = read_run_dir(tmp_path / "run").model_facts
    assert facts.get("grad_hooks") == (["2.bias"] if register else None)
