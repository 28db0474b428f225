"""An embedding with `scale_grad_by_freq=True` divides each row's gradient by its index's count in
the batch; a micro-batch counts only its own indices, so accumulation cannot reproduce the batch.
The Recorder notes such layers (`model.grad_by_frequency`) and `cross-sample-loss` names them
and the flag; a model without the flag is accumulated exactly and passes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import train

UPDATES, BATCH, VOCAB = 4, 32, 12


def embedding_loop(out, k: int, by_frequency: bool, float64: bool = False):
    """A bag-of-tokens classifier over 3 tokens a sample, SGD, the loss divided by K."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(VOCAB, 6, scale_grad_by_freq=by_frequency), nn.Flatten(), nn.Linear(18, 3)
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (UPDATES * BATCH, 3), generator=g)
    y = x.sum(dim=1) % 3
    if float64:
        model = model.double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(out, model, opt, x, y, k, batch=BATCH)
    return read_run_dir(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("freq")
    return {
        (flag, k, f64): embedding_loop(root / f"{flag}-{k}-{f64}", k, flag, f64)
        for flag in (True, False)
        for k, f64 in ((1, False), (1, True), (4, False))
    }


@pytest.mark.parametrize("reference", [True, False])
def test_counted_per_micro_batch_is_named_with_the_flag(runs, reference):
    ref = runs[True, 1, True] if reference else None
    c = compare(runs[True, 1, False], runs[True, 4, False], reference=ref)
    assert c.verdict == "fail"
    first = c.diagnosis[0]
    assert first.code == "cross-sample-loss", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["grad_by_frequency"] == ["0"]
    assert "scale_grad_by_freq=True (0)" in first.message
    assert first.fix.startswith("set scale_grad_by_freq=False")


@pytest.mark.parametrize("reference", [True, False])
def test_without_the_flag_passes_and_says_nothing_of_it(runs, reference):
    ref = runs[False, 1, True] if reference else None
    c = compare(runs[False, 1, False], runs[False, 4, False], reference=ref)
    assert c.verdict == "pass", [(d.code, d.message) for d in c.diagnosis]
    assert "grad_by_frequency" not in runs[False, 4, False].model_facts
