"""Clean runs of the zoo's tiny mixture of experts under bfloat16 autocast whose tokens' routes
went otherwise in one run (judge/choices.py), which the noise model once failed: each passes
both judges now, and without the rule it names it first fails where it did (else this machine's
rounding took another path: skipped; tests/test_choice_parted.py holds the logic on any
machine). bench/model_zoo.py's loops, one thread, as the bench."""

from __future__ import annotations

import pytest

import gradalign
from gradalign import api
from gradalign.judge.choices import WHOLE_COSINE
from gradalign.judge.kink_pair import TensorPair
from gradalign.judge.kink_shape import many_rows
from gradalign.judge.signatures import failing, reweighting
from gradalign.judge.stepped_choice import route_clause, stepped_choice

from .zoo_runs import _compare, _followed, _runs, one_thread, zoo


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


def test_a_choice_stepped_with_at_once_is_said_where_the_run_fails(tmp_path):
    """Model zoo run 189658 (Adafactor, K=2, 20 updates): at update 4 only the router's weight
    and bias fail, each one input's share of the token the experts' passing gradients hold
    too, and the router's bias stepped out of its noise at once. The run still fails (each
    gradient off by more than a followed divergence could check); the `unexplained` message
    says where the runs parted at a choice. Gradients never cleared, failing with their
    weights from update 2, are no input's share and get no such clause."""
    root = _bfloat16_runs(tmp_path, "adafactor-eps", 2, 189658, updates=20)
    c = _compare(root)
    if c.verdict != "fail" or c.first_divergence["update"] != 4:
        pytest.skip(f"this machine's rounding took another path here ({c.first_divergence})")
    said = c.diagnosis[0].message
    assert c.diagnosis[0].code == "unexplained"
    assert "at update 4 every failing gradient holds one input's share (router.bias" in said
    assert "failed router.bias at once: the shape of a choice made per input" in said
    with one_thread():
        zoo.record(
            root / "merged", "moe", "adafactor-eps", 2, 189658, autocast="bfloat16",
            updates=20, bug="no-zero-grad", bug_from=1,
        )  # fmt: skip
    bug = _compare(root)
    assert bug.verdict == "fail" and bug.diagnosis[0].code == "grad-not-cleared"
    assert stepped_choice(bug, failing(bug)) is None


def test_a_choice_beside_other_failures_is_not_said_to_hold_them_all(tmp_path, monkeypatch):
    """Model zoo run 189974 (Adamax under float16 with its GradScaler, K=8): at update 2 eight
    of the fourteen failing gradients hold one input's share, and the router's and expert 3's
    hold two: two tokens joined expert 3, one from expert 0 and one from expert 2 (expert 3's
    first layer 64% in one outer product and 99.9% in two, the experts' first layers stacked
    99.9% in two, the router's error 99.9% in their inputs). Read across the separate experts
    (judge/siblings.py) every failing gradient holds an input's share, and the clause says so;
    without that reading it is not given."""
    with one_thread():
        both = {"autocast": "float16"}
        zoo.record(tmp_path / "base", "moe", "adamax", 1, 189974, reference="../ref", **both)
        skips = gradalign.skipped_updates(tmp_path / "base")  # the GradScaler's, as the bench
        zoo.record(tmp_path / "ref", "moe", "adamax", 1, 189974, float64=True, skip_updates=skips)
        zoo.record(tmp_path / "merged", "moe", "adamax", 8, 189974, **both)
    c = _compare(tmp_path)
    if c.verdict != "fail" or c.first_divergence["update"] != 2:
        pytest.skip(f"this machine's rounding took another path here ({c.first_divergence})")
    said = stepped_choice(c, failing(c))
    assert said is not None and "every failing gradient holds one input's share" in said
    monkeypatch.setattr(TensorPair, "_among_siblings", lambda *a: None)
    assert stepped_choice(_compare(tmp_path), failing(c)) is None


def test_one_input_s_share_over_micro_batches_of_many_samples_is_no_reweighting(
    tmp_path, monkeypatch
):
    """Model zoo run 190506 (Adagrad, K=4 over 2 to 24 samples, 20 updates): at update 3 a
    token routed to another expert leaves one input's share in expert 2 and the router, and
    the step failed a bias at once. No reweighting of micro-batches of two samples or more
    moves one input alone: it is not named `token-normalization` (as it was), and the
    `unexplained` message says where the runs parted."""
    root = _bfloat16_runs(tmp_path, "adagrad", 4, 190506, updates=20, uneven=True)
    c = _compare(root)
    if c.verdict != "fail" or c.first_divergence["update"] != 3:
        pytest.skip(f"this machine's rounding took another path here ({c.first_divergence})")
    assert [d.code for d in c.diagnosis] == ["unexplained"]
    assert "at update 3 every failing gradient holds one input's share" in c.diagnosis[0].message
    monkeypatch.setattr(reweighting, "_one_input_alone", lambda *a: False)
    assert _compare(root).diagnosis[0].code == "token-normalization"


def _float16_runs(root, optimizer: str, k: int, seed: int, **loop):
    """The baseline and the merged run under float16 autocast with a GradScaler, and the float64
    reference skipping the updates the baseline's scaler skipped, as the bench records them."""
    with one_thread():
        both = {"autocast": "float16", **loop}
        zoo.record(root / "base", "moe", optimizer, 1, seed, reference="../ref", **both)
        skips = gradalign.skipped_updates(root / "base")
        zoo.record(
            root / "ref", "moe", optimizer, 1, seed, float64=True, skip_updates=skips, **loop
        )
        zoo.record(root / "merged", "moe", optimizer, k, seed, **both)
    return root


def test_a_sketched_token_s_route_is_read_from_the_grid_sums(tmp_path, monkeypatch):
    """Model zoo run 214216 (Adam 1e-2, K=8, float16, recorded with sketches, 20 updates): at
    update 11 a token routed otherwise; only expert 1's biases failed (kept whole), beside its
    weights passing at 43 times their noise, sketched. A count sketch keeps no rank: read by
    their grid sums (runs/grid_sums.py) the weights' errors are one input's share, the biases
    along them, and the run passes; without the grid sums it fails at update 11."""
    root = _float16_runs(tmp_path, "adam-1e-2", 8, 214216, updates=20, sketch=True)
    _followed(
        root, monkeypatch, "gradalign.judge.kink_evidence.Sketched._grids", 11,
        r"update 11: .*one input's share", lambda *a: None,
    )  # fmt: skip


def test_a_gain_after_an_update_the_scaler_skipped_is_followed(tmp_path, monkeypatch):
    """Model zoo run 214267 (Adam with eps 1e-6, K=4, float16): the GradScaler skipped update 0
    in every run (no gradient kept), and at update 1 one element of expert 0's second bias
    stepped the other way (its gradient near zero, Adam's step ±lr): its optimizer's gain, which
    the bound once refused to read for the update without gradients."""
    root = _float16_runs(tmp_path, "adam-eps6", 4, 214267, updates=20)
    _followed(root, monkeypatch, "follow_gain_divergence", 1, r"update 1: experts\.0\.2\.bias")


def test_a_choice_stepped_with_at_once_is_followed_at_its_size(tmp_path, monkeypatch):
    """Model zoo run 222212 (a mixture of experts at width 3, Adagrad, K=8, float16): at update
    8 a token moved between experts 2 and 3, their gradients 12% to 14% off, the router's 10%,
    and the step taken with it left the weights' noise at once. Followed at the choice's size
    (judge/divergence_start.py `choice`) it passes; read as no choice, it fails at update 8."""
    root = _float16_runs(tmp_path, "adagrad", 8, 222212, updates=20, width=3)
    _followed(
        root, monkeypatch, "gradalign.judge.kink_divergence.choice", 8,
        r"update 8: .*a choice made per input", lambda *a: None,
    )  # fmt: skip


def test_a_token_s_route_in_fused_experts_is_said_with_its_echoes(tmp_path):
    """Model zoo run 231000 (transformers' Mixtral, experts fused in tensors of three axes,
    Adagrad, K=2, float32): at update 2 a token went to another expert in the merged run alone,
    layer 1's experts 2% off in two slabs and its router as much, every other gradient a
    share of itself 13 times smaller and failing all the same (float32's noise is tiny). The
    run fails; the `unexplained` message names the route and its echoes, and the merged run
    in float64 passes against the reference, as its fix says. A bug's run of the same loop
    (gradients never cleared) gets no such clause."""
    pytest.importorskip("transformers")
    with one_thread():
        _runs(tmp_path, "hf-mixtral", "adagrad", 2, 231000, updates=4)
    c = _compare(tmp_path)
    if c.verdict != "fail" or c.first_divergence["update"] != 2:
        pytest.skip(f"this machine's rounding took another path here ({c.first_divergence})")
    said = c.diagnosis[0].message
    assert c.diagnosis[0].code == "unexplained"
    assert "experts.gate_up_proj in slabs [0, 3] of its first axis" in said, said
    assert "the shape of a token routed to another expert" in said
    with one_thread():
        zoo.record(tmp_path / "merged64", "hf-mixtral", "adagrad", 2, 231000, float64=True,
                   updates=4)  # fmt: skip
    float64 = api.compare(tmp_path / "ref", tmp_path / "merged64", reference="none")
    assert float64.verdict == "pass", [d.message for d in float64.diagnosis]
    with one_thread():
        zoo.record(tmp_path / "merged", "hf-mixtral", "adagrad", 2, 231000, updates=4,
                   bug="no-zero-grad", bug_from=1)  # fmt: skip
    bug = _compare(tmp_path)
    assert bug.verdict == "fail" and bug.diagnosis[0].code == "grad-not-cleared"
    assert route_clause(bug, failing(bug)) is None


def _hf_runs(root, model: str, optimizer: str, k: int, seed: int, **both):
    """The float64 reference (skipping the steps the baseline's GradScaler skipped), and the
    baseline and the merged run of a transformers mixture of experts with `both`'s options."""
    pytest.importorskip("transformers")
    loop = {o: both[o] for o in ("updates", "uneven", "clip", "schedule", "sketch") if o in both}
    with one_thread():
        zoo.record(root / "base", model, optimizer, 1, seed, reference="../ref", **both)
        skips = gradalign.skipped_updates(root / "base")
        zoo.record(
            root / "ref", model, optimizer, 1, seed, float64=True, skip_updates=skips, **loop
        )
        zoo.record(root / "merged", model, optimizer, k, seed, **both)
    return root


def test_a_token_s_route_beside_a_norm_s_scale_is_followed(tmp_path, monkeypatch):
    """Model zoo run 233028 (gpt-oss under float16 autocast, Adadelta, K=4): at update 2 a
    token routed otherwise, its echo failing attention weights (each one input's share) and
    layer 1's input norm's scale, a vector with no rank to read; read as no evidence either
    way, the choice is followed and the run passes, where it failed `unexplained`."""
    root = _hf_runs(tmp_path, "hf-gptoss", "adadelta", 4, 233028, autocast="float16")
    _followed(
        root, monkeypatch, "gradalign.judge.choices.lone_vectors", 2,
        r"update 2: .*one input's share", lambda *a: set(),
    )  # fmt: skip


def test_a_router_beside_fused_experts_slabs_is_the_same_input(tmp_path, monkeypatch):
    """Model zoo run 233033 (Mixtral under float16 autocast, ASGD, K=4): at update 5 only the
    router's gradient failed, of the input the fused experts' passing slabs 1 and 3 hold;
    without reading a router against a slab it fails `unexplained` at update 5."""
    root = _hf_runs(tmp_path, "hf-mixtral", "asgd", 4, 233033, autocast="float16")
    _followed(
        root, monkeypatch, "gradalign.judge.kink_pair.TensorPair.same_slab_input", 5,
        r"update 5: .*one input's share", lambda *a: False,
    )  # fmt: skip


def test_a_sketched_router_is_read_against_the_slab_grids(tmp_path, monkeypatch):
    """Model zoo run 233204 (Qwen2-MoE under bfloat16 autocast, Adafactor with eps, K=5,
    micro-batches of unequal sizes, clipped, scheduled, recorded with sketches): at update 2
    only the router failed, sketched; its input read against the fused experts' slab grids
    (runs/grid_sums.py), the run passes; without them (the tensor's one grid reads the two
    slabs as rank two) it fails at update 2."""
    options = {"uneven": True, "clip": 1.0, "schedule": True, "sketch": True, "updates": 16}
    root = _hf_runs(
        tmp_path, "hf-qwen2moe", "adafactor-eps", 5, 233204, autocast="bfloat16", **options
    )
    _followed(
        root, monkeypatch, "gradalign.judge.kink_evidence.Sketched._slabs", 2,
        r"update 2: .*one input's share", lambda *a: None,
    )  # fmt: skip


def _by_first_axis(shape: tuple[int, ...], units) -> bool:
    """`kink_shape.held_in_many_rows` as before fused experts were read by a slab's rows."""
    return many_rows(shape)


# Clean runs under float16 autocast, clipped at 0.5, that failed `unexplained` until the choice
# rules read one more tensor beside a token's route: (model, optimizer, K, seed, updates, the
# reading, the update it first fails at without it, the note's start[, what replaces the
# reading: by default one that reads nothing]).
READINGS = {
    # gpt-oss: at update 7 a token routed otherwise in layer 0, the fused weights holding its
    # share in slabs 2 and 3, their fused biases (one row per expert) in rows 2 and 3, and the
    # step taken with it left the weights' noise; read as the token's share too (as the
    # route's message did), the choice is followed
    "fused-biases": (
        ("hf-gptoss", "adadelta", 6, 244211, 12), "gradalign.judge.choices.fused_bias_rows",
        7, r"update 7: .*one input's share",
    ),
    # Mixtral: at update 11 only layer 1's post-attention norm's scale failed (96 times its
    # noise, 4.5% of itself), a vector with no rank to read, while layer 1's fused experts
    # (slabs 0 and 3) and router passed at 63 to 80 times their noise, each one input's share,
    # the step within the weights' noise: the choice's echo, noted
    "lone-scale": (
        ("hf-mixtral", "asgd", 2, 254035, 20), "gradalign.judge.kinks.lone_beside_choice",
        11, r"update 11: only the gradient of .*norm.* failed, a norm's scale",
    ),
    # Mixtral of 4 experts: at updates 16 and 17 layer 1's fused experts (slabs 0 and 2) and
    # router failed, one input's share, with the post-attention norm's scale, every weight
    # within its noise; read by the fused tensors' first axis (4 experts) no tensor held many
    # rows and the quiet jump went unread
    "few-experts": (
        ("hf-mixtral", "sgd-nesterov-wd", 4, 255552, 20),
        "gradalign.judge.kinks.held_in_many_rows", 16,
        r"update 16: .*slabs \[0, 2\].*a norm's scale with no rank to read", _by_first_axis,
    ),
}  # fmt: skip


@pytest.mark.parametrize("reading", sorted(READINGS))
def test_a_token_s_route_read_in_one_more_tensor_passes(tmp_path, monkeypatch, reading):
    """Model zoo runs 244211, 254035 and 255552 (`READINGS`): each passes with the reading,
    and fails `unexplained` at its update without it."""
    (model, optimizer, k, seed, updates), follow, update, note, *without = READINGS[reading]
    options = {"clip": 0.5, "updates": updates}
    root = _hf_runs(tmp_path, model, optimizer, k, seed, autocast="float16", **options)
    _followed(root, monkeypatch, follow, update, note, *(without or [lambda *a: None]))


def test_a_layer_after_a_token_s_route_holds_its_share_too(tmp_path, monkeypatch):
    """Model zoo run 260071 (the zoo's mixture of experts under float16 autocast, AdamW, K=5,
    micro-batches of unequal sizes, warmup and cosine decay, clipped at 1.0): a token moved
    from expert 0 to expert 2 at update 3, and the output layer's weight, 1.8% off against the
    experts' 10% to 25%, held the token's changed output, rank one. Without reading it
    (`choices.read_after`) the run fails at update 3 (named `token-normalization`); with it, the
    choice is followed."""
    options = {"clip": 1.0, "updates": 20, "uneven": True, "schedule": True}
    root = _hf_runs(tmp_path, "moe", "adamw-wd", 5, 260071, autocast="float16", **options)
    _followed(
        root, monkeypatch, "gradalign.judge.choices.read_after", 3,
        r"update 3: .*one input's share", lambda *a: {},
    )  # fmt: skip


def test_a_fused_bias_beside_its_experts_route_passing_within_4x_their_noise_passes(
    tmp_path, monkeypatch
):
    """Model zoo run 288941 (gpt-oss under float16 against a float32 reference, SGD with
    momentum, K=2): at update 15 only layer 1's fused `down_proj_bias` failed (1.2x allowed),
    98.9% of its error in rows 1 and 2, beside `gate_up_proj` and `down_proj` passing at 3.4 and
    3.2 times their noise, each one input's share in slabs 1 and 2: a token's route. Fused
    experts read in their slabs anchor it from half the multiple a weight read whole needs
    (`choices.anchors`); without that it fails there, `unexplained` (found on an AMD EPYC host)."""
    pytest.importorskip("transformers")
    with one_thread():
        zoo.judge(tmp_path, "hf-gptoss", "sgd-mom", 2, 288941, None, updates=20,
                  autocast="float16", reference_dtype="float32")  # fmt: skip
    _followed(
        tmp_path, monkeypatch, "gradalign.judge.choices.fused_experts", 15,
        r"update 15: .*one input's share", lambda *a: False, within="down_proj_bias",
    )  # fmt: skip
