"""Record a PaddlePaddle dygraph gradient-merge loop in gradalign's run format, numpy only.

The seed experiment of the PaddlePaddle notes: a 784-256-10 MLP, batch 128 for 12 updates
against 4 micro-batches of 32 merged per update (k=4), SGD. Each run is written with
`gradalign.runs.portable.write_run` (numpy, no torch): losses, sample digests, weight
fingerprints at every micro-step, the merged gradient before each step, the weights after it,
the lr; the float64 rerun of the baseline is its noise floor.

    pip install paddlepaddle                              # a CPU build is enough
    python examples/paddle_gradient_merge.py runs/paddle  # k1, k1-fp64, k4
    gradalign compare runs/paddle/k1 runs/paddle/k4       # pass
    python examples/paddle_gradient_merge.py runs/paddle --bug no-loss-scale
    gradalign compare runs/paddle/k1 runs/paddle/k4-no-loss-scale   # loss-scale

`gradalign compare` needs no paddle (and no torch); this script needs paddle and numpy.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from gradalign.runs.portable import fingerprint, sample_digest, write_run

FEATURES, HIDDEN, CLASSES = 784, 256, 10
BATCH, UPDATES, LR = 128, 12, 0.1
BUGS = {
    "no-loss-scale": "each micro-batch's loss backpropagated without dividing by k",
    "step-every-micro": "the optimizer stepped after every micro-batch",
}


def make_data(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ten Gaussian classes of 784 features: float32 inputs, int64 labels."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=samples)
    x = centers[y] + rng.normal(scale=2.0, size=(samples, FEATURES)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


def make_model(paddle: Any, dtype: str) -> Any:
    """The MLP, seeded; a float64 model starts from the float32 model's weights."""
    paddle.seed(0)
    model = _mlp(paddle)
    if dtype != "float32":
        state = {name: value.astype(dtype) for name, value in model.state_dict().items()}
        paddle.set_default_dtype(dtype)
        try:
            model = _mlp(paddle)
        finally:
            paddle.set_default_dtype("float32")
        model.set_state_dict(state)
    return model


def _mlp(paddle: Any) -> Any:
    nn = paddle.nn
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def train(
    out: Path,
    k: int,
    *,
    dtype: str = "float32",
    bug: str | None = None,
    reference: str | None = None,
) -> Path:
    """Train UPDATES updates of BATCH samples as k merged micro-batches; write the run to `out`."""
    import paddle

    paddle.set_device("cpu")
    x, y = make_data(BATCH * UPDATES)
    model = make_model(paddle, dtype)
    optimizer = paddle.optimizer.SGD(learning_rate=LR, parameters=model.parameters())
    params = list(model.named_parameters())

    def weights() -> dict[str, np.ndarray]:
        return {name: p.numpy().copy() for name, p in params}

    init, updates, grads, lr, steps = weights(), [], [], [], []
    losses, digests, states = [], [], []
    micro = BATCH // k
    for update in range(UPDATES):
        stepped = 0
        for j in range(k):
            rows = slice((update * k + j) * micro, (update * k + j + 1) * micro)
            inputs = paddle.to_tensor(x[rows].astype(dtype))
            loss = paddle.nn.functional.cross_entropy(model(inputs), paddle.to_tensor(y[rows]))
            (loss if bug == "no-loss-scale" else loss / k).backward()
            losses.append(float(loss))  # the micro-batch's own mean, not divided by k
            digests.append(sample_digest(x[rows], y[rows]))
            states.append([fingerprint(p.numpy()) for _, p in params])
            if bug == "step-every-micro" and j < k - 1:
                optimizer.step()
                stepped += 1
        grads.append({name: p.grad.numpy().copy() for name, p in params})
        optimizer.step()
        optimizer.clear_grad()
        lr.append(optimizer.get_lr())
        steps.append(stepped + 1)
        updates.append(weights())
    return write_run(
        out,
        accum_steps=k,
        micro_losses=losses,
        init_weights=init,
        update_weights=updates,
        grads=grads,
        lr=lr,
        micro_data=digests,
        micro_state=states,
        optimizer_steps=steps,
        reference=reference,
        grad_dtype=dtype,
        model={"batchnorm": [], "dropout": [], "training": True},
        config={"framework": "paddle", "batch_size": BATCH, "lr": LR, "optimizer": "sgd"},
    )


def record_all(root: Path, bug: str | None = None, k: int = 4) -> dict[str, Path]:
    """The baseline with its float64 reference (once), and the merged run (with `bug`)."""
    runs = {"k1": root / "k1", "k1-fp64": root / "k1-fp64"}
    if not runs["k1"].exists():
        train(runs["k1"], 1, reference="../k1-fp64")
    if not runs["k1-fp64"].exists():
        train(runs["k1-fp64"], 1, dtype="float64")
    name = f"k{k}" + (f"-{bug}" if bug else "")
    runs[name] = train(root / name, k, bug=bug)
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the runs")
    parser.add_argument("--bug", choices=sorted(BUGS), help="record the merged run with this bug")
    ns = parser.parse_args(argv)
    ns.out.mkdir(parents=True, exist_ok=True)
    for name, path in record_all(ns.out, ns.bug).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
