"""Without a reference, an optimizer that scales each tensor's step by a norm over all its
elements (Adafactor's update clipping, LAMB's trust ratio) carries the rounding noise of
elements whose gradient is noise (an attention key bias) into the step of every other element:
both runs train the same and part by a common factor on that tensor. The `unexplained` message
names that shape (judge/coupled_steps.py); against a float64 rerun the pair passes. A bias
edited by hand parts otherwise (not by one factor) and is not read so."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bench.zoo_optimizers import Lamb
from gradalign.judge import scaled_step_divergence
from gradalign.judge.compare import compare
from gradalign.judge.coupled_steps import _scaled
from gradalign.runs.reader import read_run_dir
from gradalign.runs.store import SLICE

from .recorded_loop import train

BATCH, K, UPDATES = 32, 4, 8


class Attention(nn.Module):
    """One self-attention layer over 5 tokens of 8 features, then a 3-way head: softmax ignores
    the key bias, so its gradient is rounding noise."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)
        with torch.no_grad():
            self.attn.in_proj_bias.normal_(0, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x, x, x, need_weights=False)[0].mean(1))


def recorded(out, k: int, seed: int, dtype=torch.float32, edit: bool = False, lamb=False):
    """Adafactor (torch's, eps1 small enough that a noise gradient's update is as large as any
    other's, as transformers' Adafactor has it), or `lamb`; `edit`: the merged loop nudges the
    biases by hand after update 1's step (seed 1's Adafactor runs part by noise from update
    2)."""
    torch.manual_seed(seed)
    model = Attention().to(dtype)
    g = torch.Generator().manual_seed(7 + seed)
    x = torch.randn(BATCH * UPDATES, 5, 8, generator=g).to(dtype)
    y = torch.randint(0, 3, (BATCH * UPDATES,), generator=g)
    if lamb:
        opt = Lamb(model.parameters(), eps=1e-12, weight_decay=0.0)
    else:
        opt = torch.optim.Adafactor(model.parameters(), lr=1e-2, eps=(1e-15, 1e-3))
    bias = model.attn.in_proj_bias

    def nudged(update: int) -> None:
        if edit and update == 1:
            with torch.no_grad():
                bias.add_(1e-4 * torch.randn(bias.shape, generator=g).to(dtype))

    train(out, model, opt, x, y, k, batch=BATCH, after_step=nudged if k > 1 else None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("coupled")
    for seed in (0, 1):
        recorded(root / f"base{seed}", 1, seed)
        recorded(root / f"ref{seed}", 1, seed, torch.float64)
        recorded(root / f"merged{seed}", K, seed)
    recorded(root / "edited", K, 1, edit=True)
    recorded(root / "lamb-base", 1, 1, lamb=True)
    recorded(root / "lamb-merged", K, 1, lamb=True)
    return root


@pytest.mark.parametrize("seed", [0, 1])
def test_a_step_scaled_by_noise_is_named_without_a_reference(runs, seed):
    base, merged = read_run_dir(runs / f"base{seed}"), read_run_dir(runs / f"merged{seed}")
    c = compare(base, merged, reference=None)
    assert c.verdict == "fail"
    d = c.diagnosis[0]
    assert d.code == "unexplained"
    assert "attn.in_proj_bias: its elements whose gradient is rounding noise (8 of 24)" in d.message
    assert "times as far as the baseline's" in d.message
    assert "Adafactor's update clipping" in d.message
    judged = compare(base, merged, reference=read_run_dir(runs / f"ref{seed}"))
    assert judged.verdict == "pass"


def test_weights_edited_by_hand_are_not_read_as_a_scaled_step(runs):
    c = compare(read_run_dir(runs / "base1"), read_run_dir(runs / "edited"))
    assert c.verdict == "fail"
    assert [d.name for d in c.results[1].weights if not d.ok] == ["attn.in_proj_bias"]
    assert all("times as far as the baseline's" not in d.message for d in c.diagnosis)


def test_a_trust_ratio_moved_by_noise_is_no_carried_gradient(runs):
    """LAMB's trust ratio parts the runs at update 0 (on an AMD EPYC host; at update 1 on an
    Intel Xeon's rounding); their gradients at the next update then differ by what the weights
    apart make, 66.6% of it along the previous gradient at 1.0e-4 times it: no
    `grad-not-cleared` (it was named), and the step's common factor is said at the update the
    weights first part."""
    c = compare(read_run_dir(runs / "lamb-base"), read_run_dir(runs / "lamb-merged"))
    assert c.verdict == "fail"
    assert [d.code for d in c.diagnosis] == ["unexplained"]
    parted = next(r.update for r in c.results if any(not d.ok for d in r.weights))
    said = f"at update {parted}, attn.in_proj_bias: its elements whose gradient"
    assert said in c.diagnosis[0].message, c.diagnosis[0].message


def test_against_a_reference_a_step_scaled_by_noise_is_followed(tmp_path, monkeypatch):
    """transformers' Adafactor on the model zoo's GPT (run 180516, K=2): the merged run's
    attention bias stepped 0.98 times as far as the reference's at update 1 (the baseline's
    1.0003 times), and every gradient parted from update 2, far beyond the baseline's own
    distance from the reference. The divergence is followed from there at the size it parted
    by (judge/scaled_step_divergence.py) and the run passes, noted. Without that it fails,
    the message naming the shape against the reference, and the merged run recorded in float64
    passes against it (the fix the message gives)."""
    pytest.importorskip("transformers")
    from .zoo_runs import _compare, _one_thread_runs, one_thread, zoo

    root = _one_thread_runs(tmp_path, "gpt", "hf-adafactor", 2, 180516)
    with monkeypatch.context() as m:
        m.setattr("gradalign.judge.honest.follow_scaled_step", lambda *a, **k: [])
        c = _compare(root)
    if c.verdict == "pass":  # an Intel Xeon's rounding leaves the noise elements' steps alike
        pytest.skip("this machine's rounding took another path here (the runs do not part)")
    d = c.diagnosis[0]
    assert d.code == "unexplained"
    said = "at update 1, blocks.0.attn.in_proj_bias: its elements whose gradient is rounding"
    assert said in d.message
    assert "times as far as the reference's" in d.message
    assert "record the merged run in float64 as well" in (d.fix or "")
    for streaming in (False, True):
        followed = _compare(root, streaming)
        assert followed.verdict == "pass", [d.code for d in followed.diagnosis]
        note = "update 1: the merged run's step of blocks.0.attn.in_proj_bias stood 0.98"
        assert any(n.startswith(note) and "From update 2 on" in n for n in followed.notes)
    with one_thread():
        zoo.record(root / "merged64", "gpt", "hf-adafactor", 2, 180516, float64=True)
    base64 = read_run_dir(root / "ref")
    assert compare(base64, read_run_dir(root / "merged64")).verdict == "pass"


def test_a_factor_read_on_fewer_elements_than_it_can_be_checked_on_is_no_shape():
    """A normalization's weight of 16 elements under bfloat16, 15 of them noise (RMSprop, model
    zoo run 191028): one element's step fits any common factor exactly, so what is left is
    nothing and the shape was named for an optimizer that scales no step by a tensor's norm.
    The same noise beside 12 elements that all stepped 1.1 times as far is that shape."""
    rng = np.random.default_rng(0)

    def steps(signal: int) -> tuple[np.ndarray, ...]:
        size = 15 + signal
        gb = np.concatenate([rng.normal(0, 1e-6, 15), rng.normal(0, 1.0, signal)])
        gm = gb + np.concatenate([rng.normal(0, 1e-5, 15), np.zeros(signal)])
        pb = pm = np.zeros(size)
        db = np.concatenate([rng.normal(0, 1.0, 15), rng.normal(0, 0.5, signal)])
        dm = np.concatenate([rng.normal(0, 1.0, 15), 1.1 * db[15:]])
        return gb, gm, db, pb, dm, pm

    assert _scaled(_named(steps(1)), "t") is None
    reading = _scaled(_named(steps(12)), "t")
    assert reading is not None and reading[:2] == (15, 27)
    assert reading[3] == pytest.approx(1.1)


def _named(arrays: tuple[np.ndarray, ...]) -> tuple[dict, ...]:
    return tuple({"t": a} for a in arrays)


def test_a_tensor_of_many_slices_is_read_slice_by_slice_as_whole():
    """A tensor of 2.5 slices (runs/store.py SLICE), its noise-dominated elements in every
    slice: the same count, factor and residual as the tensor's sums read whole."""
    rng = np.random.default_rng(1)
    size = SLICE * 5 // 2
    noise = rng.random(size) < 0.2
    gb = np.where(noise, rng.normal(0, 1e-6, size), 1.0 + rng.random(size))
    gm = gb + np.where(noise, rng.normal(0, 1e-5, size), 0.0)
    db = rng.normal(0, 1.0, size)
    dm = np.where(noise, rng.normal(0, 1.0, size), 1.002 * db + rng.normal(0, 1e-7, size))
    zeros = np.zeros(size)
    reading = _scaled(_named((gb, gm, db, zeros, dm, zeros)), "t")
    assert reading is not None and reading[:2] == (int(noise.sum()), size)
    rest = ~noise
    factor = float(dm[rest] @ db[rest]) / float(db[rest] @ db[rest])
    left = np.linalg.norm(dm[rest] - factor * db[rest]) / np.linalg.norm(db[rest])
    assert reading[3] == pytest.approx(factor, rel=1e-12)
    assert reading[4] == pytest.approx(left, rel=1e-6)


def test_a_step_scaled_by_noise_before_the_first_failure_is_followed(tmp_path, monkeypatch):
    """Model zoo run 290804 (a GPT-NeoX under transformers' Adafactor, K=4, a clip and a
    schedule): at update 6 the merged run's layer-1 `query_key_value.bias` stepped 0.904 times
    as far as the reference's outside the 24 of its 96 elements whose gradient is noise (the
    baseline's step, below the update clipping's threshold, as the reference's); update 7 then
    failed, every gradient up to 0.15% of its norm off, `unexplained`. Followed from there at
    that size, both judges pass it with a note (else this machine's rounding took another path:
    skipped), and so does the judge of the runs recorded with sketches, which keep the bias
    whole. Read with a factor 1e-4 from 1, less than the runs parted by, it is not followed
    and the run fails. A gradient never cleared from update 7 on is still named."""
    pytest.importorskip("transformers")
    from .zoo_runs import _compare, _followed, _one_thread_judge

    loop = {"schedule": True, "clip": 1.0}
    root = tmp_path / "clean"
    _one_thread_judge(root, "hf-gptneox", "hf-adafactor", 4, 290804, None, **loop)
    _followed(
        root,
        monkeypatch,
        "gradalign.judge.honest.follow_scaled_step",
        7,
        r"update 6: the merged run's step of \S+query_key_value.bias stood 0.9",
    )
    sketched = _one_thread_judge(
        tmp_path / "sketched", "hf-gptneox", "hf-adafactor", 4, 290804, None, sketch=True, **loop
    )
    assert sketched["verdict"] == "pass", sketched  # the bias kept whole, 1-D
    real = scaled_step_divergence.scaled_steps

    def barely(*args):  # the same shape, its factor 1e-4 from 1: less than the runs parted by
        return [(*e[:5], 1.0 - 1e-4, e[6]) for e in real(*args)]

    monkeypatch.setattr(scaled_step_divergence, "scaled_steps", barely)
    assert _compare(root).verdict == "fail"
    monkeypatch.undo()
    row = _one_thread_judge(
        tmp_path / "bug", "hf-gptneox", "hf-adafactor", 4, 290804, "no-zero-grad", bug_from=7,
        **loop,
    )  # fmt: skip
    assert row["codes"][:1] == ["grad-not-cleared"], row
