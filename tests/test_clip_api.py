"""torch's split clipping API (`get_total_norm`, then `clip_grads_with_norm_`) is seen like
`clip_grad_norm_`, and a scale a clip that always engages hid is read from the norms before
clipping, with or without a reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import clip_grad_norm_ as clip_grad_norm_by_name  # before any Recorder
from torch.nn.utils import clip_grad_value_ as clip_grad_value_by_name

import gradalign
from gradalign.judge.compare import compare
from gradalign.judge.signatures.clipping import scale_before_clip
from gradalign.runs.portable import write_run
from gradalign.runs.reader import read_run_dir

UPDATES, BATCH, MAX_NORM, K = 5, 32, 0.3, 4  # the baseline's norms are 0.43-0.58: the clip engages
VALUE = 0.01  # a clip_value that engages: elements of the baseline's gradients stand above it


def _split_clip(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip as FSDP2 / torchtitan loops do, through the module attributes."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, total)
    return total


def _legacy_clip(model: nn.Module, max_norm: float) -> torch.Tensor:
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def _clip_by_name(model: nn.Module, max_norm: float) -> torch.Tensor:
    """torch's own clip_grad_norm_, imported by name when this module was (no Recorder open)."""
    return clip_grad_norm_by_name(model.parameters(), max_norm)


def _value_clip(model: nn.Module, value: float) -> None:
    torch.nn.utils.clip_grad_value_(model.parameters(), value)


def _value_clip_by_name(model: nn.Module, value: float) -> None:
    """torch's own clip_grad_value_, imported by name when this module was (no Recorder open)."""
    clip_grad_value_by_name(model.parameters(), value)


CLIPS = {
    True: _split_clip,
    False: _legacy_clip,
    "by-name": _clip_by_name,
    "value": _value_clip,
    "value-by-name": _value_clip_by_name,
}


def clip_loop(
    out,
    k: int,
    *,
    bug: str | None = None,
    split: bool | str = True,
    float64: bool = False,
    max_norm: float = MAX_NORM,
    inputs: float = 1.0,
):
    """A hand-written loop that clips once per update at a max_norm that engages (unless
    told another), through the split API, `clip_grad_norm_` (`split=False`) or torch's
    function imported by name (`split="by-name"`); or by value at `max_norm` through
    `clip_grad_value_` (`split="value"`, `"value-by-name"`); `inputs` scales the inputs (and so
    the gradients' norms)."""
    clip = CLIPS[split]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 48), nn.GELU(), nn.Linear(48, 4))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * BATCH, 10, generator=g)
    y = (x[:, :4] * x[:, 4:8]).argmax(1)
    x = x * inputs
    if float64:
        model, x = model.double(), x.double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    n = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            for j in range(k):
                rows = slice(u * BATCH + j * n, u * BATCH + (j + 1) * n)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss if bug == "no-loss-scale" else loss / k).backward()
                rec.micro(loss, batch=(x[rows], y[rows]))
                if bug == "clip-every-micro":
                    clip(model, max_norm)
                if bug in ("read-every-micro", "read-only-every-micro"):  # a norm logged
                    torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
            if bug == "read-only":
                torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
            elif bug not in ("clip-every-micro", "no-clip", "read-only-every-micro"):
                clip(model, max_norm / k if bug == "clip-over-k" else max_norm)
            if bug == "divided-after-clip":  # a hook dividing the gradient by K once more
                for p in model.parameters():
                    p.grad /= k
            opt.step()
            rec.update()
            opt.zero_grad()
    return read_run_dir(out)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return clip_loop(tmp_path_factory.mktemp("clip") / "base", 1)


def test_a_clean_split_api_loop_is_recorded_and_passes(tmp_path, base):
    merged = clip_loop(tmp_path / "merged", 4)
    assert list(merged.clip_calls) == [1] * UPDATES
    assert merged.grad_norm_pre_clip is not None and base.grad_norm_pre_clip is not None
    assert min(base.grad_norm_pre_clip) > MAX_NORM  # the clip engages at every update
    c = compare(base, merged)
    assert c.verdict == "pass", [(k.name, k.detail) for k in c.checks]
    check = next(k for k in c.checks if k.name == "norms before clipping")
    assert check.status == "pass"


def test_a_clip_grad_norm_imported_by_name_is_seen_and_its_clean_loop_passes(tmp_path, base):
    """`from torch.nn.utils import clip_grad_norm_` before the Recorder opened holds torch's
    own function: it is seen through the private split clip it calls, with its norm."""
    merged = clip_loop(tmp_path / "merged", 4, split="by-name")
    assert list(merged.clip_calls) == [1] * UPDATES
    assert merged.grad_norm_pre_clip is not None
    assert np.allclose(merged.grad_norm_pre_clip, base.grad_norm_pre_clip, rtol=1e-4)
    assert compare(base, merged).verdict == "pass"


@pytest.mark.parametrize("split", [True, "by-name"])
@pytest.mark.parametrize(
    ("bug", "expected", "calls"),
    [("clip-every-micro", "clip-per-micro", 4), ("clip-over-k", "clip-threshold", 1)],
)
def test_split_api_clipping_bugs_are_named(tmp_path, base, bug, expected, calls, split):
    """Were `cross-sample-loss` and `loss-scale` (with a wrong fix) while the split API went
    unseen: no clip counts, no norm before clipping; so were they with `clip_grad_norm_`
    imported by name."""
    merged = clip_loop(tmp_path / "merged", 4, bug=bug, split=split)
    assert list(merged.clip_calls) == [calls] * UPDATES
    c = compare(base, merged)
    assert c.verdict == "fail"
    assert c.diagnosis[0].code == expected


@pytest.fixture(scope="module")
def value_base(tmp_path_factory):
    return clip_loop(tmp_path_factory.mktemp("clip") / "base", 1, split="value", max_norm=VALUE)


@pytest.mark.parametrize("split", ["value", "value-by-name"])
def test_a_clip_grad_value_imported_by_name_is_seen_and_its_clean_loop_passes(
    tmp_path, value_base, split
):
    """torch's own clip_grad_value_ (imported by name before the Recorder opened) is seen through
    the grouping it calls, with its clip value, once a call, as the module attribute's is."""
    merged = clip_loop(tmp_path / "merged", 4, split=split, max_norm=VALUE)
    assert list(merged.clip_calls) == [1] * UPDATES
    assert list(merged.clip_value) == [VALUE] * UPDATES
    assert compare(value_base, merged).verdict == "pass"


@pytest.mark.parametrize("split", ["value", "value-by-name"])
@pytest.mark.parametrize(
    ("bug", "expected", "calls"),
    [("clip-every-micro", "clip-per-micro", 4), ("clip-over-k", "clip-threshold", 1)],
)
def test_value_clipping_bugs_are_named(tmp_path, value_base, bug, expected, calls, split):
    """With clip_grad_value_ imported by name they were `cross-sample-loss` and `loss-scale` (a
    term of the loss divided by K): no clip was seen."""
    merged = clip_loop(tmp_path / "merged", 4, bug=bug, split=split, max_norm=VALUE)
    assert list(merged.clip_calls) == [calls] * UPDATES
    c = compare(value_base, merged)
    assert c.verdict == "fail"
    assert c.diagnosis[0].code == expected


@pytest.mark.parametrize("split", [True, False])
def test_a_merged_run_that_does_not_clip_is_named_clip_threshold(tmp_path, base, split):
    """It recorded no clip at all, and stepped with the norm the baseline had before clipping:
    it was `loss-scale`, with a fix about 1/K, at the ratio of the baseline's clip."""
    merged = clip_loop(tmp_path / "merged", 4, bug="no-clip", split=split)
    assert merged.grad_norm_pre_clip is None
    c = compare(base, merged)
    assert c.verdict == "fail"
    assert c.diagnosis[0].code == "clip-threshold", [d.code for d in c.diagnosis]
    assert "did not clip" in c.diagnosis[0].message


def test_a_gradient_divided_after_a_clip_that_never_engaged_is_no_clip(tmp_path):
    """max_norm 10 against norms of 0.4-0.6: the gradient divided by K after the clip (a hook
    or callback) read as a clip 'at another max_norm'; each update's norm shrank by the same
    1/K, where a clip brings each to its one max_norm."""
    base = clip_loop(tmp_path / "base", 1, max_norm=10.0)
    merged = clip_loop(tmp_path / "merged", 4, bug="divided-after-clip", max_norm=10.0)
    c = compare(base, merged)
    assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale", [
        (d.code, d.message) for d in c.diagnosis
    ]


def test_clip_grad_norm_calling_the_split_api_is_counted_once(tmp_path, monkeypatch):
    """A torch whose clip_grad_norm_ calls the public clip_grads_with_norm_ (2.13 calls a
    private alias) reports one clip: the inner call is the outer one's."""
    clip_grad = torch.nn.utils.clip_grad
    monkeypatch.setattr(
        clip_grad,
        "_clip_grads_with_norm_",
        lambda *args, **kwargs: torch.nn.utils.clip_grads_with_norm_(*args, **kwargs),
    )
    merged = clip_loop(tmp_path / "merged", 2, split=False)
    assert list(merged.clip_calls) == [1] * UPDATES
    merged = clip_loop(tmp_path / "every", 2, split=False, bug="clip-every-micro")
    assert list(merged.clip_calls) == [2] * UPDATES


@pytest.mark.parametrize("split", [True, False])
def test_a_loss_not_divided_by_k_under_a_clip_fails_without_a_reference(tmp_path, base, split):
    """The clip always engages: the stepped gradients and the weights agree, and only the norms
    before clipping, 4 times the baseline's, keep the scale (passed before, exit 0)."""
    merged = clip_loop(tmp_path / "merged", 4, bug="no-loss-scale", split=split)
    c = compare(base, merged)
    status = {k.name: k.status for k in c.checks}
    assert status["gradients"] == status["weights"] == "pass"
    assert status["norms before clipping"] == "fail"
    assert c.verdict == "fail" and c.first_divergence["update"] == 0
    found = scale_before_clip(c)
    assert found is not None and found.code == "loss-scale"
    assert found.evidence["pre_clip_ratio"] == pytest.approx(4, rel=1e-3)


def test_a_loss_not_divided_by_k_under_a_clip_is_named_loss_scale(tmp_path, base):
    """The diagnosis names it first (judge/diagnose.py lists `scale_before_clip`)."""
    merged = clip_loop(tmp_path / "merged", 4, bug="no-loss-scale")
    assert compare(base, merged).diagnosis[0].code == "loss-scale"


def test_with_a_reference_the_hidden_scale_is_named_loss_scale(tmp_path, base):
    """With a float64 reference the clipped gradients fail by their measured noise (clip's
    1e-6 in `max_norm / (norm + 1e-6)` tells a norm 4 times as large), and the norms before
    clipping name the scale (was `cross-sample-loss` with the split API)."""
    ref = clip_loop(tmp_path / "ref", 1, float64=True)
    merged = clip_loop(tmp_path / "merged", 4, bug="no-loss-scale")
    c = compare(base, merged, reference=ref)
    status = {k.name: k.status for k in c.checks}
    assert status["norms before clipping"] == "fail"
    assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale"
    clean = compare(base, clip_loop(tmp_path / "clean", 4), reference=ref)
    assert clean.verdict == "pass"
    assert {k.name: k.status for k in clean.checks}["norms before clipping"] == "pass"


def test_with_a_reference_a_scale_the_clip_hid_within_noise_still_fails(tmp_path):
    """Larger norms (inputs 30 times): the clipped gradients agree within their measured noise,
    and only the norms before clipping, 4 times the baseline's, keep the scale. Against a
    reference this passed (exit 0) where the same runs without one failed."""
    base = clip_loop(tmp_path / "base", 1, inputs=30.0)
    ref = clip_loop(tmp_path / "ref", 1, float64=True, inputs=30.0)
    merged = clip_loop(tmp_path / "merged", 4, bug="no-loss-scale", inputs=30.0)
    c = compare(base, merged, reference=ref)
    status = {k.name: k.status for k in c.checks}
    assert status["gradients"] == status["weights"] == "pass"
    assert status["norms before clipping"] == "fail"
    assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale"
    assert compare(base, merged).verdict == "fail"  # no reference: fixed tolerances
    clean = clip_loop(tmp_path / "clean", 4, inputs=30.0)
    assert compare(base, clean, reference=ref).verdict == "pass"


ITEMS = [57, 36, 30, 56]  # tokens per micro-batch, as the probe's Llama window 0 held them


def _mean_loss_runs(path, along: float, config: dict | None = None) -> tuple:
    """Numpy-written runs of the Trainer's commonest bug: each micro-batch's own mean loss, never
    divided by K=4, under a clip at 1.0 that only the merged run reaches (the baseline's norm is
    0.67). Micro-batch j holds ITEMS[j] tokens and contributes (n_j/N)(μ + ν_j): the baseline
    steps with Σ_j of those, the merged run with Σ_j (N/n_j)·those, clipped. ν_j weighs each
    micro-batch's own direction so that the baseline's sum keeps none of it (the merged run's
    unclipped gradient is 4μ plus what the reweighting adds); `along` puts part of it along μ,
    which moves the merged run's fitted size away from 4."""
    rng, n = np.random.default_rng(0), sum(ITEMS)
    parts = []
    for _ in range(3):
        mu = rng.normal(size=(8, 16))
        v = rng.normal(size=mu.shape)
        v -= (v * mu).sum() / (mu * mu).sum() * mu
        v *= np.linalg.norm(mu) / np.linalg.norm(v)
        share = [n / (4 * m) - 1 for m in ITEMS]  # Σ_j m_j·share_j = 0
        nus = [s * (4.5 * v + along * mu) + 0.1 * rng.normal(size=mu.shape) for s in share]
        parts.append([m / n * (mu + nu) for m, nu in zip(ITEMS, nus, strict=True)])
    runs = []
    for k in (1, 4):
        w, ws, gs, pre = np.zeros((8, 16)), [], [], []
        for micro in parts:
            size = 0.67 / np.linalg.norm(sum(micro))
            weights = [1.0] * 4 if k == 1 else [n / m for m in ITEMS]
            g = size * sum(a * x for a, x in zip(weights, micro, strict=True))
            pre.append(float(np.linalg.norm(g)))
            g = g * min(1.0, 1.0 / pre[-1])
            w = w - 1e-2 * g
            ws.append({"w": w.astype(np.float32)})
            gs.append({"w": g.astype(np.float32)})
        written = write_run(
            path / f"k{k}",
            accum_steps=k,
            micro_losses=[2.0] * (3 * k),  # each micro-batch's own mean, as a loop records it
            micro_items=[n] * 3 if k == 1 else ITEMS * 3,
            init_weights={"w": np.zeros((8, 16), dtype=np.float32)},
            update_weights=ws,
            grads=gs,
            grad_norm_pre_clip=pre,
            config=config,
        )
        runs.append(read_run_dir(written))
    return compare(*runs)


@pytest.mark.parametrize("along", [0.0, 1.5])
def test_a_mean_loss_not_divided_by_k_that_only_the_merged_run_clips_names_both(tmp_path, along):
    """The norm before clipping is 4.25 (along 0) or 4.71 times the baseline's, beyond 5% of
    K: the reweighting adds to the norm. With the recorded clip undone (the stepped gradient
    times its norm before over after) the fit is 4.00 (or 4.48: the reweighting moved it, as
    near K as it turns the gradient across): `loss-scale` first, `token-normalization` beside
    it, which no longer says the means were divided by K (was `token-normalization` alone)."""
    c = _mean_loss_runs(tmp_path, along)
    assert [d.code for d in c.diagnosis] == ["loss-scale", "token-normalization"]
    scale, rest = c.diagnosis
    assert scale.evidence["expected_ratio"] == 4
    assert scale.evidence["size_ratio"] == pytest.approx(4.48 if along else 4.0, abs=0.01)
    assert "before clipping (fitted, the recorded clip undone)" in scale.message
    assert "divided by K" not in rest.message and "its own mean" in rest.message
    assert "model_accepts_loss_kwargs" not in scale.fix


def test_a_trainer_runs_loss_scale_fix_is_said_for_the_trainer(tmp_path):
    """A run recorded through the Trainer integration (config `framework: transformers`) never
    calls backward() itself: the fix names what a Trainer user changes."""
    c = _mean_loss_runs(tmp_path, 0.0, config={"framework": "transformers"})
    fix = c.diagnosis[0].fix
    assert c.diagnosis[0].code == "loss-scale" and "backward()" not in fix
    assert "compute_loss_func" in fix and "num_items_in_batch" in fix
    assert "trainer.model_accepts_loss_kwargs = False" in fix


@pytest.mark.parametrize("bug", [None, "clip-every-micro"])
def test_a_clip_in_the_merged_run_only_is_named(tmp_path, bug):
    """The baseline never clips (its Recorder saw no clip call); the merged run clips once per
    update, or at every micro-step at a max_norm its window's last clip reaches: `clip-
    threshold`, the merged clip's calls said (the same in a loop of its own was `loss-scale`,
    0.094 times, or `cross-sample-loss`). Neither run clipping passes."""
    unclipped = clip_loop(tmp_path / "base", 1, bug="no-clip")
    assert unclipped.clip_calls is None and unclipped.micro_grad_writes is not None
    c = compare(unclipped, clip_loop(tmp_path / "merged", K, bug=bug, max_norm=0.05))
    assert c.diagnosis[0].code == "clip-threshold", [(d.code, d.message) for d in c.diagnosis]
    calls = {"merged": 1 if bug is None else K, "baseline": 0}
    assert c.diagnosis[0].evidence["clip_calls"] == calls
    neither = compare(unclipped, clip_loop(tmp_path / "neither", K, bug="no-clip"))
    assert neither.verdict == "pass", [(d.code, d.message) for d in neither.diagnosis]


def test_a_clip_inside_the_window_that_never_engages_is_named(tmp_path):
    """max_norm 10 against norms of 0.4-0.6, clipped after every backward: this run trained
    alike, but the first window whose partial sum reaches max_norm clips otherwise. The counts
    name it (it was `unexplained`, by the first clip's norm of a partial sum, 0.34 times the
    baseline's: that norm is no longer compared with the baseline's whole one)."""
    base = clip_loop(tmp_path / "base", 1, max_norm=10.0)
    merged = clip_loop(tmp_path / "merged", 4, bug="clip-every-micro", max_norm=10.0)
    c = compare(base, merged)
    assert all(d.ok for r in c.results for d in (*r.weights, *r.grads))
    checks = {k.name: k for k in c.checks}
    assert checks["clip calls per window"].status == "fail"
    assert checks["norms before clipping"].status == "not checked"
    found = c.diagnosis[0]
    assert c.verdict == "fail" and found.code == "clip-per-micro", [
        (d.code, d.message) for d in c.diagnosis
    ]
    assert "No clip engaged in this run" in found.message
    assert found.evidence["clip_calls"] == {"merged": K, "baseline": 1}


def test_a_norm_read_at_an_infinite_max_norm_is_no_clip(tmp_path, base):
    """`clip_grad_norm_(params, inf)` after every backward logs the norm and clips nothing: not
    counted as a clip, so a loop that clips once per update beside it passes; where nothing
    clips, the window's norm is its last read, after the last backward (the baseline's)."""
    merged = clip_loop(tmp_path / "merged", K, bug="read-every-micro")
    assert list(merged.clip_calls) == [1] * UPDATES
    c = compare(base, merged)
    assert c.verdict == "pass", [(k.name, k.detail) for k in c.checks]
    read = clip_loop(tmp_path / "read", 1, bug="read-only")
    reads = clip_loop(tmp_path / "reads", K, bug="read-only-every-micro")
    assert read.clip_calls is None and reads.clip_calls is None
    np.testing.assert_allclose(reads.grad_norm_pre_clip, read.grad_norm_pre_clip, rtol=1e-5)
    c = compare(read, reads)
    assert c.verdict == "pass", [(k.name, k.detail) for k in c.checks]
    assert next(k for k in c.checks if k.name == "norms before clipping").status == "pass"
