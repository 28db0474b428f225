"""Lightning, recorded by `GradalignCallback`: the README's commands run as written
(examples/frameworks/lightning_fit.py: a tiny GRU language model on generated token data), in
automatic and manual optimization, and the broken variants."""

from __future__ import annotations

import pytest

from gradalign.errors import BadInput
from gradalign.runs.reader import read_run_dir

from .frameworks import all_checked, example, judged, require, run_readme

require("lightning")
pl = example("lightning_fit")
pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning", "ignore::DeprecationWarning", "ignore:.*treespec, LeafSpec"
)


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("readme-pl")
    return cwd / "runs", run_readme("Lightning", cwd)


def test_the_readme_commands_pass_clean_runs_and_name_lightnings_mean_over_k(readme):
    runs, results = readme
    assert results["runs/pl/k4"][2] < 0.6  # every micro-batch as many tokens
    assert results["runs/pl-pad/k4"][1][:1] == ["token-normalization"]  # padded: Lightning's K
    assert results["runs/pl-pad/k4"][2] > 1e3
    assert results["runs/pl-pad/k4-manual"][2] < 0.6  # divided by the window's tokens
    assert set(all_checked(runs / "pl" / "k1", runs / "pl" / "k4").values()) == {"pass"}
    assert read_run_dir(runs / "pl" / "k1-fp64").dtype == "float64"  # precision="64-true"


@pytest.mark.parametrize(
    "bug, code", [("double-scale", "loss-scale"), ("scheduler-per-batch", "lr-schedule")]
)
def test_a_broken_lightning_run_fails_with_its_code(readme, bug, code):
    runs = pl.record_all(readme[0] / "pl", padded=False, bug=bug)
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
