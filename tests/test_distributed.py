"""Data parallel x gradient merge: W=2 ranks (gloo) against one process at batch B, judged.

Starting ranks costs seconds (each imports torch), so every built-in scenario of this module is
recorded in ONE launch (`dp_runs`); each test then judges its runs from their files, or those
files made malformed. Launches themselves (nproc checked, a rank killed, ranks that cannot start,
hand-written loops under torchrun) are in tests/test_distributed_launch.py; the Recorder inside a
process group in tests/test_distributed_recorder.py.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from gradalign import api
from gradalign.config import TrainConfig
from gradalign.judge.results import FAIL, PASS
from gradalign.record.faults import FAULTS
from gradalign.runs.reader import read_run_dir

from .conftest import one_line_error, rewrite_tensor_file
from .test_user_model import USER_CODE

dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):  # pragma: no cover
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

SMALL = {"hidden": 32, "updates": 4, "batch_size": 32}
FULL = {"hidden": 256, "updates": 12, "batch_size": 128}  # the defaults
SETUPS = {
    "sgd": {},
    "adam": {"optimizer": "adam"},
    # bf16 AdamW at the default size: at the small one even one process at 2K strays (the noise
    # floor of autocast under Adam is coarse there), and W=2 x K is that training
    "adamw-bf16": {"optimizer": "adamw", "precision": "bf16", **FULL},
    "sgd-cos": {"scheduler": "cosine", "warmup_updates": 1, "clip_norm": 0.5},
    "tiny-lm": {"model": "tiny-lm"},
    "cnn-bn": {"model": "cnn-bn"},
    "mlp-dropout": {"model": "mlp-dropout"},
    "fp16-adamw": {"precision": "fp16", "optimizer": "adamw"},  # a GradScaler on every rank
    "O3": {"amp_level": "O3"},  # float16 weights, all-reduced in float16
    "user": {},  # the user's own model, data and loss from a file (filled in by dp_runs)
    "mlp-moe": {"model": "mlp-moe"},  # a load-balancing loss over each forward's rows
}
DP_FAULTS = [name for name, fault in FAULTS.items() if fault.dp is not None]
FAULT_SETUP = {
    "dp-token-normalization": "tiny-lm",
    "scheduler-per-rank": "sgd-cos",
    "scheduler-every-micro": "sgd-cos",
    "clip-every-micro": "sgd-cos",
    "dp-batchnorm": "cnn-bn",
    "dp-rank-init": "adam",
    "step-every-micro": "adam",
    "bf16-accum": "adam",
}
# (setup, K, fault or None, the first cause the judge must name, or None: must pass)
SCENARIOS = [
    ("sgd", 2, None, None),
    ("sgd", 4, None, None),
    ("adamw-bf16", 4, None, None),
    ("sgd-cos", 4, None, None),
    ("tiny-lm", 2, None, None),
    ("cnn-bn", 1, None, None),  # BatchNorm synced over the ranks: one process at B exactly
    ("cnn-bn", 4, None, "batchnorm"),  # synced, but B/K rows per micro-step
    # each rank draws its dropout masks from its own generator: not one process's masks
    ("mlp-dropout", 2, None, "dropout-rng"),
    # each rank balances its own B/W rows, even at K=1
    ("mlp-moe", 1, None, "cross-sample-loss"),
    ("user", 4, None, None),
    ("fp16-adamw", 2, None, None),
    ("O3", 2, None, None),
    *(
        (FAULT_SETUP.get(f, "sgd"), 1 if f == "dp-batchnorm" else 4, f, FAULTS[f].code)
        for f in DP_FAULTS
    ),
    *(
        (FAULT_SETUP.get(f, "sgd"), 4, f, FAULTS[f].code)
        for f in (
            "no-loss-scale",
            "step-every-micro",
            "scheduler-every-micro",
            "zero-grad-every-micro",
            "data-order",
            "bf16-accum",
            "clip-every-micro",
        )
    ),
]


def config(setup: str, k: int = 4, nproc: int = 2) -> TrainConfig:
    return TrainConfig(**SMALL).replace(**SETUPS[setup], accum_steps=k, nproc=nproc)


def name(setup: str, k: int, fault: str | None) -> str:
    return f"{setup}-k{k}-{fault or 'clean'}"


@pytest.fixture(scope="session")
def dp_runs(tmp_path_factory):
    """Baselines (one process, with float64 references) and every merged scenario on 2 ranks,
    recorded in one launch."""
    root = tmp_path_factory.mktemp("dp")
    (root / "user_nets.py").write_text(USER_CODE)
    user = f"{root / 'user_nets.py'}"
    SETUPS["user"].update(model=f"{user}:make_model", data=f"{user}:make_data")
    SETUPS["user"]["loss"] = f"{user}:loss_sum"
    for setup in SETUPS:
        api.record_baseline(config(setup, nproc=1), root / setup / "baseline")
    runs = [
        (config(setup, k), root / setup / name(setup, k, fault), fault)
        for setup, k, fault, _ in SCENARIOS
    ]
    api.record_merged_runs(runs)
    return root


def judged(root, setup, k, fault):
    return api.compare(root / setup / "baseline", root / setup / name(setup, k, fault))


def errors(comparison) -> list[str]:
    return [d.code for d in comparison.diagnosis if d.severity == "error"]


@pytest.mark.parametrize(("setup", "k", "fault", "code"), SCENARIOS, ids=lambda v: str(v))
def test_each_scenario_is_judged_as_expected(dp_runs, setup, k, fault, code):
    comparison = judged(dp_runs, setup, k, fault)
    if code is None:
        assert comparison.verdict == PASS, [c for c in comparison.checks if c.status == FAIL]
        assert errors(comparison) == []
        replicas = next(c for c in comparison.checks if c.name.startswith("ranks hold"))
        assert replicas.status == PASS and "bitwise equal" in replicas.detail
    else:
        assert comparison.verdict == FAIL
        assert errors(comparison)[0] == code, [d.message for d in comparison.diagnosis]
        first = comparison.diagnosis[0]
        assert first.message and first.fix and first.evidence
        if code == "grad-accum-dtype":  # on ranks, a compression hook may be the cause
            assert "all-reduced" in first.message and "compression hook" in first.fix


def test_per_rank_batchnorm_at_k_1_is_not_also_told_as_micro_batch_statistics(dp_runs):
    """At K=1 each rank normalizes its B/W rows once per update: `dp-batchnorm` says so, and
    `batchnorm` beside it ("each micro-batch of B/K ... updated K times per update") was wrong."""
    comparison = judged(dp_runs, FAULT_SETUP.get("dp-batchnorm", "sgd"), 1, "dp-batchnorm")
    assert errors(comparison) == ["dp-batchnorm"], [d.message for d in comparison.diagnosis]


def test_clean_runs_name_no_data_parallel_cause(dp_runs):
    """Every clean data-parallel run is within its noise; the BatchNorm one at K=4 fails only
    for its micro-batch statistics (batchnorm), never for per-rank ones (dp-batchnorm)."""
    for setup, k, fault, _ in SCENARIOS:
        if fault is None:
            found = errors(judged(dp_runs, setup, k, fault))
            assert not {c for c in found if c.startswith("dp-") or c.startswith("replicas")}


def test_the_run_holds_every_rank_and_the_manifest_says_how(dp_runs):
    path = dp_runs / "sgd" / name("sgd", 2, None)
    manifest = json.loads((path / "manifest.json").read_text())
    facts = manifest["distributed"]
    assert facts["world_size"] == 2 and facts["backend"] == "gloo"
    assert facts["launcher"] == "gradalign"
    assert [r["rank"] for r in facts["ranks"]] == [0, 1]
    assert manifest["environment"]["world_size"] == 2
    for rank in (0, 1):
        assert f"ranks/rank{rank}/series.safetensors" in manifest["files"]
    run = read_run_dir(path)
    assert run.world_size == 2 and run.accum_steps == 2
    # each rank saw half of every micro-step's rows: the combined digests are the baseline's
    base = read_run_dir(dp_runs / "sgd" / "baseline")
    assert np.array_equal(run.window_sums(run.micro_data), base.micro_data)
    halves = [rank.micro_data for rank in run.ranks]
    assert not np.array_equal(halves[0], halves[1])
    # full snapshots from rank 0 only; every rank's fingerprints agree bit for bit
    assert np.array_equal(run.ranks[0].update_state, run.ranks[1].update_state)
    assert np.array_equal(run.ranks[0].grad_state, run.ranks[1].grad_state)
    assert np.array_equal(run.ranks[0].update_state, run.update_state)


def test_items_weighted_loss_over_ranks_and_micro_steps(dp_runs):
    run = read_run_dir(dp_runs / "tiny-lm" / name("tiny-lm", 2, None))
    losses = np.stack([r.micro_loss for r in run.ranks])
    items = np.stack([r.micro_items for r in run.ranks])
    assert len(set(items[:, :2].ravel().tolist())) > 1  # unequal counts: the weighting matters
    window = (losses[:, :2] * items[:, :2]).sum() / items[:, :2].sum()
    assert run.window_losses()[0] == pytest.approx(window, rel=1e-12)


def test_replicas_diverged_names_the_tensors(dp_runs):
    unsynced = judged(dp_runs, "sgd", 4, "dp-unsynced-params").diagnosis[0]
    assert unsynced.evidence["tensors"] == ["2.weight", "2.bias"]
    assert "2.weight, 2.bias only" in unsynced.message
    after_forward = judged(dp_runs, "sgd", 4, "dp-sync-after-forward").diagnosis[0]
    assert after_forward.evidence["cause"] == "gradient"
    assert "every parameter" in after_forward.message
    init = judged(dp_runs, "adam", 4, "dp-rank-init").diagnosis[0]
    assert init.evidence["cause"] == "initial weights" and init.evidence["rank"] == 1


def test_the_report_shows_w_k_and_the_ranks(dp_runs, cli, tmp_path):
    base = dp_runs / "sgd" / "baseline"
    report = tmp_path / "r.json"
    result = cli("compare", base, dp_runs / "sgd" / name("sgd", 2, None), "--json", report)
    assert result.code == 0, result.out
    text = " ".join(result.out.split())  # the header wraps where the temporary folder's name ends
    assert "W=2 x K=2" in text and "ranks hold the same replica (W=2)" in text
    data = json.loads(report.read_text())
    assert data["merged_ranks"]["world_size"] == 2 and data["merged_ranks"]["replicas_agree"]
    failing = cli("compare", base, dp_runs / "sgd" / name("sgd", 4, "dp-sync-after-forward"))
    assert failing.code == 1 and "replicas-diverged:" in failing.out


def _altered(dp_runs, tmp_path, change) -> str:
    path = shutil.copytree(dp_runs / "sgd" / name("sgd", 2, None), tmp_path / "m")
    manifest = json.loads((path / "manifest.json").read_text())
    change(path, manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


MALFORMED = {
    "world size": (lambda p, m: m["distributed"].update(world_size=3), "ranks must list 3"),
    "no ranks object": (lambda p, m: m.update(distributed=[1]), "'distributed' must be"),
    "rank file unlisted": (
        lambda p, m: m["files"].pop("ranks/rank1/series.safetensors"),
        "rank 1's series",
    ),
    "short series": (
        lambda p, m: rewrite_tensor_file(
            p,
            "ranks/rank1/series.safetensors",
            lambda d: d.update({"micro/loss": d["micro/loss"][:3]}),
            m,
        ),
        "micro/loss has shape",
    ),
    "combination": (
        lambda p, m: rewrite_tensor_file(
            p,
            "ranks/rank1/series.safetensors",
            lambda d: d.update({"micro/loss": d["micro/loss"] * 2}),
            m,
        ),
        "not the combination",
    ),
    "float states": (
        lambda p, m: rewrite_tensor_file(
            p,
            "ranks/rank0/series.safetensors",
            lambda d: d.update({"update/state": d["update/state"].astype(np.float64)}),
            m,
        ),
        "expected int64",
    ),
}


@pytest.mark.parametrize("case", MALFORMED, ids=str)
def test_malformed_rank_data_is_one_line_bad_input(dp_runs, tmp_path, cli, case):
    change, fragment = MALFORMED[case]
    merged = _altered(dp_runs, tmp_path, change)
    one_line_error(cli("compare", dp_runs / "sgd" / "baseline", merged), fragment)
