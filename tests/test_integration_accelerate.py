"""accelerate, recorded by `record(accelerator, model, optimizer, out)` around an unchanged
`accelerator.accumulate(model)` loop: the README's commands run as written
(examples/frameworks/accelerate_loop.py: a tiny GPT-2 on generated token data), and the broken
variants."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gradalign.errors import BadInput
from gradalign.runs.reader import read_run_dir

from .frameworks import EXAMPLES, all_checked, example, judged, require, run_readme

require("accelerate")
require("transformers")
acc = example("accelerate_loop")
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("readme-acc")
    return cwd / "runs", run_readme("accelerate", cwd)


def test_the_readme_commands_pass_clean_loops_and_name_accelerates_mean_over_k(readme):
    runs, results = readme
    assert results["runs/acc/k4"][2] < 0.6  # every micro-batch as many tokens
    assert results["runs/acc-pad/k4"][1][:1] == ["token-normalization"]
    assert results["runs/acc-pad/k4"][2] > 1e3
    assert results["runs/acc-pad/k4-tokens"][2] < 0.6  # divided by the window's tokens
    assert set(all_checked(runs / "acc" / "k1", runs / "acc" / "k4").values()) == {"pass"}
    items = read_run_dir(runs / "acc-pad" / "k4").micro_items.reshape(acc.UPDATES, 4)
    assert len(set(items[0])) > 1  # from the labels the model's forward received


@pytest.mark.parametrize(
    "bug, code", [("double-scale", "loss-scale"), ("scheduler-per-batch", "lr-schedule")]
)
def test_a_broken_accelerate_loop_fails_with_its_code(readme, bug, code):
    runs = acc.record_all(readme[0] / "acc", padded=False, bug=bug)
    verdict, codes, worst = judged(runs["k1"], runs[f"k4-{bug}"])
    assert verdict == "fail" and codes[:1] == [code], codes
    assert worst > 1e3


def test_bf16_mixed_precision_is_judged_against_its_float64_reference(tmp_path):
    """accelerate enters autocast inside the model's patched forward, after the model's own
    forward hooks: the layers see it. Its config's mixed_precision may differ in a reference.
    One process per run: accelerate keeps one mixed precision per process."""
    runs = [
        ("k1-fp64", 1, "dtype=torch.float64"),
        ("k1", 1, "mixed_precision='bf16', reference='../k1-fp64'"),
        ("k4", 4, "mixed_precision='bf16'"),
    ]
    for name, k, options in runs:
        code = (
            f"import sys, torch; sys.path.insert(0, {str(EXAMPLES)!r}); import accelerate_loop; "
            f"accelerate_loop.train(__import__('pathlib').Path({str(tmp_path / name)!r}), {k}, "
            f"padded=False, {options})"
        )
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    for run in ("k1", "k4"):
        assert read_run_dir(tmp_path / run).compute_dtype == "bfloat16"
    verdict, codes, worst = judged(tmp_path / "k1", tmp_path / "k4")
    assert verdict == "pass" and codes == [] and worst < 1, (codes, worst)


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


@pytest.mark.parametrize(
    ("split", "bug", "code"),
    [
        ("forward", None, None),
        ("backward", None, None),
        ("backward", "double-scale", "loss-scale"),
    ],
)
def test_a_micro_batch_in_two_parts_is_one_micro_step(tmp_path, split, bug, code):
    """A micro-batch forwarded in two chunks, or its loss backpropagated in two halves, inside
    one `accumulate` block: one micro-step (its samples joined, its losses added). Clean, it
    passes; with its loss divided by K twice it is still named."""
    import torch

    tiny_data = example("tiny_data")
    runs = tiny_data.record_all(
        tmp_path,
        acc.train,
        "k4",
        data={"padded": False, "split": split},
        reference={"dtype": torch.float64},
        changes={"bug": bug},
    )
    verdict, codes, _ = judged(runs["k1"], runs["k4"])
    assert (verdict, codes[:1]) == (("pass", []) if code is None else ("fail", [code])), codes
    assert read_run_dir(runs["k4"]).micro_steps == 4 * acc.UPDATES
