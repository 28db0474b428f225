"""The clip threshold the Recorder sees (`update/clip_max_norm`): a merged run that clips at
max_norm / K fails where no clip engaged in this run (the first update whose norm reaches the
lower threshold would step otherwise), named `clip-threshold`; equal thresholds pass. And a
clip of partial sums where the baseline's clip of the whole did not engage is `clip-per-micro`."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign.judge.compare import compare

from .devices import DEVICES
from .test_clip_api import UPDATES, K, clip_loop
from .zoo_runs import _one_thread_judge

UNREACHED = 10.0  # the loop's norms are 0.43-0.58: neither 10 nor 10 / K engages


@pytest.mark.parametrize("split", [True, False, "by-name"])
def test_a_max_norm_divided_by_k_fails_where_no_clip_engaged(tmp_path, split):
    base = clip_loop(tmp_path / "base", 1, split=split, max_norm=UNREACHED)
    assert np.array_equal(base.clip_max_norm, np.full(UPDATES, UNREACHED))
    clean = compare(base, clip_loop(tmp_path / "clean", K, split=split, max_norm=UNREACHED))
    assert clean.verdict == "pass", [(d.code, d.message) for d in clean.diagnosis]
    assert {ch.name: ch.status for ch in clean.checks}["clip threshold"] == "pass"
    bug = clip_loop(tmp_path / "bug", K, split=split, max_norm=UNREACHED, bug="clip-over-k")
    c = compare(base, bug)
    assert c.verdict == "fail" and c.diagnosis[0].code == "clip-threshold", c.diagnosis
    found = c.diagnosis[0]
    assert found.evidence["engaged_updates"] == 0 and found.evidence["ratio"] == 1 / K
    assert "= 1/K" in found.message and "no clip engaged in this run" in found.message
    assert {ch.name: ch.status for ch in c.checks}["clip threshold"] == "fail"
    assert all(r.grads and all(d.ok for d in r.grads) for r in c.results)  # numbers agree


def test_partial_sums_clipped_where_the_whole_did_not_reach_the_clip_are_clip_per_micro(
    tmp_path,
):
    """bench/model_zoo.py --bug clip-every-micro --clip 1.0, run 173028 (a residual CNN under
    RMSprop, K=4): the baseline's norm stayed below 1.0 at update 0 while partial sums passed
    it; read as clipping nowhere in the baseline, the run was named `cross-sample-loss`."""
    row = _one_thread_judge(
        tmp_path / "bug", "resnet", "rmsprop", 4, 173028, "clip-every-micro", clip=1.0
    )
    assert row["codes"][:1] == ["clip-per-micro"], row


@pytest.mark.parametrize("device", DEVICES)
def test_a_threshold_given_as_a_tensor_is_recorded_on_any_device(tmp_path, device):
    """`clip_grad_norm_(params, torch.tensor(0.5, device=...))`: the threshold is kept where it
    lies (on a GPU, a float64 copy there, read once when the run is written: no host sync per
    step) and recorded as on the CPU; a threshold of several elements is no number."""
    import torch

    import gradalign
    from gradalign.record.clipping import _threshold
    from gradalign.runs.reader import read_run_dir

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    limit = torch.tensor(0.5, device=device)
    x = torch.randn(4 * 8, 6, device=device)
    with gradalign.Recorder(tmp_path / "run", model, opt, accum_steps=2) as rec:
        for u in range(4):
            for j in range(2):
                rows = slice(u * 8 + j * 4, u * 8 + (j + 1) * 4)
                loss = model(x[rows]).pow(2).mean()
                (loss / 2).backward()
                rec.micro(loss, batch=x[rows])
            torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
            opt.step()
            opt.zero_grad()
            rec.update()
    assert np.array_equal(read_run_dir(tmp_path / "run").clip_max_norm, np.full(4, 0.5))
    assert _threshold(torch.ones(2, device=device)) is None
