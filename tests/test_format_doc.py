"""docs/FORMAT.md's reference writer, executed: the runs it writes must be judged correctly."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest

from gradalign.errors import BadInput
from gradalign.judge.compare import compare
from gradalign.runs import tensors
from gradalign.runs.reader import read_run_dir

DOC = Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md"
ALLOWED_IMPORTS = {"json", "hashlib", "shutil", "struct", "os", "pathlib", "numpy"}

BATCH, K, UPDATES, LR = 8, 4, 5, 0.1


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.M | re.S)


@pytest.fixture(scope="module")
def doc() -> dict:
    """The namespace left by executing the doc's reference writer."""
    blocks = [b for b in python_blocks() if "def write_run(" in b]
    assert len(blocks) == 1, "docs/FORMAT.md must hold exactly one block defining write_run"
    namespace: dict = {"__name__": "format_doc"}
    exec(compile(blocks[0], str(DOC), "exec"), namespace)
    return namespace


def test_doc_block_is_the_shipped_portable_writer():
    """docs/FORMAT.md's writer and gradalign/runs/portable.py are one text: copy either."""
    shipped = Path(__file__).resolve().parent.parent / "gradalign" / "runs" / "portable.py"
    assert python_blocks()[0] == shipped.read_text(encoding="utf-8")


def test_doc_has_one_python_block_with_numpy_only_imports():
    blocks = python_blocks()
    assert len(blocks) == 1
    imported = set()
    for node in ast.walk(ast.parse(blocks[0])):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= ALLOWED_IMPORTS, imported - ALLOWED_IMPORTS


# -- a tiny linear regression trained by hand in float64 -------------------------------------------


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(UPDATES * BATCH, 3))
    y = x @ np.array([1.5, -2.0, 0.5]) + 0.3 + 0.1 * rng.normal(size=UPDATES * BATCH)
    return x, y


def init_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"w": rng.normal(size=3), "b": np.array(0.0)}


def loss_and_grad(weights, x, y) -> tuple[float, dict[str, np.ndarray]]:
    residual = x @ weights["w"] + weights["b"] - y
    grad = {"w": 2 * x.T @ residual / len(y), "b": np.array(2 * residual.mean())}
    return float(np.mean(residual**2)), grad


def train(doc, out: Path, *, k: int, combine=None, step_every_micro: bool = False) -> Path:
    """SGD over UPDATES batches of BATCH samples, each split into k micro-batches.

    `combine` turns the k micro gradients into the applied gradient (default: their mean).
    Records per-micro-step fingerprints from the live weights, as a trainer would.
    """
    combine = combine or (lambda gs: {n: sum(g[n] for g in gs) / len(gs) for n in gs[0]})
    x, y = data()
    weights = init_weights()
    start = {n: v.copy() for n, v in weights.items()}
    losses, micro_state, snapshots, grads = [], [], [], []
    size = BATCH // k
    for i in range(UPDATES):
        micro_grads = []
        for j in range(k):
            rows = slice(i * BATCH + j * size, i * BATCH + (j + 1) * size)
            loss, grad = loss_and_grad(weights, x[rows], y[rows])
            losses.append(loss)
            micro_state.append([doc["fingerprint"](weights[n]) for n in weights])
            micro_grads.append(grad)
            if step_every_micro:
                weights = {n: weights[n] - LR * grad[n] / k for n in weights}
        applied = combine(micro_grads)
        grads.append(applied)
        if not step_every_micro:
            weights = {n: weights[n] - LR * applied[n] for n in weights}
        snapshots.append({n: v.copy() for n, v in weights.items()})
    return doc["write_run"](
        out,
        accum_steps=k,
        micro_losses=losses,
        init_weights=start,
        update_weights=snapshots,
        grads=grads,
        lr=[LR] * UPDATES,
        config={"model": "linear", "micro_batch": size},
        micro_state=micro_state,
    )


def ordered(run, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Tensor files come back sorted by name; the writer takes its tensor order from dict order."""
    return {t.name: weights[t.name] for t in run.tensors}


def check(comparison, name: str):
    return next(c for c in comparison.checks if c.name == name)


@pytest.fixture(scope="module")
def baseline(doc, tmp_path_factory):
    return train(doc, tmp_path_factory.mktemp("runs") / "baseline", k=1)


def test_correct_accumulation_passes(doc, baseline, tmp_path):
    merged = train(doc, tmp_path / "merged", k=K)
    result = compare(read_run_dir(baseline), read_run_dir(merged))
    assert result.verdict == "pass", [(c.name, c.status, c.detail) for c in result.checks]
    assert check(result, "gradients").status == "pass"
    assert check(result, "no weight change inside a window").status == "pass"
    assert check(result, "learning rate").status == "pass"
    assert result.first_divergence is None
    assert result.dtype == "float64"


def test_missing_one_over_k_fails_at_update_zero(doc, baseline, tmp_path):
    summed = train(
        doc, tmp_path / "summed", k=K, combine=lambda gs: {n: sum(g[n] for g in gs) for n in gs[0]}
    )
    result = compare(read_run_dir(baseline), read_run_dir(summed))
    assert result.verdict == "fail"
    assert result.first_divergence["update"] == 0
    assert result.first_divergence["in"] == "gradient"
    assert check(result, "gradients").status == "fail"
    assert result.results[0].grad_ratio == pytest.approx(K)


def test_optimizer_step_inside_a_window_is_caught(doc, baseline, tmp_path):
    stepping = train(doc, tmp_path / "stepping", k=K, step_every_micro=True)
    result = compare(read_run_dir(baseline), read_run_dir(stepping))
    assert result.verdict == "fail"
    assert check(result, "no weight change inside a window").status == "fail"


def test_micro_state_not_given_is_not_made_up(doc, baseline, tmp_path):
    """Without `micro_state` the run holds none (rows derived from each window's start claimed
    that nothing stepped inside a window); its fingerprints per update are the live ones."""
    live = read_run_dir(train(doc, tmp_path / "live", k=K))
    bare = doc["write_run"](
        tmp_path / "bare",
        accum_steps=K,
        micro_losses=live.micro_loss,
        init_weights=ordered(live, live.init_weights()),
        update_weights=[ordered(live, live.weights(i)) for i in range(UPDATES)],
    )
    run = read_run_dir(bare)
    assert run.micro_state is None and run.lr is None and not run.has_grads
    np.testing.assert_array_equal(run.init_state, live.micro_state[0])
    np.testing.assert_array_equal(run.update_state, live.update_state)
    result = compare(read_run_dir(baseline), run)
    assert check(result, "no weight change inside a window").status == "not checked"


def test_optional_pieces_absent_are_not_checked(doc, baseline, tmp_path):
    base = read_run_dir(baseline)
    bare = doc["write_run"](
        tmp_path / "bare",
        accum_steps=1,
        micro_losses=base.micro_loss,
        init_weights=ordered(base, base.init_weights()),
        update_weights=[ordered(base, base.weights(i)) for i in range(UPDATES)],
    )
    result = compare(base, read_run_dir(bare))
    assert result.verdict == "pass"
    assert check(result, "gradients").status == "not checked"
    assert check(result, "learning rate").status == "not checked"
    assert check(result, "weights").status == "pass"


def test_manifest_and_files(doc, baseline):
    manifest = json.loads((baseline / "manifest.json").read_text())
    assert manifest["format"] == "gradalign-run" and manifest["format_version"] == 1
    assert manifest["accum_steps"] == 1 and manifest["updates"] == UPDATES
    assert [t["name"] for t in manifest["tensors"]] == ["w", "b"]
    assert manifest["tensors"][1] == {"name": "b", "shape": [], "dtype": "float64", "kind": "param"}
    assert set(manifest["files"]) == {
        "series.safetensors",
        "weights/init.safetensors",
        *(f"weights/update_{i:06d}.safetensors" for i in range(UPDATES)),
        *(f"grads/update_{i:06d}.safetensors" for i in range(UPDATES)),
    }
    assert not list(baseline.parent.glob(".*partial*"))


def read_blob(blob: bytes, folder: Path) -> dict[str, np.ndarray]:
    path = folder / "t.safetensors"
    path.write_bytes(blob)
    return tensors.read(path)


def test_doc_encoder_is_read_by_the_package(doc, tmp_path):
    tensors = {
        "z": np.arange(6, dtype=np.float32).reshape(2, 3),
        "a": np.array([3, -1], dtype=np.int64),
        "m": np.array([True, False]),
        "h": np.array([1.5, -2], dtype=">f2"),
        "e": np.zeros((0, 4), dtype=np.uint8),
    }
    back = read_blob(doc["encode_safetensors"](tensors), tmp_path)
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(back[name], value)


def test_doc_encoder_keeps_zero_dim_tensors(doc, tmp_path):
    blob = doc["encode_safetensors"]({"s": np.array(2.5), "t": np.arange(6.0).reshape(2, 3).T})
    back = read_blob(blob, tmp_path)
    assert back["s"].shape == () and back["s"] == 2.5
    np.testing.assert_array_equal(back["t"], np.arange(6.0).reshape(2, 3).T)


def test_fingerprint_is_the_bit_sum(doc):
    a = np.array([1.0, -2.0], dtype=np.float32)
    assert doc["fingerprint"](a) == int(a.view(np.int32).astype(np.int64).sum())
    assert doc["fingerprint"](np.array([True, True, False])) == 2
    big = np.full(4, -1.0)  # bit patterns near the int64 limit: the sum wraps around
    expected = (int(big.view(np.int64)[0]) * 4 + 2**63) % 2**64 - 2**63
    assert doc["fingerprint"](big) == expected
    assert doc["fingerprint"](a.astype(">f4")) == doc["fingerprint"](a)


def test_altered_weights_file_fails_its_checksum(doc, tmp_path):
    run_dir = train(doc, tmp_path / "run", k=K)
    target = run_dir / "weights" / "update_000000.safetensors"
    blob = bytearray(target.read_bytes())
    blob[-1] ^= 0x01
    target.write_bytes(bytes(blob))
    run = read_run_dir(run_dir)
    with pytest.raises(BadInput, match="checksum"):
        run.weights(0)
    baseline = train(doc, tmp_path / "baseline", k=1)
    with pytest.raises(BadInput, match="checksum"):
        compare(read_run_dir(baseline), run)


def test_refuses_to_overwrite(doc, baseline):
    base = read_run_dir(baseline)
    with pytest.raises(FileExistsError):
        doc["write_run"](
            baseline,
            accum_steps=1,
            micro_losses=base.micro_loss,
            init_weights=base.init_weights(),
            update_weights=[base.weights(i) for i in range(UPDATES)],
        )


def _by_hand(cuts, accumulate, max_norm: float | None = None) -> dict:
    """SGD by hand over UPDATES batches, each split at `cuts` (row ranges within the batch) into
    micro-batches; `accumulate(j, held, grad, rows)` is the window's gradient after micro-batch
    j; `max_norm`: the window's gradient clipped once to that norm. What `write_run` takes,
    with each micro-step's accumulated gradient (`held`) and each window's norm before its clip
    (`norms`)."""
    x, y = data()
    weights, start = init_weights(), init_weights()
    out: dict = {"micro_losses": [], "update_weights": [], "grads": [], "held": [], "norms": []}
    for i in range(UPDATES):
        held = {n: np.zeros_like(v) for n, v in weights.items()}
        for j, (a, b) in enumerate(cuts):
            rows = slice(i * BATCH + a, i * BATCH + b)
            loss, grad = loss_and_grad(weights, x[rows], y[rows])
            out["micro_losses"].append(loss)
            held = accumulate(j, held, grad, b - a)
            out["held"].append(held)
        norm = float(np.sqrt(sum(float(np.sum(g**2)) for g in held.values())))
        out["norms"].append(norm)
        if max_norm is not None:
            held = {n: g * min(1.0, max_norm / norm) for n, g in held.items()}
        out["grads"].append(held)
        weights = {n: weights[n] - LR * held[n] for n in weights}
        out["update_weights"].append({n: v.copy() for n, v in weights.items()})
    return {**out, "init_weights": start, "accum_steps": len(cuts)}


def _equal(k: int) -> list[tuple[int, int]]:
    return [(j * (BATCH // k), (j + 1) * (BATCH // k)) for j in range(k)]


def _written(doc, out: Path, trained: dict, **more) -> Path:
    kept = {key: v for key, v in trained.items() if key not in ("held", "norms")}
    return doc["write_run"](out, **kept, **more)


def _uneven(doc, out: Path, items: bool) -> Path:
    """K=2 micro-batches of 3 and 5 samples per batch of 8, each gradient weighted by its share
    of the batch (the batch's own gradient); `items`: their sample counts written too."""
    cuts = [(0, 3), (3, BATCH)]
    trained = _by_hand(cuts, lambda j, held, g, n: {k: held[k] + g[k] * n / BATCH for k in held})
    counts = [b - a for a, b in cuts] * UPDATES
    return _written(doc, out, trained, micro_items=counts if items else None)


def test_unequal_micro_batches_need_their_counts_and_the_fix_says_where(doc, baseline, tmp_path):
    """Micro-batches of unequal sizes written without `micro_items`: the window's plain mean of
    their losses is not the batch's, `loss-averaging`, whose fix named only the Recorder's
    `micro(loss, items=n)`; it names the run format's series and the writer's argument too.
    With the counts the run passes."""
    base = read_run_dir(baseline)
    bare = compare(base, read_run_dir(_uneven(doc, tmp_path / "bare", items=False)))
    assert bare.verdict == "fail" and bare.diagnosis[0].code == "loss-averaging", bare.diagnosis
    assert "micro/items" in bare.diagnosis[0].fix and "micro_items" in bare.diagnosis[0].fix
    counted = compare(base, read_run_dir(_uneven(doc, tmp_path / "counted", items=True)))
    assert counted.verdict == "pass", [(d.code, d.message) for d in counted.diagnosis]


def _skipping(doc, out: Path, grad_states: bool) -> Path:
    """K=4, the third micro-batch's loss recorded and its gradient never added (a backward
    skipped); `grad_states`: the accumulated gradient's fingerprints after each micro-step
    written too, through `more_series` (`micro/grad_state`)."""

    def skipped(j, held, grad, rows):
        return held if j == 2 else {n: held[n] + grad[n] / K for n in held}

    trained = _by_hand(_equal(K), skipped)
    prints = [[doc["fingerprint"](held[n]) for n in held] for held in trained["held"]]
    more = {"micro/grad_state": np.array(prints, np.int64)} if grad_states else None
    return _written(doc, out, trained, more_series=more)


def test_more_series_carry_what_names_a_skipped_backward(doc, baseline, tmp_path):
    """A micro-batch's backward skipped, written by the portable writer: without the
    accumulated gradient's fingerprints it can only be suspected (`cross-sample-loss`, "1 of
    the K=4 micro-batches' gradients left out"); `more_series` writes `micro/grad_state`, and
    it is named `micro-batch-missing`."""
    base = read_run_dir(baseline)
    bare = compare(base, read_run_dir(_skipping(doc, tmp_path / "bare", False)))
    assert bare.verdict == "fail" and bare.diagnosis[0].code != "micro-batch-missing"
    named = compare(base, read_run_dir(_skipping(doc, tmp_path / "named", True)))
    assert named.diagnosis[0].code == "micro-batch-missing", named.diagnosis
    with pytest.raises(ValueError, match="its own argument"):
        _ = doc["write_run"](
            tmp_path / "twice",
            accum_steps=1,
            micro_losses=[1.0],
            init_weights=init_weights(),
            update_weights=[init_weights()],
            more_series={"micro/loss": np.ones(1)},
        )


def _clipped(doc, out: Path, k: int, cleared: bool, counted: bool = False) -> Path:
    """SGD clipped at 0.05 of the gradient's norm once per window (it engages at every update);
    `cleared`: the merged window keeps its last micro-batch's gradient alone (zero_grad inside
    it); `counted`: those zero_grad calls written (`update/zero_grads_inside`)."""

    def kept(j, held, grad, rows):
        kept = {n: np.zeros_like(v) for n, v in held.items()} if cleared and j > 0 else held
        return {n: kept[n] + grad[n] / k for n in kept}

    trained = _by_hand(_equal(k), kept, max_norm=0.05)
    inside = {"update/zero_grads_inside": np.full(UPDATES, k - 1, np.int64)}
    more = inside if counted else None
    return _written(doc, out, trained, grad_norm_pre_clip=trained["norms"], more_series=more)


def test_a_window_cleared_under_a_clip_is_told_from_the_norms_alone_or_named(doc, tmp_path):
    """zero_grad inside the window of a run whose clip engages, written without counts: read
    from the norms alone as a clip inside the window, which the message now says, naming the
    counts that tell the two apart; with `update/zero_grads_inside` written it is
    `zero-grad-in-window`."""
    base = read_run_dir(_clipped(doc, tmp_path / "base", 1, False))
    assert compare(base, read_run_dir(_clipped(doc, tmp_path / "ok", K, False))).verdict == "pass"
    bare = compare(base, read_run_dir(_clipped(doc, tmp_path / "bare", K, True)))
    first = bare.diagnosis[0]
    assert first.code == "clip-per-micro" and "read from the norms alone" in first.message
    assert "update/zero_grads_inside" in first.message
    counted = compare(base, read_run_dir(_clipped(doc, tmp_path / "counted", K, True, True)))
    assert counted.diagnosis[0].code == "zero-grad-in-window", counted.diagnosis
