"""A float64 reference must be the baseline's training rerun: one recorded with another
optimizer (AdamW beside the baseline's SGD), other settings or another learning rate gives the
baseline's first gradient all the same (from the same weights and samples), and was accepted:
the noise floor it gave then stood as far apart as the two optimizers took the weights, and
the weight check could not fail. It is refused now, naming what differs."""

from __future__ import annotations

import pytest
import torch

from gradalign.errors import BadInput
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier, train

BATCH, K = 32, 4


def loop(out, k: int, float64: bool = False, optimizer: str = "sgd", reference=None):
    model, x, y = classifier(4 * BATCH)
    if float64:
        model, x = model.double(), x.double()
    opt = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        "adamw": lambda p: torch.optim.AdamW(p, lr=0.1),
        "decay": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
        "lr": lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.9),
    }[optimizer](model.parameters())
    train(out, model, opt, x, y, k, batch=BATCH, reference=reference)
    return read_run_dir(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerun")
    found = {"base": loop(root / "base", 1), "merged": loop(root / "merged", K)}
    for name in ("sgd", "adamw", "decay", "lr"):
        found[name] = loop(root / name, 1, float64=True, optimizer=name)
    return found


def test_a_rerun_with_the_baselines_optimizer_is_the_reference(runs):
    assert compare(runs["base"], runs["merged"], reference=runs["sgd"]).verdict == "pass"


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("adamw", "its optimizer is AdamW, the baseline's SGD"),
        ("decay", "its optimizer's weight_decay is 0.01, the baseline's 0"),
        ("lr", "its learning rate at update 0 is 0.2, the baseline's 0.1"),
    ],
)
def test_a_reference_of_another_optimizer_is_refused_naming_it(runs, name, said):
    with pytest.raises(BadInput, match="is another training") as refused:
        compare(runs["base"], runs["merged"], reference=runs[name])
    assert said in str(refused.value)
