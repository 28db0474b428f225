"""Runs written by the numpy-only writer (gradalign.runs.portable, docs/FORMAT.md) from a trainer
that is not PyTorch are judged like Recorder runs: a clean one passes against its float64
reference, each accumulation bug fails with its own code."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from gradalign import api
from gradalign.runs.portable import fingerprint, sample_digest, write_run

from .conftest import still_runs

BATCH, K, UPDATES, FEATURES, HIDDEN, OUTPUTS = 16, 4, 5, 12, 8, 3
LR, MOMENTUM, CLIP = 0.5, 0.9, 0.05

BUGS = {  # a bug in a hand-written numpy accumulation loop -> the code the judge must name
    "no-loss-scale": "loss-scale",
    "step-every-micro": "step-in-window",
    "scheduler-every-micro": "lr-schedule",
    "data-order": "data-order",
    "zero-grad-every-micro": "zero-grad-in-window",
    "mean-per-micro": "token-normalization",
    "clip-every-micro": "clip-per-micro",
    "bf16-accum": "grad-accum-dtype",
    "count-every-micro": "step-count",  # the optimizer's own counter, step() once per window
    "decay-every-micro": "weights-changed-in-window",  # without `micro/steps`: 3 changes, 1 step
    "step-early": "step-in-window",  # one step per window, misplaced: as many steps, 1 change
}


def make_data(padded: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows in training order, float32; with `padded`, some rows are padding (mask 0), unevenly
    spread so micro-batches hold different numbers of real items."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(BATCH * UPDATES, FEATURES)).astype(np.float32)
    y = (np.sin(x[:, :OUTPUTS] * 2) + 0.1 * x[:, OUTPUTS : 2 * OUTPUTS]).astype(np.float32)
    mask = np.ones((BATCH * UPDATES, 1), dtype=np.float32)
    if padded:
        mask[rng.random(BATCH * UPDATES) < 0.4] = 0
        mask[:: BATCH // K] = 1  # every micro-batch keeps a real item
    return x, y, mask


def init_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "w1": (rng.normal(size=(FEATURES, HIDDEN)) * 0.5).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.normal(size=(HIDDEN, OUTPUTS)) * 0.5).astype(np.float32),
        "b2": np.zeros(OUTPUTS, np.float32),
    }


def summed_loss(w, x, y, mask):
    """The summed squared error over the real rows, and its gradient (in the weights' dtype)."""
    h = np.tanh(x @ w["w1"] + w["b1"])
    err = (h @ w["w2"] + w["b2"] - y) * mask
    d_out = 2 * err
    d_h = (d_out @ w["w2"].T) * (1 - h * h)
    grad = {"w1": x.T @ d_h, "b1": d_h.sum(0), "w2": h.T @ d_out, "b2": d_out.sum(0)}
    return float((err * err).sum()), grad


def bf16(a: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest, ties to even), kept as float32."""
    bits = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def norm(g: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(float((v.astype(np.float64) ** 2).sum()) for v in g.values())))


def train(
    out: Path,
    k: int,
    *,
    bug: str | None = None,
    padded: bool = False,
    clip: bool = False,
    dtype=np.float32,
    **write,
) -> Path:
    """SGD with momentum and a schedule (and clipping, with `clip`), UPDATES batches of BATCH
    rows split into k micro-batches; records everything the writer takes."""
    x, y, mask = (a.astype(dtype) for a in make_data(padded))
    if bug == "data-order":  # the last micro-batch of each window swapped with the next one's
        order = np.arange(len(x)).reshape(UPDATES, BATCH)
        last = order[:, -BATCH // k :].copy()
        order[:, -BATCH // k :] = np.roll(last, 1, axis=0)
        x, y, mask = x[order.ravel()], y[order.ravel()], mask[order.ravel()]
    w = {n: v.astype(dtype) for n, v in init_weights().items()}
    start = {n: v.copy() for n, v in w.items()}
    velocity = {n: np.zeros_like(v) for n, v in w.items()}
    size, steps_taken, micro_count = BATCH // k, 0, 0
    rec: dict[str, list] = {key: [] for key in ("loss", "items", "data", "state", "weights")}
    rec.update(grads=[], lr=[], steps=[], state_step=[], pre_clip=[])

    def lr_at(t: int) -> float:
        return LR / (1 + 0.3 * t)

    def step(grad, lr):
        nonlocal steps_taken
        for n in w:
            velocity[n] = (MOMENTUM * velocity[n] + grad[n]).astype(dtype)
            w[n] = (w[n] - dtype(lr) * velocity[n]).astype(dtype)
        steps_taken += 1

    for i in range(UPDATES):
        rows = slice(i * BATCH, (i + 1) * BATCH)
        total = float(mask[rows].sum())  # the window's real items, counted before any backward
        acc, steps_before = None, steps_taken
        for j in range(k):
            micro = slice(i * BATCH + j * size, i * BATCH + (j + 1) * size)
            items = float(mask[micro].sum())
            loss, grad = summed_loss(w, x[micro], y[micro], mask[micro])
            rec["loss"].append(loss / items)
            rec["items"].append(items)
            rec["data"].append(sample_digest(x[micro], y[micro], mask[micro]))
            rec["state"].append([fingerprint(w[n]) for n in w])
            scale = {
                "no-loss-scale": k / total,
                "mean-per-micro": 1 / (items * k),
                "step-every-micro": 1 / (items * k),
            }.get(bug, 1 / total)
            grad = {n: (g * dtype(scale)).astype(dtype) for n, g in grad.items()}
            if bug == "zero-grad-every-micro" or acc is None:
                acc = grad
            else:
                acc = {n: acc[n] + grad[n] for n in acc}
            if bug == "bf16-accum":
                acc = {n: bf16(v) for n, v in acc.items()}
            if bug == "clip-every-micro":
                acc = clipped(acc)[0]
            if bug == "step-every-micro" or (bug == "step-early" and j == k - 2):
                step(acc, lr_at(i))
                acc = None
            if bug == "decay-every-micro" and j < k - 1:  # not by the optimizer: no step
                w = {n: (v * dtype(1 - 1e-3)).astype(dtype) for n, v in w.items()}
            micro_count += 1
        lr = lr_at(micro_count - 1 if bug == "scheduler-every-micro" else i)
        if acc is not None:
            pre = norm(acc)
            acc = clipped(acc)[0] if clip else acc
            rec["pre_clip"].append(pre)
            rec["grads"].append({n: v.copy() for n, v in acc.items()})
            step(acc, lr)
        else:
            rec["pre_clip"].append(np.nan)
            rec["grads"].append({n: np.zeros_like(v) for n, v in w.items()})
        rec["lr"].append(lr)
        rec["steps"].append(steps_taken - steps_before)
        counted = (k - 1) * (i + 1) if bug == "count-every-micro" else 0  # Adam's t per micro
        rec["state_step"].append(steps_taken + counted)
        rec["weights"].append({n: v.copy() for n, v in w.items()})
    fields = dict(  # `write` adds fields or leaves some out (None), as another writer may
        grads=rec["grads"],
        micro_items=rec["items"],
        micro_data=rec["data"],
        micro_state=rec["state"],
        optimizer_steps=rec["steps"],
        state_step=rec["state_step"],
        grad_norm_pre_clip=rec["pre_clip"],
        grad_dtype=np.dtype(dtype).name,
        model={"batchnorm": [], "dropout": []},
        config={"model": "numpy mlp", "batch_size": BATCH, "lr": LR, "padded": padded},
        lr=rec["lr"],
    )
    return write_run(
        out,
        accum_steps=k,
        micro_losses=rec["loss"],
        init_weights=start,
        update_weights=rec["weights"],
        **{**fields, **write},
    )


def clipped(g: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    total = norm(g)
    factor = min(1.0, CLIP / (total + 1e-6))
    return {n: (v * v.dtype.type(factor)).astype(v.dtype) for n, v in g.items()}, total


# the optional fields `train` records (tests/test_sparse_fields.py leaves them out)
OPTIONAL = (
    "grads",
    "micro_items",
    "micro_data",
    "micro_state",
    "optimizer_steps",
    "state_step",
    "grad_norm_pre_clip",
    "lr",
)
SETUPS = {"plain": {}, "padded": {"padded": True}, "clipped": {"clip": True}}


def setup_of(bug: str | None) -> str:
    return {"mean-per-micro": "padded", "clip-every-micro": "clipped"}.get(bug or "", "plain")


@pytest.fixture(scope="module")
def baselines(tmp_path_factory) -> dict[str, Path]:
    """Per setup: a float32 baseline that keeps its lr in float32 (as Paddle does) and names
    its float64 rerun as reference."""
    root = tmp_path_factory.mktemp("portable")
    found = {}
    lr = np.array([LR / (1 + 0.3 * t) for t in range(UPDATES)], dtype=np.float32)
    for name, options in SETUPS.items():
        ref = train(root / f"base-{name}-fp64", 1, dtype=np.float64, **options)
        found[name] = train(root / f"base-{name}", 1, lr=lr, reference=f"../{ref.name}", **options)
    return found


def test_the_writer_records_every_field_the_judge_reads(baselines, tmp_path):
    from gradalign.runs.reader import read_run_dir

    run = read_run_dir(train(tmp_path / "m", K))
    for field in OPTIONAL:  # the writer's argument and the run's attribute share the name
        if field != "grads":
            assert getattr(run, field) is not None, field
    base = read_run_dir(baselines["plain"])
    assert base.lr.dtype == np.float32 and run.lr.dtype == np.float64
    assert base.reference.endswith("base-plain-fp64") and base.grad_dtype == "float32"
    assert run.has_grads and run.model_facts == {"batchnorm": [], "dropout": []}
    # the digests add up: window i's micro-batches hold baseline batch i's samples
    assert (run.window_sums(run.micro_data) == base.micro_data).all()


def test_a_clean_run_passes_against_the_float64_reference(baselines, tmp_path):
    merged = train(tmp_path / "merged", K)
    result = api.compare(baselines["plain"], merged)
    assert result.reference is not None
    assert result.verdict == "pass", [(c.name, c.detail) for c in result.checks]
    checks = {c.name: c.status for c in result.checks}
    for name in (
        "gradients",
        "same samples per update",
        "learning rate",
        "optimizer steps",
        "no weight change inside a window",
        "initial weights",
    ):
        assert checks[name] == "pass", name
    worst = max(d.ratio for r in result.results for d in (*r.weights, *r.grads))
    print(f"worst err/allowed {worst:.2f}")
    assert worst < 1


@pytest.mark.parametrize("setup", ["padded", "clipped"])
def test_clean_padded_and_clipped_runs_pass(baselines, tmp_path, setup):
    merged = train(tmp_path / "merged", K, **SETUPS[setup])
    result = api.compare(baselines[setup], merged)
    assert result.verdict == "pass", [(c.name, c.detail) for c in result.checks]


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_bug_fails_with_its_code(baselines, tmp_path, bug):
    setup = setup_of(bug)
    merged = train(tmp_path / bug, K, bug=bug, **SETUPS[setup])
    result = api.compare(baselines[setup], merged)
    assert result.verdict == "fail"
    errors = [d.code for d in result.diagnosis if d.severity == "error"]
    assert errors[0] == BUGS[bug], [(d.code, d.message) for d in result.diagnosis]


def test_sample_digest_equals_the_recorders():
    torch = pytest.importorskip("torch")
    from gradalign.record.facts import data_digest

    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 5)).astype(np.float32)
    labels = rng.integers(0, 10, size=8)
    half = rng.normal(size=(8, 2)).astype(np.float16)
    mask = rng.random(8) > 0.5
    arrays = (x, labels, half, mask)
    expected = data_digest(tuple(torch.from_numpy(a) for a in arrays))
    assert sample_digest(*arrays) == expected
    assert sample_digest(x.astype(np.float64)) == sample_digest(x)  # a float64 rerun digests alike
    parts = sample_digest(x[:4], labels[:4]) + sample_digest(x[4:], labels[4:])
    assert parts == sample_digest(x, labels)  # digests add up over micro-batches


def test_a_refused_write_leaves_nothing_behind(tmp_path):
    """Every input the writer refuses is refused before a file is written; and an error while
    writing removes what was staged."""
    from gradalign.runs.portable import write_run

    w = {"w": np.zeros((2, 2), np.float32)}
    good = dict(accum_steps=1, micro_losses=[0.5], init_weights=w, update_weights=[w])
    bad = [
        {"accum_steps": 0},
        {"micro_losses": [0.5, 0.5]},
        {"micro_items": [-4.0]},
        {"micro_items": [float("nan")]},
        {"config": {"lr": float("nan")}},
        {"compute_dtype": "bf16"},  # judged to float32's tolerances, had it been written
        {"grads": [{"w": object()}]},  # fails while writing
        {"init_weights": {"__metadata__": w["w"]}, "update_weights": [{"__metadata__": w["w"]}]},
    ]
    for change in bad:
        with pytest.raises((ValueError, KeyError, TypeError)):
            write_run(tmp_path / "run", **{**good, **change})
        assert list(tmp_path.iterdir()) == [], change
    assert write_run(tmp_path / "run", **good).is_dir()


def test_the_writer_knows_the_compute_dtypes_the_judge_knows():
    """portable.py stands alone (numpy only), so it keeps its own list of the precisions a run
    may declare; it must be the judge's."""
    from gradalign.runs import portable
    from gradalign.runs.model import COMPUTE_ORDER

    assert portable._COMPUTE == COMPUTE_ORDER


def test_a_tensor_named_like_safetensors_metadata_is_refused_by_the_reader(tmp_path):
    """A manifest naming a tensor `__metadata__` (a writer of its own): compare refused it
    with "data of 8 bytes, header describes 0", which did not say why."""
    from gradalign.errors import BadInput
    from gradalign.runs.reader import read_run_dir

    w = {"w": np.zeros(2, np.float32)}
    run = write_run(
        tmp_path / "run", accum_steps=1, micro_losses=[0.5], init_weights=w, update_weights=[w]
    )
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["tensors"][0]["name"] = "__metadata__"
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BadInput, match="is __metadata__, the key safetensors keeps"):
        read_run_dir(run)


def test_negative_item_counts_are_refused_by_the_reader(tmp_path):
    from gradalign.errors import BadInput
    from gradalign.runs.portable import encode_safetensors, write_run
    from gradalign.runs.reader import read_run_dir

    w = {"w": np.zeros((2, 2), np.float32)}
    run = write_run(
        tmp_path / "run", accum_steps=1, micro_losses=[0.5], init_weights=w, update_weights=[w]
    )
    from safetensors.numpy import load_file

    series = load_file(run / "series.safetensors")
    series["micro/items"] = np.array([-4.0])
    data = encode_safetensors(series)
    (run / "series.safetensors").write_bytes(data)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["files"]["series.safetensors"] = hashlib.sha256(data).hexdigest()
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BadInput, match="micro/items holds a count that is negative"):
        read_run_dir(run)


def test_bfloat16_arrays_from_ml_dtypes_are_written_and_digested_as_floats(tmp_path):
    """JAX's bfloat16 (ml_dtypes, a numpy dtype of kind "V") was digested as integers (two
    batches of values in [0, 1) both 0: a reference refused for 'other samples', the sample
    check blind), fingerprinted as a float sum, and refused by the writer with a KeyError."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(0)
    x, other = (rng.random((4, 3)).astype(ml_dtypes.bfloat16) for _ in range(2))
    assert sample_digest(x) == sample_digest(x.astype(np.float32)) != sample_digest(other)
    assert fingerprint(x) == int(x.view(np.int16).sum(dtype=np.int64))
    w0 = {"w": rng.normal(size=(3, 2)).astype(ml_dtypes.bfloat16)}
    w1 = {"w": (w0["w"].astype(np.float32) * 0.5).astype(ml_dtypes.bfloat16)}
    common = dict(accum_steps=1, micro_losses=[0.5], init_weights=w0, update_weights=[w1])
    base = write_run(tmp_path / "base", **common, micro_data=[sample_digest(x)])
    merged = write_run(tmp_path / "merged", **common, micro_data=[sample_digest(x)])
    result = api.compare(base, merged, reference="none")
    assert result.verdict == "pass" and result.dtype == "bfloat16"


def test_initial_weights_that_are_not_finite_are_refused_as_such(tmp_path):
    """NaN initial weights were refused as "initial weights differ ... max abs diff nan"; a
    mask buffer of -inf (a causal attention mask) is no weight and stays judged."""
    from gradalign.errors import BadInput

    w = np.array([1.0, np.nan], np.float32)
    with pytest.raises(BadInput, match="initial weights hold NaN or infinite values"):
        api.compare(*still_runs(tmp_path / "nan", {"w": w}, grads=True), reference="none")
    mask = {"w": np.ones(2, np.float32), "mask": np.array([0.0, -np.inf], np.float32)}
    runs = still_runs(tmp_path / "mask", mask, grads=True)
    assert api.compare(*runs, reference="none").verdict == "pass"
