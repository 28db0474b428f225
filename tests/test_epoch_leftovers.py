"""A loop that counts windows by `(i + 1) % K` over a loader whose length is no multiple of K
backpropagates each epoch's leftover micro-batch without stepping. Cleared by a zero_grad() at
the next epoch's start, it trains nothing, as the baseline's dropped short batch: the Recorder
counts the micro-steps a zero_grad() discarded (`update/discarded_micro_steps`), the reader
leaves them out (runs/discarded.py), and the run passes with a note. Left in `.grad`, it trains
with the next window: `window-bookkeeping`, saying that its gradient was carried in."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gradalign
from gradalign.errors import BadInput
from gradalign.judge.compare import compare
from gradalign.runs.discarded import drop_discarded
from gradalign.runs.reader import read_run_dir

from .conftest import rewrite_tensor_file
from .recorded_loop import classifier

BATCH, K, EPOCHS, SAMPLES = 32, 4, 3, 104  # 3 batches an epoch; 13 micro-batches of 8


def loop(
    out,
    k: int,
    clear_each_epoch: bool,
    dropout: str | None = None,
    by_hand: bool = False,
    create_graph: bool = False,
) -> None:
    """`dropout`: "drawn", a dropout layer whose leftover forward draws masks the baseline never
    draws; "forked", the leftover forwarded inside torch.random.fork_rng(). `by_hand`: the
    epoch's clear is `p.grad = None` for every parameter (no zero_grad() call to see);
    `create_graph`: each backward builds a graph of the gradient (a new `.grad` every time)."""
    model, x, y = classifier(SAMPLES)
    if dropout is not None:
        model.insert(2, nn.Dropout(0.1))
    whole = SAMPLES // (BATCH // k) // k * k  # the micro-batches that fill windows
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH // k, drop_last=True)
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for _ in range(EPOCHS):
            if clear_each_epoch and by_hand:
                for p in model.parameters():
                    p.grad = None
            elif clear_each_epoch:
                opt.zero_grad()
            for i, (xb, yb) in enumerate(loader):
                with torch.random.fork_rng(enabled=dropout == "forked" and i >= whole):
                    loss = nn.functional.cross_entropy(model(xb), yb)
                (loss / k).backward(create_graph=create_graph)
                rec.micro(loss.detach(), batch=(xb, yb))
                if (i + 1) % k == 0:
                    opt.step()
                    rec.update()
                    opt.zero_grad()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("leftovers")
    loop(root / "base", 1, True)
    for clear in (True, False):
        loop(root / f"merged-{clear}", K, clear)
    loop(root / "merged-by-hand", K, True, by_hand=True)
    loop(root / "base-graph", 1, True, create_graph=True)
    loop(root / "merged-graph", K, True, create_graph=True)
    loop(root / "base-dropout", 1, True, "drawn")
    for dropout in ("drawn", "forked"):
        loop(root / f"merged-{dropout}", K, True, dropout)
    return root


def test_leftovers_cleared_at_each_epoch_start_pass_with_a_note(runs):
    merged = read_run_dir(runs / "merged-True")
    assert merged.window_sizes is None and merged.updates == 3 * EPOCHS
    c = compare(read_run_dir(runs / "base"), merged)
    assert c.verdict == "pass", [(d.code, d.message) for d in c.diagnosis]
    assert any("had their gradient cleared" in note for note in c.notes), c.notes


@pytest.mark.parametrize(("merged", "base"), [("by-hand", "base"), ("graph", "base-graph")])
def test_leftovers_cleared_by_hand_or_under_create_graph_pass(runs, merged, base):
    """`p.grad = None` by hand: the Recorder sees every gradient gone or another tensor at the
    next micro-step (`GradWrites`; was `window-bookkeeping`, "carried into the next"). Under
    create_graph=True every backward makes a new `.grad`, which is no clear."""
    run = read_run_dir(runs / f"merged-{merged}")
    assert run.window_sizes is None and run.updates == 3 * EPOCHS
    c = compare(read_run_dir(runs / base), run)
    assert c.verdict == "pass", [(d.code, d.message) for d in c.diagnosis]
    assert any("had their gradient cleared" in note for note in c.notes), c.notes


def test_leftovers_that_drew_dropout_masks_are_named_with_fork_rng(runs):
    base = read_run_dir(runs / "base-dropout")
    c = compare(base, read_run_dir(runs / "merged-drawn"))
    first = c.diagnosis[0]
    assert first.code == "dropout-rng", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["windows_after_drawn_leftovers"] == [3, 6]
    assert "leftover" in first.message and "fork_rng" in first.fix
    forked = compare(base, read_run_dir(runs / "merged-forked"))
    assert forked.verdict == "pass", [(d.code, d.message) for d in forked.diagnosis]


def test_leftovers_carried_into_the_next_window_are_named(runs):
    c = compare(read_run_dir(runs / "base"), read_run_dir(runs / "merged-False"))
    first = c.diagnosis[0]
    assert first.code == "window-bookkeeping", [(d.code, d.message) for d in c.diagnosis]
    assert "window 3 holds 5 micro-steps" in first.message
    assert "carried into the next" in first.message and "epoch's start" in first.fix


def test_a_dropped_micro_step_hands_its_counts_to_the_next(runs):
    run = read_run_dir(runs / "merged-False")  # windows of 4, 5, 4, ... none discarded
    sizes = run.sizes
    discarded = np.zeros(run.updates, dtype=np.int64)
    discarded[3] = 1
    counts = np.arange(run.micro_steps, dtype=np.int64)
    run.micro_step_counts = counts
    kept = drop_discarded(run, discarded)
    start = int(run.starts[3])
    assert kept.micro_steps == run.micro_steps - 1 and kept.sizes[3] == K
    assert kept.micro_step_counts[start] == counts[start] + counts[start + 1]
    np.testing.assert_array_equal(kept.micro_loss[start:], run.micro_loss[start + 1 :])
    assert int(sizes[3]) == K + 1  # the input was left as it was


def test_a_window_left_with_other_than_k_keeps_what_it_recorded(runs):
    run = read_run_dir(runs / "merged-False")
    discarded = np.zeros(run.updates, dtype=np.int64)
    discarded[0] = K - 1  # as zero_grad() after every micro-step: one micro-step left
    kept = drop_discarded(run, discarded)
    assert kept.micro_steps == run.micro_steps and kept.notes == run.notes
    assert kept.cleared_inside.tolist() == discarded.tolist()  # for zero-grad-in-window


def test_a_discarded_count_beyond_its_window_is_refused(runs, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(runs / "merged-True", target)

    def edit(series):
        series["update/discarded_micro_steps"][0] = 99

    rewrite_tensor_file(target, "series.safetensors", edit)
    with pytest.raises(BadInput, match="discarded_micro_steps holds a count"):
        read_run_dir(target)
