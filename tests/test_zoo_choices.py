"""Clean runs of the zoo's tiny mixture of experts under bfloat16 autocast whose tokens' routes
went otherwise in one run (judge/choices.py), which the noise model once failed: each passes
both judges now, and without the rule it names it first fails where it did (else this machine's
rounding took another path: skipped; tests/test_choice_parted.py holds the logic on any
machine). bench/model_zoo.py's loops, one thread, as the bench."""

from __future__ import annotations

from gradalign.judge.choices import WHOLE_COSINE

from .zoo_runs import _followed, one_thread, zoo


def _bfloat16_runs(root, optimizer: str, k: int, seed: int, **loop):
    """The float64 reference, and the baseline and the merged run under bfloat16 autocast."""
    with one_thread():
        zoo.record(root / "ref", "moe", optimizer, 1, seed, float64=True, **loop)
        both = {"autocast": "bfloat16", **loop}
        zoo.record(root / "base", "moe", optimizer, 1, seed, reference="../ref", **both)
        zoo.record(root / "merged", "moe", optimizer, k, seed, **both)
    return root


def test_runs_parted_at_a_token_s_route_pass(tmp_path, monkeypatch):
    """Model zoo run 186399 (RMSprop, K=8): a token routed otherwise at update 3, then at update
    7 expert 2's gradients 34% and 25% off (two more tokens), every weight within its noise,
    the model's gradient turned to a cosine of 0.9988: without a choice's limits (1/factor and
    WHOLE_COSINE, as after kinks) it fails at update 7."""
    root = _bfloat16_runs(tmp_path, "rmsprop", 8, 186399)
    _followed(root, monkeypatch, "gradalign.judge.kinks.limits", 7, r"update\(s\) 7", _kinks)


def _kinks(choice: bool, factor: float) -> tuple[float, float]:
    """`choices.limits` as after kinks alone, whatever the jump."""
    return 1 / factor, WHOLE_COSINE


def test_biases_beside_a_passing_token_s_share_pass(tmp_path, monkeypatch):
    """Model zoo run 190511 (Adam with eps 1e-6, K=48, micro-batches of unequal sizes, 20
    updates): at update 19 only two experts' second biases failed, along their weights' errors,
    which passed at about five times their noise, rank one: without reading the passing weights
    as the choice's evidence it fails at update 19."""
    root = _bfloat16_runs(tmp_path, "adam-eps6", 48, 190511, updates=20, uneven=True)
    _followed(root, monkeypatch, "gradalign.judge.kinks.anchors", 19, "update 19", lambda *a: {})
