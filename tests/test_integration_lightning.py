"""Lightning, recorded by `GradalignCallback`: a tiny GRU language model on generated token data
(examples/frameworks/lightning_fit.py, the README's commands), automatic and manual optimization."""

from __future__ import annotations

import json

import pytest

from gradalign.errors import BadInput
from gradalign.runs.reader import read_run_dir

from .frameworks import all_checked, example, judged, recorded, require

require("lightning")
pl = example("lightning_fit")
pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning", "ignore::DeprecationWarning", "ignore:.*treespec, LeafSpec"
)


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """Every micro-batch holds as many tokens: `accumulate_grad_batches` is right."""
    return recorded(tmp_path_factory, pl, "--data", "full")


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    return recorded(tmp_path_factory, pl)


def test_clean_lightning_run_passes_against_its_float64_reference(full, cli):
    result = cli("compare", full / "k1", full / "k4", "--json", full / "r.json")
    assert result.code == 0, result.out
    assert json.loads((full / "r.json").read_text())["reference"]
    assert set(all_checked(full / "k1", full / "k4").values()) == {"pass"}
    verdict, _, worst = judged(full / "k1", full / "k4")
    assert verdict == "pass" and worst < 0.6, worst
    run = read_run_dir(full / "k4")
    assert run.micro_items is not None and run.micro_data is not None
    assert read_run_dir(full / "k1-fp64").dtype == "float64"  # precision="64-true"


def test_lightning_default_accumulation_on_padded_tokens_is_token_normalization(padded, cli):
    result = cli("compare", padded / "k1", padded / "k4")
    assert result.code == 1
    verdict, codes, worst = judged(padded / "k1", padded / "k4")
    assert verdict == "fail" and codes[:1] == ["token-normalization"] and worst > 1e3


def test_manual_optimization_normalized_by_window_tokens_passes(padded):
    runs = pl.record_all(padded, manual=True)
    verdict, codes, worst = judged(runs["k1"], runs["k4-manual"])
    assert verdict == "pass" and not codes and worst < 0.6, (codes, worst)


@pytest.mark.parametrize(
    "bug, code", [("double-scale", "loss-scale"), ("scheduler-per-batch", "lr-schedule")]
)
def test_a_broken_lightning_run_fails_with_its_code(full, bug, code):
    runs = pl.record_all(full, padded=False, bug=bug)
    verdict, codes, worst = judged(runs["k1"], runs[f"k4-{bug}"])
    assert verdict == "fail" and codes[:1] == [code], codes
    assert worst > 1e3


def test_manual_optimization_needs_k(tmp_path, monkeypatch):
    real = pl.GradalignCallback
    monkeypatch.setattr(pl, "GradalignCallback", lambda out, **kw: real(out, items="labels"))
    with pytest.raises(BadInput, match="accum_steps=K"):
        pl.train(tmp_path / "k4", 4, manual=True)
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_items_rule_is_refused(tmp_path):
    with pytest.raises(BadInput, match="items must be one of"):
        pl.GradalignCallback(tmp_path / "run", items="tokens")
