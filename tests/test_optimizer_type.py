"""Runs stepped by optimizers of other torch.optim classes are another training whatever K is:
`optimizer-settings` names the classes, first (an SGD baseline against an Adam run at the same lr
was `unexplained`, at Adam's own lr `lr-scaled`). Adam and AdamW are one algorithm (their
decoupled weight decay is a setting), and a class no torch.optim optimizer has (a wrapper's) is
not compared."""

from __future__ import annotations

import json

import pytest

from gradalign import api

from .conftest import SMALL


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("optimizer_type")
    api.record_baseline(SMALL.replace(accum_steps=1), root / "sgd")
    return {
        "root": root,
        "sgd": root / "sgd",
        "adam-0.1": api.record_merged(SMALL.replace(optimizer="adam", lr=0.1), root / "adam-0.1"),
        "adam": api.record_merged(SMALL.replace(optimizer="adam"), root / "adam"),
    }


@pytest.mark.parametrize("merged", ["adam-0.1", "adam"])
def test_another_optimizer_class_is_named_first(runs, merged):
    first = api.compare(runs["sgd"], runs[merged]).diagnosis[0]
    assert first.code == "optimizer-settings", first.message
    assert "SGD in the baseline, Adam in the merged run" in first.message


@pytest.mark.parametrize("kind", ["ZeroRedundancyOptimizer", "AdamW"])
def test_a_wrappers_class_or_adamw_beside_adam_is_not_a_class_apart(runs, tmp_path, kind):
    """An Adam run whose loss is not divided by K, its manifest naming another class against
    an Adam baseline: still `loss-scale` first."""
    import shutil

    base = runs["root"] / "adam-base"
    if not base.exists():
        api.record_baseline(SMALL.replace(accum_steps=1, optimizer="adam"), base)
        api.record_merged(
            SMALL.replace(optimizer="adam"), runs["root"] / "bug", fault="no-loss-scale"
        )
    copy = shutil.copytree(runs["root"] / "bug", tmp_path / "renamed")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["optimizer"]["type"] = kind
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert api.compare(base, copy).diagnosis[0].code == "loss-scale"
