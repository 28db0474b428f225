"""The Recorder records what a loop did, whatever its shape: through optimizer wrappers, with
several param groups, a closure, no explicit grads(), summed losses, padded batches, and the
window bookkeeping of loops that get it wrong (recorded and judged, never refused mid-run)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import nn

import gradalign
from gradalign import api
from gradalign.runs.reader import read_run_dir


class Wrapper:
    """The least an optimizer wrapper is (accelerate's AcceleratedOptimizer holds `.optimizer`)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self, closure=None):
        return self.optimizer.step(closure)

    def zero_grad(self):
        self.optimizer.zero_grad()


def loop(out, k, *, wrap=False, groups=False, closure=False, micro_calls=None, updates=4,
         forget_update=False, loss_sum=False, lr_in_closure=False, flush=None):  # fmt: skip
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    params = list(model.parameters())
    spec = [{"params": params[:2]}, {"params": params[2:], "lr": 0.05}] if groups else params
    opt = torch.optim.Adam(spec, lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    handle = Wrapper(opt) if wrap else opt
    g = torch.Generator().manual_seed(1)
    x, y = (
        torch.randn(16 * updates, 6, generator=g),
        torch.randint(0, 3, (16 * updates,), generator=g),
    )
    size = 16 // k
    with gradalign.Recorder(out, model, handle, accum_steps=k) as rec:
        for u in range(updates):
            calls = micro_calls[u] if micro_calls else k
            for j in range(calls):
                rows = slice(u * 16 + j * size, u * 16 + (j + 1) * size)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows], reduction="sum")
                (loss / 16).backward()
                if loss_sum:
                    rec.micro(loss_sum=loss, items=size, batch=(x[rows], y[rows]))
                else:
                    rec.micro(loss / size, batch=(x[rows], y[rows]))
            nn.utils.clip_grad_norm_(model.parameters(), 0.01)

            def step_closure():
                if lr_in_closure:
                    sched.step()
                return None

            handle.step(step_closure) if closure else handle.step()
            if not (forget_update and u == 1):
                rec.update()
            if flush is None:
                handle.zero_grad()
            else:  # gradients zeroed (Adam steps on zeros all the same), or None
                opt.zero_grad(set_to_none=flush == "none")
        if flush is not None:  # "the remainder" stepped where none is left
            handle.step()
    return read_run_dir(out)


def test_a_wrapped_optimizer_is_recorded_like_the_bare_one(tmp_path):
    bare, wrapped = loop(tmp_path / "bare", 2), loop(tmp_path / "wrapped", 2, wrap=True)
    np.testing.assert_array_equal(bare.lr, wrapped.lr)
    np.testing.assert_array_equal(bare.optimizer_steps, wrapped.optimizer_steps)
    np.testing.assert_array_equal(bare.state_step, wrapped.state_step)
    assert list(wrapped.optimizer_steps) == [1, 1, 1, 1] and list(wrapped.state_step) == [
        1,
        2,
        3,
        4,
    ]


def test_every_param_groups_lr_is_read_after_the_step(tmp_path):
    run = loop(tmp_path / "g", 2, groups=True, closure=True, lr_in_closure=True)
    # the scheduler stepped inside the closure: each step's lr is the one after it ran
    np.testing.assert_allclose(run.lr_groups[:, 0], [0.005, 0.0025, 0.00125, 0.000625])
    np.testing.assert_allclose(run.lr_groups[:, 1], [0.025, 0.0125, 0.00625, 0.003125])
    np.testing.assert_allclose(run.lr, run.lr_groups[:, 0])


def test_a_param_group_added_during_the_run_is_recorded_and_judged(tmp_path):
    """A layer unfrozen at update 2 and given to the optimizer (`add_param_group`): the run
    closes, the new group's lr is NaN before it existed, and the merged run at K=2 passes."""

    def record(out, k):
        torch.manual_seed(0)
        body, extra = nn.Linear(6, 3), nn.Linear(6, 3)
        model = nn.ModuleDict({"body": body, "extra": extra})
        extra.requires_grad_(False)
        opt = torch.optim.Adam(body.parameters(), lr=1e-2)
        x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
        with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
            for u in range(4):
                if u == 2:
                    extra.requires_grad_(True)
                    opt.add_param_group({"params": list(extra.parameters()), "lr": 5e-3})
                for j in range(k):
                    rows = slice(u * 8 + j * 8 // k, u * 8 + (j + 1) * 8 // k)
                    xb, yb = x[rows], y[rows]
                    loss = nn.functional.cross_entropy(body(xb) + extra(xb), yb)
                    (loss / k).backward()
                    rec.micro(loss, batch=(xb, yb))
                opt.step()
                rec.update()
                opt.zero_grad()
        return out

    base, merged = record(tmp_path / "b", 1), record(tmp_path / "m", 2)
    groups = read_run_dir(base).lr_groups
    assert np.isnan(groups[:2, 1]).all() and groups[2:, 1].tolist() == [5e-3, 5e-3]
    assert api.compare(base, merged).verdict == "pass"


def test_without_grads_calls_the_stepped_gradient_and_the_clip_norm_are_captured(tmp_path):
    run = loop(tmp_path / "c", 2)
    assert run.has_grads and run.grad_norm_pre_clip is not None
    total = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in run.grads(0).values()))
    assert total == pytest.approx(0.01, rel=1e-5)  # what the optimizer stepped with: clipped
    assert run.grad_norm_pre_clip[0] > 0.01  # the norm clip_grad_norm_ saw before clipping


def test_a_summed_loss_with_its_items_is_the_mean(tmp_path):
    by_sum, by_mean = loop(tmp_path / "s", 2, loss_sum=True), loop(tmp_path / "m", 2)
    np.testing.assert_allclose(by_sum.micro_loss, by_mean.micro_loss, rtol=1e-12)
    assert list(by_sum.micro_items) == [8.0] * 8


def test_irregular_windows_are_recorded_and_judged(tmp_path):
    base = tmp_path / "b"
    loop(base, 1)
    irregular = loop(tmp_path / "m", 4, micro_calls=[4, 3, 4, 4], updates=4)
    assert list(irregular.sizes) == [4, 3, 4, 4]
    result = api.compare(base, tmp_path / "m")
    assert result.verdict == "fail"
    assert any(c.name == "window bookkeeping" and c.status == "fail" for c in result.checks)
    # one step per window, as many updates as the baseline: a micro-batch of window 1 left out
    (first, *_) = result.diagnosis
    assert first.code == "micro-batch-missing" and first.evidence["first_update"] == 1
    assert len(result.results) == 1  # window 1 no longer lines up: update 0 alone is judged


def epoch_loop(
    out,
    k,
    *,
    rows=60,
    batch=16,
    last_micro_drops=False,
    repeat=False,
    over_k=False,
    float64=False,
    told=None,
    micro_rows=None,
    epochs=1,
):
    """One epoch of `rows` samples in batches of `batch` (the last one short), each normalized
    by its own row count, as the frameworks close an epoch: K micro-batches of batch/K rows,
    fewer in the last window. `last_micro_drops`: the last window loses its last micro-batch;
    `repeat`: its last micro-batch repeats a sample (a sampler padding the data); `over_k`:
    each micro-batch's mean divided by K, right in full windows only; `told`: the accum_steps
    the Recorder is given (default K); `micro_rows`: each window's rows per micro-batch (its
    windows then vary, as a token budget makes them); `epochs`: the epoch over again."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    if float64:
        model = model.double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(rows, 6, generator=g), torch.randint(0, 3, (rows,), generator=g)
    x = x.double() if float64 else x
    size = batch // k
    with gradalign.Recorder(out, model, opt, accum_steps=told or k) as rec:
        for window, start in enumerate([*range(0, rows, batch)] * epochs):
            stop = min(start + batch, rows)
            size = micro_rows[window] if micro_rows else size
            micros = list(range(start, stop, size))
            if last_micro_drops and stop == rows:
                micros = micros[:-1]
            for a in micros:
                xb, yb = x[a : min(a + size, stop)], y[a : min(a + size, stop)]
                if repeat and stop == rows and a == micros[-1]:
                    xb, yb = torch.cat([xb, xb[:1]]), torch.cat([yb, yb[:1]])
                loss = nn.functional.cross_entropy(model(xb), yb, reduction="sum")
                (loss / len(yb) / k if over_k else loss / (stop - start)).backward()
                rec.micro(loss_sum=loss, items=len(yb), batch=(xb, yb))
            opt.step()
            rec.update()
            opt.zero_grad()
    return read_run_dir(out)


@pytest.mark.parametrize("told", [2, 8])
def test_a_recorder_told_another_k_than_the_loop_says_so(tmp_path, told):
    """The loop accumulates 4 micro-batches, the Recorder was told 2 (or 8): every window lines
    up with the baseline's batch, so the training passes, but the check said every window was
    "at the end of the data"."""
    epoch_loop(tmp_path / "b", 1)
    epoch_loop(tmp_path / "r", 1, float64=True)
    epoch_loop(tmp_path / "m", 4, told=told)
    result = api.compare(tmp_path / "b", tmp_path / "m", reference=tmp_path / "r")
    assert result.verdict == "pass", [(c.name, c.detail) for c in result.checks]
    bookkeeping = next(c for c in result.checks if c.name == "window bookkeeping")
    assert f"every window held 4 micro-steps, not the K={told}" in bookkeeping.detail
    assert "accum_steps=4" in bookkeeping.detail and "end of the data" not in bookkeeping.detail
    assert "once per window" not in bookkeeping.detail


def test_micro_called_once_per_window_is_said_to_hide_the_windows(tmp_path):
    """One micro() per window of K=4 (the window's batch): each window lines up with the
    baseline's batch, so it passes, and the check says nothing could look inside a window."""
    epoch_loop(tmp_path / "b", 1)
    epoch_loop(tmp_path / "m", 1, told=4)
    result = api.compare(tmp_path / "b", tmp_path / "m", reference="none")
    assert result.verdict == "pass", [(c.name, c.detail) for c in result.checks]
    bookkeeping = next(c for c in result.checks if c.name == "window bookkeeping")
    assert "every window held 1 micro-steps, not the K=4" in bookkeeping.detail
    assert "called micro() once per window" in bookkeeping.detail


def test_windows_that_vary_holding_their_baseline_batches_pass_and_are_said_to_vary(tmp_path):
    """Windows of 4, 2, 8, 2, 8 and 4 micro-batches (a token budget's), each its baseline batch:
    the same training; the check said the data ended in each of them, and listed three."""
    epoch_loop(tmp_path / "b", 1, rows=96)
    merged = epoch_loop(tmp_path / "m", 4, rows=96, micro_rows=[4, 8, 2, 8, 2, 4])
    assert list(merged.sizes) == [4, 2, 8, 2, 8, 4]
    result = api.compare(tmp_path / "b", tmp_path / "m", reference="none")
    assert result.verdict == "pass", [(c.name, c.detail) for c in result.checks]
    bookkeeping = next(c for c in result.checks if c.name == "window bookkeeping")
    assert "window(s) 1 (2), 2 (8), 3 (2) and 1 more (windows that vary" in bookkeeping.detail


def test_a_short_last_window_holding_the_baseline_batch_is_the_end_of_the_data(tmp_path):
    """60 rows in batches of 16: the baseline's last batch holds 12 rows, the merged run's last
    window 3 micro-batches of 4. That is the same training, judged to the end; a last window
    that lost a micro-batch lines up all the same, and the samples check names what it lacks."""
    epoch_loop(tmp_path / "b", 1)
    epoch_loop(tmp_path / "r", 1, float64=True)
    merged = epoch_loop(tmp_path / "m", 4)
    assert list(merged.sizes) == [4, 4, 4, 3]
    result = api.compare(tmp_path / "b", tmp_path / "m", reference=tmp_path / "r")
    assert result.verdict == "pass", [(c.name, c.detail) for c in result.checks]
    assert len(result.results) == 4  # the short window is judged too
    bookkeeping = next(c for c in result.checks if c.name == "window bookkeeping")
    assert "window(s) 3 (3)" in bookkeeping.detail and "end of the data" in bookkeeping.detail
    epoch_loop(tmp_path / "d", 4, last_micro_drops=True)
    dropped = api.compare(tmp_path / "b", tmp_path / "d", reference=tmp_path / "r")
    assert [d.code for d in dropped.diagnosis][:1] == ["data-order"]  # 8 of its 12 rows
    assert (
        "window 3" not in next(c for c in dropped.checks if c.name == "window bookkeeping").detail
    )
    samples = next(c for c in dropped.checks if c.name == "same samples per update")
    assert samples.status == "fail" and "1/4 windows" in samples.detail, samples.detail
    epoch_loop(tmp_path / "p", 4, repeat=True)
    padded = api.compare(tmp_path / "b", tmp_path / "p", reference=tmp_path / "r")
    assert [d.code for d in padded.diagnosis][:1] == ["data-order"]  # 13 rows, one twice
    epoch_loop(tmp_path / "k", 4, over_k=True)
    scaled = api.compare(tmp_path / "b", tmp_path / "k", reference=tmp_path / "r").diagnosis
    assert [d.code for d in scaled][:1] == ["loss-scale"]
    assert "in a window of 3 micro-step(s)" in scaled[0].message
    # drop_last=True drops a tail shorter than each loader's batch: the merged loader keeps rows
    assert "the merged loader's B/K keeps rows the baseline's drops" in scaled[0].fix


def test_an_epochs_short_window_before_the_last_is_the_baselines_short_batch(tmp_path):
    """Two epochs: the first ends in a window of 3 micro-steps holding the baseline's short
    batch (its samples agree), not a micro-batch left out; divided by K there, it is
    `loss-scale` (was named `micro-batch-missing`, a window short of a micro-batch)."""
    epoch_loop(tmp_path / "b", 1, epochs=2)
    epoch_loop(tmp_path / "r", 1, float64=True, epochs=2)
    clean = epoch_loop(tmp_path / "m", 4, epochs=2)
    assert clean.sizes.tolist() == [4, 4, 4, 3, 4, 4, 4, 3]
    assert api.compare(tmp_path / "b", tmp_path / "m", reference=tmp_path / "r").verdict == "pass"
    epoch_loop(tmp_path / "k", 4, over_k=True, epochs=2)
    scaled = api.compare(tmp_path / "b", tmp_path / "k", reference=tmp_path / "r").diagnosis
    assert [d.code for d in scaled][:1] == ["loss-scale"], [d.message for d in scaled]


def test_a_forgotten_update_is_recorded_and_judged(tmp_path):
    base = tmp_path / "b"
    loop(base, 1)
    forgot = loop(tmp_path / "m", 2, forget_update=True)
    assert forgot.updates == 3 and list(forgot.sizes) == [2, 4, 2]
    result = api.compare(base, tmp_path / "m")
    assert [d.code for d in result.diagnosis][:1] == ["window-bookkeeping"]


def test_a_step_after_the_last_update_is_judged(tmp_path):
    """An optimizer step after the last update() (a loop that "flushes" a last partial window
    where none is left) moves the weights the run ends with, which no snapshot holds: it passed
    as within noise. The Recorder counts it where it wrote the weights, and the judge names it;
    a step on no gradient (all None) writes nothing and is no fact."""
    base = tmp_path / "b"
    loop(base, 1)
    flushed = loop(tmp_path / "m", 2, flush="zeros")
    assert flushed.unclosed_steps == 1 and flushed.unclosed_micro_steps == 0
    result = api.compare(base, tmp_path / "m")
    found = result.diagnosis[0]
    assert found.code == "window-bookkeeping" and found.evidence["unclosed_steps"] == 1
    assert "stepped its optimizer 1 time(s) after its last update()" in found.message
    assert "only where micro-batches remain" in found.fix
    assert loop(tmp_path / "n", 2, flush="none").unclosed_steps == 0
    assert api.compare(base, tmp_path / "n").verdict == "pass"


def test_a_clean_loop_has_no_bookkeeping_facts(tmp_path):
    run = loop(tmp_path / "m", 2)
    assert run.window_sizes is None and run.unclosed_micro_steps == 0 and run.grads_calls is None
    inner = [int(s) for s in run.micro_step_counts]
    assert inner == [0, 0, 1, 0, 1, 0, 1, 0]  # each window's step is seen at the next window


def test_runs_of_different_lengths_with_a_schedule_are_judged_not_crashed(tmp_path):
    """A forgotten update() shifts the merged lr series against the baseline's: the lr
    signatures read only the updates that line up (this once ended in exit 3)."""
    loop(tmp_path / "b", 1, closure=True, lr_in_closure=True)
    loop(tmp_path / "m", 2, closure=True, lr_in_closure=True, forget_update=True)
    result = api.compare(tmp_path / "b", tmp_path / "m")
    assert result.verdict == "fail"
    assert [d.code for d in result.diagnosis][:1] == ["window-bookkeeping"]


def uneven_loop(out, k, *, per_micro_mean=False, float64=False):
    """Windows of 8 rows as micro-batches of 6 and 2 rows; the loss recorded as each
    micro-batch's mean with its samples (`batch=`), no item counts. Right: weighted by rows;
    `per_micro_mean`: each micro-batch's mean divided by K."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    model = model.double() if float64 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)
    x = x.double() if float64 else x
    bounds = [0, 8] if k == 1 else [0, 6, 8]
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for start in range(0, 32, 8):
            for a, b in itertools.pairwise(bounds):
                xb, yb = x[start + a : start + b], y[start + a : start + b]
                mean = nn.functional.cross_entropy(model(xb), yb)
                (mean / k if per_micro_mean else mean * (b - a) / 8).backward()
                rec.micro(mean, batch=(xb, yb))
            opt.step()
            rec.update()
            opt.zero_grad()


def test_micro_batches_of_unequal_rows_without_item_counts_are_read_by_their_samples(tmp_path):
    uneven_loop(tmp_path / "b", 1)
    uneven_loop(tmp_path / "r", 1, float64=True)
    uneven_loop(tmp_path / "m", 2)
    assert api.compare(tmp_path / "b", tmp_path / "m", reference=tmp_path / "r").verdict == "pass"
    uneven_loop(tmp_path / "bug", 2, per_micro_mean=True)
    found = api.compare(tmp_path / "b", tmp_path / "bug", reference=tmp_path / "r").diagnosis
    assert [d.code for d in found][:1] == ["token-normalization"]
    assert "hold 6, 2 samples" in found[0].message


def test_runs_that_read_other_numbers_of_samples_say_so_when_refused(tmp_path, cli):
    """A merged run whose last window crossed the end of the data without a step there was
    dropped: refused for its length, with no hint at the cause."""
    epoch_loop(tmp_path / "b", 1)
    epoch_loop(tmp_path / "m", 4, rows=48)
    result = cli("compare", tmp_path / "b", tmp_path / "m")
    assert result.code == 2, result.out
    assert "the baseline read 60 samples, the other 48" in result.err
    assert "step at the end of each pass over the data" in result.err


def test_windows_that_run_across_an_epochs_end_say_so_when_refused(tmp_path, cli):
    """Micro-batches counted over the whole run, not per epoch: a window runs on into the next
    pass, the runs read the same samples in other numbers of updates, and the refusal for
    their length named no cause."""

    def two_epochs(out, k: int) -> None:
        torch.manual_seed(0)
        model = nn.Linear(6, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(20, 6, generator=g), torch.randint(0, 3, (20,), generator=g)
        micro = 0
        with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
            for _epoch in range(2):
                for start in range(0, 20, 8 // k):
                    xb, yb = x[start : start + 8 // k], y[start : start + 8 // k]
                    (nn.functional.cross_entropy(model(xb), yb) / k).backward()
                    rec.micro(nn.functional.cross_entropy(model(xb), yb), batch=(xb, yb))
                    micro += 1
                    if micro % k == 0:  # the bug for K > 1: the count runs across epochs
                        opt.step()
                        rec.update()
                        opt.zero_grad()

    two_epochs(tmp_path / "b", 1)
    two_epochs(tmp_path / "m", 4)
    result = cli("compare", tmp_path / "b", tmp_path / "m")
    assert result.code == 2, result.out
    assert "both read 40 samples, but the other run's window 2 holds 8" in result.err
    assert "runs across an epoch's end" in result.err
