"""accelerate, recorded by `record(accelerator, model, optimizer, out)` around an unchanged
`accelerator.accumulate(model)` loop: a tiny GPT-2 on generated token data
(examples/frameworks/accelerate_loop.py, the README's commands)."""

from __future__ import annotations

import json

import pytest

from gradalign.errors import BadInput
from gradalign.runs.reader import read_run_dir

from .frameworks import all_checked, example, judged, recorded, require

require("accelerate")
require("transformers")
acc = example("accelerate_loop")
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """Every micro-batch holds as many tokens: accelerate's mean / K is right."""
    return recorded(tmp_path_factory, acc, "--data", "full")


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    return recorded(tmp_path_factory, acc)


def test_clean_accelerate_loop_passes_against_its_float64_reference(full, cli):
    result = cli("compare", full / "k1", full / "k4", "--json", full / "r.json")
    assert result.code == 0, result.out
    assert json.loads((full / "r.json").read_text())["reference"]
    assert set(all_checked(full / "k1", full / "k4").values()) == {"pass"}
    verdict, _, worst = judged(full / "k1", full / "k4")
    assert verdict == "pass" and worst < 0.6, worst


def test_accelerate_default_accumulation_on_padded_tokens_is_token_normalization(padded, cli):
    assert cli("compare", padded / "k1", padded / "k4").code == 1
    verdict, codes, worst = judged(padded / "k1", padded / "k4")
    assert verdict == "fail" and codes[:1] == ["token-normalization"] and worst > 1e3
    items = read_run_dir(padded / "k4").micro_items.reshape(acc.UPDATES, 4)
    assert len(set(items[0])) > 1  # from the labels the model's forward received


def test_a_loop_normalized_by_window_tokens_passes(padded):
    runs = acc.record_all(padded, tokens=True)
    verdict, codes, worst = judged(runs["k1"], runs["k4-tokens"])
    assert verdict == "pass" and not codes and worst < 0.6, (codes, worst)


@pytest.mark.parametrize(
    "bug, code", [("double-scale", "loss-scale"), ("scheduler-per-batch", "lr-schedule")]
)
def test_a_broken_accelerate_loop_fails_with_its_code(full, bug, code):
    runs = acc.record_all(full, padded=False, bug=bug)
    verdict, codes, worst = judged(runs["k1"], runs[f"k4-{bug}"])
    assert verdict == "fail" and codes[:1] == [code], codes
    assert worst > 1e3


def test_record_refuses_what_is_not_an_accelerator(tmp_path):
    from gradalign.record.integrations.accelerate import record

    with pytest.raises(BadInput, match=r"accelerate\.Accelerator"):
        record(object(), None, None, tmp_path / "run")


def test_an_interrupted_loop_leaves_no_run_and_unhooks_the_accelerator(tmp_path):
    import torch
    from accelerate import Accelerator

    from gradalign.record.integrations.accelerate import record

    accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    backward = accelerator.backward
    with pytest.raises(KeyboardInterrupt), record(accelerator, model, optimizer, tmp_path / "r"):
        accelerator.backward(model(torch.ones(2, 3)).pow(2).mean())
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    assert accelerator.backward == backward
    assert not model._forward_pre_hooks
