"""Sparse gradients (`nn.Embedding(sparse=True)`) are recorded as their dense equivalents, in
full and sketch mode, and judged like any other run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import gradalign
from gradalign import api
from gradalign.runs.reader import read_run_dir

VOCAB, SEQ, CLASSES, BATCH, UPDATES = 24, 6, 3, 16, 4


def sparse_loop(
    out,
    k: int,
    *,
    bug: str | None = None,
    optimizer: str = "sgd",
    dtype: torch.dtype = torch.float32,
    **recorder,
) -> list[np.ndarray]:
    """A loop whose Embedding has sparse gradients; returns the dense embedding gradient that
    each update stepped with. `bug="no-loss-scale"`: each micro-loss is not divided by K."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(VOCAB, 8, sparse=True), nn.Flatten(), nn.Linear(8 * SEQ, CLASSES)
    ).to(dtype)
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.5)
        if optimizer == "sgd"
        else torch.optim.Adagrad(model.parameters(), lr=0.1)
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (BATCH * UPDATES, SEQ), generator=g)  # repeated tokens
    y = x[:, 0] % CLASSES
    stepped = []
    with gradalign.Recorder(out, model, opt, accum_steps=k, updates=UPDATES, **recorder) as rec:
        for update in range(UPDATES):
            for rows in torch.arange(update * BATCH, (update + 1) * BATCH).chunk(k):
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss if bug == "no-loss-scale" else loss / k).backward()
                rec.micro(loss, batch=(x[rows], y[rows]))
            assert model[0].weight.grad.is_sparse
            stepped.append(model[0].weight.grad.to_dense().numpy().copy())
            opt.step()
            rec.update()
            opt.zero_grad()
    return stepped


def error_codes(result) -> list[str]:
    return [d.code for d in result.diagnosis if d.severity == "error"]


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")  # torch's, inside Adagrad
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_sparse_gradients_are_recorded_dense_and_judged(tmp_path, optimizer):
    sparse_loop(tmp_path / "b", 1, optimizer=optimizer)
    sparse_loop(tmp_path / "r", 1, optimizer=optimizer, dtype=torch.float64)
    stepped = sparse_loop(tmp_path / "m", 4, optimizer=optimizer)
    sparse_loop(tmp_path / "bug", 4, optimizer=optimizer, bug="no-loss-scale")
    run = read_run_dir(tmp_path / "m")
    for update, grad in enumerate(stepped):
        np.testing.assert_array_equal(run.grads(update)["0.weight"], grad)
    clean = api.compare(tmp_path / "b", tmp_path / "m", reference=tmp_path / "r")
    assert clean.verdict == "pass", error_codes(clean)
    buggy = api.compare(tmp_path / "b", tmp_path / "bug", reference=tmp_path / "r")
    assert buggy.verdict == "fail"
    assert error_codes(buggy)[:1] == ["loss-scale"], error_codes(buggy)


def test_sparse_gradients_are_sketched(tmp_path):
    sketch = {"record": "sketch", "sketch_width": 31}  # 192 embedding elements: sketched
    sparse_loop(tmp_path / "b", 1, **sketch)
    stepped = sparse_loop(tmp_path / "m", 2, **sketch)
    sparse_loop(tmp_path / "bug", 2, bug="no-loss-scale", **sketch)
    run = read_run_dir(tmp_path / "m")
    assert run.snapshots == frozenset({0, UPDATES - 1})
    for update in run.snapshots:
        np.testing.assert_array_equal(run.grads(update)["0.weight"], stepped[update])
    clean = api.compare(tmp_path / "b", tmp_path / "m")
    assert clean.verdict == "pass", error_codes(clean)
    assert any(g.sketched for r in clean.results for g in r.grads if g.name == "0.weight")
    buggy = api.compare(tmp_path / "b", tmp_path / "bug")
    assert error_codes(buggy)[:1] == ["loss-scale"], error_codes(buggy)
