"""What the framework integrations share, without any framework: batch facts, stated losses,
the Recorder's gradient capture around an optimizer closure, the extras, the Paddle example."""

from __future__ import annotations

import ast
import importlib.util
import py_compile
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gradalign
from gradalign.errors import BadInput
from gradalign.record.facts import data_digest
from gradalign.record.integrations import batches
from gradalign.record.integrations.micro_loss import MicroLoss
from gradalign.runs.reader import read_run_dir

from .frameworks import run_readme

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = {"transformers", "lightning", "accelerate"}


def padded(rows: list[list[int]], width: int) -> dict[str, torch.Tensor]:
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


ROWS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]


def test_a_batch_digests_alike_however_it_is_padded():
    whole = padded(ROWS, 6)
    halves = [padded(ROWS[:2], 3), padded(ROWS[2:], 4)]

    def digest(b: dict) -> int:
        return data_digest(batches.tensors(b), pad=batches.PAD, mask=batches.attention_mask(b))

    assert digest(whole) == sum(digest(h) for h in halves)
    assert data_digest(whole) != sum(data_digest(h) for h in halves)  # the whole dict does not


def _seq2seq(sources: list[list[int]], targets: list[list[int]]) -> dict[str, torch.Tensor]:
    """A batch as DataCollatorForSeq2Seq(tokenizer, model=model) makes it: the sources padded
    with their mask, the targets padded with -100, and decoder_input_ids the labels shifted
    right behind a start token 0 (-100 read as the pad 0)."""
    batch = padded(sources, max(map(len, sources)))
    width = max(map(len, targets))
    labels = torch.full((len(targets), width), -100)
    for i, row in enumerate(targets):
        labels[i, : len(row)] = torch.tensor(row)
    start = torch.zeros((len(targets), 1), dtype=torch.long)
    decoder = torch.cat([start, labels[:, :-1].clamp(min=0)], dim=1)
    return {**batch, "labels": labels, "decoder_input_ids": decoder}


def test_a_seq2seq_batch_digests_alike_however_its_labels_are_padded():
    """A target that fills its micro-batch's width loses its last token from decoder_input_ids
    there (shifted out) and keeps it in the batch of B: the digest leaves out what the collator
    derived from the labels, which name the same samples (a clean T5 run was `data-order`)."""
    sources, targets = [[5, 6], [7], [8, 9, 4], [3]], [[21, 22, 23], [24], [25], [26, 27]]
    whole = _seq2seq(sources, targets)
    halves = [_seq2seq(sources[:2], targets[:2]), _seq2seq(sources[2:], targets[2:])]

    def digest(b: dict, keep=batches.digested) -> int:
        return data_digest(keep(b), pad=batches.PAD, mask=batches.attention_mask(b))

    assert digest(whole) == sum(digest(h) for h in halves)
    assert digest(whole, batches.tensors) != sum(digest(h, batches.tensors) for h in halves)
    other = _seq2seq(sources, [[21, 22, 23], [24], [25], [26, 28]])  # another sample's target
    assert digest(other) != digest(whole)


def test_items_rules_count_what_a_loss_averages_over():
    batch = padded(ROWS, 5)
    assert batches.count_items(batch, "labels") == 10
    assert batches.count_items(batch, "causal-lm") == 6  # one prediction fewer per sequence
    assert batches.count_items(batch, "samples") == 4
    assert batches.count_items((batch["input_ids"], batch["labels"]), "labels") == 10
    assert batches.count_items(batch, lambda b: 7) == 7
    assert batches.count_items(batch, None) is None
    with pytest.raises(BadInput, match="needs a batch with labels"):
        batches.count_items({"input_ids": batch["input_ids"]}, "causal-lm")
    with pytest.raises(BadInput, match="items must be one of"):
        batches.check_items_rule("tokens")


def test_non_tensors_are_left_out_of_a_batch():
    batch = {"input_ids": torch.ones(2, 3), "text": ["a", "b"], "meta": {"id": 3}}
    assert list(batches.tensors(batch)) == ["input_ids"]


def test_a_stated_loss_is_a_mean_or_a_sum_with_its_items():
    assert MicroLoss.of(None, 6.0, 3).loss_sum == 6.0
    assert float(MicroLoss.scaled_mean(torch.tensor(0.5), 4).loss) == 2.0
    with pytest.raises(BadInput, match="either loss"):
        MicroLoss.of(1.0, 2.0, 3)
    with pytest.raises(BadInput, match="needs items"):
        MicroLoss.of(None, 2.0, None)


@pytest.mark.parametrize("positional", [True, False])
def test_the_gradient_is_captured_after_the_closure_step_runs(tmp_path, positional):
    """Lightning runs forward and backward inside optimizer.step(closure): the stepped gradient
    exists only once the closure has returned."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3)
    with gradalign.Recorder(tmp_path / "run", model, optimizer) as rec:

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            rec.micro(loss)
            return loss

        optimizer.step(closure) if positional else optimizer.step(closure=closure)
        stepped = model.weight.grad.clone()
        rec.update()
    captured = read_run_dir(tmp_path / "run").grads(0)["weight"]
    assert np.array_equal(captured, stepped.numpy())


def test_the_core_install_stays_light_and_each_extra_is_pinned():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not FRAMEWORKS & {d.split(">")[0].split("=")[0] for d in project["dependencies"]}
    extras = project["optional-dependencies"]
    pins = {
        line.split("==")[0].lower()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line
    }
    for name in FRAMEWORKS:
        assert extras[name], name
        for requirement in extras[name]:
            assert requirement.split(">")[0].split("=")[0].lower() in pins, requirement


def test_importing_the_integrations_package_imports_no_framework():
    code = (
        "import sys, gradalign.record.integrations.batches, "
        "gradalign.record.integrations.micro_loss\n"
        f"print(sorted(set({sorted(FRAMEWORKS)!r}) & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "heading, script",
    [
        ("transformers Trainer", "transformers_trainer.py"),
        ("Lightning", "lightning_fit.py"),
        ("accelerate", "accelerate_loop.py"),
    ],
)
def test_the_readme_two_lines_are_the_ones_its_example_runs(heading, script):
    text = (ROOT / "README.md").read_text()
    section = text[text.index(f"### {heading}\n") :]
    block = section[section.index("```python\n") + 10 : section.index("```\n", 10)]
    example = (ROOT / "examples" / "frameworks" / script).read_text()
    imports = [line for line in block.splitlines() if line.startswith("from gradalign")]
    assert imports and all(line in example for line in imports), imports
    call = block.split("\n\n")[1].split("(")[0].split("=")[-1].strip()  # attach, record, ...
    assert f"{call}(" in example, call


PADDLE_EXAMPLE = ROOT / "examples" / "paddle_gradient_merge.py"


def test_the_paddle_example_compiles_and_needs_neither_torch_nor_paddle_to_import(tmp_path):
    py_compile.compile(str(PADDLE_EXAMPLE), cfile=str(tmp_path / "x.pyc"), doraise=True)
    tree = ast.parse(PADDLE_EXAMPLE.read_text())
    top = {
        alias.name.split(".")[0]
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not {"paddle", "torch"} & top, top


@pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason="paddle is not installed")
def test_the_readme_paddle_commands_record_runs_the_judge_reads(tmp_path):
    results = run_readme("PaddlePaddle (the run format, numpy only)", tmp_path)
    assert results["runs/paddle/k4"][2] < 0.6
    assert results["runs/paddle/k4-no-loss-scale"][1][:1] == ["loss-scale"]
