"""The transformers Trainer, recorded by `attach(trainer, out)`: a tiny GPT-2 built from a config
on padded token data (examples/frameworks/transformers_trainer.py, the README's commands)."""

from __future__ import annotations

import json

import pytest
import torch

from gradalign.errors import BadInput
from gradalign.runs.reader import read_run_dir

from .frameworks import all_checked, example, judged, recorded, require

require("transformers")
hf = example("transformers_trainer")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The README's command: baseline, its float64 reference and the clean K=4 run."""
    return recorded(tmp_path_factory, hf)


def test_clean_trainer_run_passes_against_its_float64_reference(root, cli):
    result = cli("compare", root / "k1", root / "k4", "--json", root / "r.json")
    assert result.code == 0, result.out
    report = json.loads((root / "r.json").read_text())
    assert report["reference"] and [d["code"] for d in report["diagnosis"]] == ["within-noise"]
    assert set(all_checked(root / "k1", root / "k4").values()) == {"pass"}
    verdict, _, worst = judged(root / "k1", root / "k4")
    assert verdict == "pass" and worst < 0.6, worst


def test_the_run_holds_what_the_trainer_never_shows_its_callbacks(root):
    run = read_run_dir(root / "k4")
    assert run.accum_steps == 4 and run.updates == hf.UPDATES
    items = run.micro_items.reshape(hf.UPDATES, 4)
    assert len(set(items[0])) > 1  # padded micro-batches hold different numbers of tokens
    base = read_run_dir(root / "k1")
    assert (items.sum(axis=1) == base.micro_items).all()  # the same tokens per update
    # the Trainer's num_items_in_batch (attach checks every window against it): transformers
    # 5.17 shifts the labels it counts only for a model whose class name says ForCausalLM, so
    # GPT2LMHeadModel counts every real label (and Llama, below, one fewer per sequence)
    rows = hf.token_rows(hf.BATCH * hf.UPDATES)
    assert items.sum() == sum(len(r["input_ids"]) for r in rows)
    manifest = json.loads((root / "k1" / "manifest.json").read_text())
    assert manifest["reference"] == "../k1-fp64"
    assert manifest["config"]["framework"] == "transformers"
    assert base.grad_norm_pre_clip is not None and base.lr is not None
    assert (base.optimizer_steps == 1).all()


@pytest.mark.parametrize(
    "bug, code",
    [
        ("token-mean", "token-normalization"),
        ("double-scale", "loss-scale"),
        ("scheduler-per-batch", "lr-schedule"),
    ],
)
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_a_broken_trainer_run_fails_with_its_code(root, bug, code):
    runs = hf.record_all(root, bug)
    verdict, codes, worst = judged(runs["k1"], runs[f"k4-{bug}"])
    assert verdict == "fail" and codes[:1] == [code], codes
    assert worst > 1e3


def test_a_llama_trainer_run_counts_the_tokens_it_predicts(tmp_path):
    runs = hf.record_all(tmp_path, model="llama")
    verdict, codes, worst = judged(runs["k1"], runs["k4"])
    assert verdict == "pass" and not codes and worst < 0.6, (codes, worst)
    rows = hf.token_rows(hf.BATCH * hf.UPDATES)
    items = read_run_dir(runs["k4"]).micro_items
    assert items.sum() == sum(len(r["input_ids"]) - 1 for r in rows)


def test_the_float64_reference_keeps_the_loss_in_float64():
    from gradalign.record.integrations.transformers_float64 import float64_reference

    model = float64_reference(hf.tiny_gpt2())
    batch = hf.collate(hf.token_rows(4))
    loss = model(**batch).loss
    assert loss.dtype == torch.float64  # transformers' own loss would round it to float32


def test_attach_refuses_what_is_not_a_trainer(tmp_path):
    from gradalign.record.integrations.transformers import attach

    with pytest.raises(BadInput, match=r"transformers\.Trainer"):
        attach(object(), tmp_path / "run")


def test_a_failed_train_leaves_no_run_behind(tmp_path, monkeypatch):
    def broken(rows):
        raise RuntimeError("collator failed")

    monkeypatch.setattr(hf, "collate", broken)
    with pytest.raises(RuntimeError, match="collator failed"):
        hf.train(tmp_path / "k4", 4)
    assert list(tmp_path.iterdir()) == []
