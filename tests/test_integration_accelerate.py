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
    # the losses read off the backward are the gradient's scale: no logging bug beside it
    assert "loss-averaging" not in codes, codes


def test_a_block_without_a_backward_is_a_micro_batch_missing(readme):
    """An `accumulate` block that forwards its micro-batch and never calls
    `accelerator.backward`: no micro-step, its samples left out (they were joined to the next
    block's, and the window read as `token-normalization` over 92, 184, 92 tokens)."""
    from gradalign import api

    runs = acc.record_all(readme[0] / "acc", padded=False, bug="skip-backward")
    found = api.compare(runs["k1"], runs["k4-skip-backward"]).diagnosis
    assert [d.code for d in found][:1] == ["micro-batch-missing"], [d.message for d in found]
    assert read_run_dir(runs["k4-skip-backward"]).sizes.tolist() == [3] * acc.UPDATES


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


def _plain_loop(out, k, loop="manual", *, dtype=None, reference=None):
    """A loop without `accumulate` blocks, stepping every K batches: "manual" (accelerate's
    backward divides by its K), "no-sync" (the same, non-final micro-steps under
    `accelerator.no_sync`), "doc" (accelerate's docs: `Accelerator()`, loss / K, K given to
    record), "step-every" (a bug: the optimizer stepped after every micro-batch)."""
    import contextlib

    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from torch.utils.data import DataLoader

    from gradalign.record.integrations.accelerate import record
    from gradalign.record.integrations.transformers_float64 import float64_reference

    tiny_data = example("tiny_data")
    doc = loop.startswith("doc")
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(gradient_accumulation_steps=1 if doc else k, cpu=True)
    model = float64_reference(tiny_data.tiny_gpt2()) if dtype else tiny_data.tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rows = tiny_data.token_rows(16 * acc.UPDATES, padded=False)
    loader = DataLoader(rows, batch_size=16 // k, collate_fn=tiny_data.collate)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    given = {"accum_steps": k} if loop == "doc" else {}
    with record(
        accelerator, model, optimizer, out, items="causal-lm", reference=reference, **given
    ):
        for step, batch in enumerate(loader):
            last = (step + 1) % k == 0
            quiet = loop == "no-sync" and not last
            with accelerator.no_sync(model) if quiet else contextlib.nullcontext():
                loss = model(**batch).loss
                accelerator.backward(loss / k if doc else loss)
            if last or loop == "step-every":
                optimizer.step()
                optimizer.zero_grad()
    return out


@pytest.fixture(scope="module")
def plain_baseline(tmp_path_factory):
    import torch

    root = tmp_path_factory.mktemp("plain")
    _plain_loop(root / "k1", 1, reference="../k1-fp64")
    _plain_loop(root / "k1-fp64", 1, dtype=torch.float64)
    return root


@pytest.mark.parametrize("loop", ["manual", "no-sync", "doc"])
def test_a_loop_without_accumulate_blocks_closes_windows_where_it_steps(plain_baseline, loop):
    """No `accumulate` block: `sync_gradients` stays true, so a window closes at the optimizer
    step after its K-th micro-step; `Accelerator()` without accumulation takes K from
    `accum_steps`, reading the loss / K the loop backpropagates. Each passes."""
    merged = _plain_loop(plain_baseline / f"k4-{loop}", 4, loop)
    verdict, codes, worst = judged(plain_baseline / "k1", merged)
    assert verdict == "pass" and worst < 1, (codes, worst)
    run = read_run_dir(merged)
    assert (run.accum_steps, run.updates, run.micro_steps) == (4, acc.UPDATES, 4 * acc.UPDATES)


def test_a_loop_without_accumulate_blocks_stepping_every_micro_batch_is_named(plain_baseline):
    """The optimizer stepped after every micro-batch: its windows still hold K micro-steps, and
    `step-in-window` is named (a step with fewer than K micro-steps does not end a window)."""
    merged = _plain_loop(plain_baseline / "k4-step-every", 4, "step-every")
    verdict, codes, _ = judged(plain_baseline / "k1", merged)
    assert verdict == "fail" and "step-in-window" in codes[:2], codes
    assert read_run_dir(merged).updates == acc.UPDATES


def test_k_of_a_loop_whose_accelerator_does_not_accumulate_is_asked_for(tmp_path):
    """`Accelerator()` and four backward calls per step without `accum_steps`: refused with one
    line that names it, and no run is left behind."""
    with pytest.raises(BadInput, match=r"4 backward calls .* accum_steps=K"):
        _plain_loop(tmp_path / "k4", 4, "doc-without-k")
    assert list(tmp_path.iterdir()) == []
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from gradalign.record.integrations.accelerate import record

    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(BadInput, match="accum_steps=4 but the Accelerator accumulates 2"):
        record(accelerator, model, optimizer, tmp_path / "r", accum_steps=4)


def test_a_plain_backward_is_refused_where_the_optimizer_steps(tmp_path):
    """`loss.backward()` instead of `accelerator.backward(loss)`: the recording saw no backward
    before the step, and says which call to make (it said "call update()", which an accelerate
    loop never calls)."""
    import torch
    from accelerate import Accelerator

    from gradalign.record.integrations.accelerate import record

    accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    refused = pytest.raises(BadInput, match=r"call accelerator.backward\(loss\), not loss.back")
    with refused, record(accelerator, model, optimizer, tmp_path / "r"):
        for _ in range(2):
            with accelerator.accumulate(model):
                model(torch.ones(2, 3)).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
    assert list(tmp_path.iterdir()) == []
