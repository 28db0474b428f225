"""Simulate the seed experiment (fixtures/paddle/README.md) in numpy and print its logs the way a
PaddlePaddle 3 script prints them, to reproduce what real logs look like without Paddle.

The training: a 784-256-10 ReLU MLP in float32, softmax cross-entropy (mean over the batch), SGD,
12 updates of B=128 (the baseline) against 48 micro-steps of B=32 with k=4, gradients summed over
a window and divided by k before the step (Paddle's GradientMergeOptimizer with avg=True). The
script prints what the seed's script printed: `<step>   <loss>` after each run, the first weight
as `------------>` + the numpy array (a truncated 784x256 grid), and `avgloss -------->` + the
window mean before each window's last step line; here it also prints the output layer's bias
(a 1-D array). What Paddle 3 changes, reproduced here:

- the loss is a 0-d array, printed without brackets (`0   2.341438`);
- numpy's default print options: a block whose shown values span more than 1e3 or hold one below
  1e-4 is printed in scientific notation (`-7.0300000e-05`), the others in fixed notation;
- framework lines (glog, warnings, launcher lines, progress bars) at the top and interleaved,
  as `python train.py > log 2>&1` captures them.

`gradalign selftest` judges them (written into its output directory); `python
fixtures/paddle/make_logs.py [--out DIR]` rewrites the committed copies (numpy only; about a
second). Outputs:

| file | what |
|---|---|
| `p3_run.log` | baseline, B=128, 12 steps |
| `p3_run_grad.log` | gradient merge, B=32, 48 micro-steps, k=4 (clean) |
| `p3_run_grad_updates.log` | the same run, weights printed only after each update |
| `p3_run_grad_step_every_micro.log` | a bug: the optimizer steps after every micro-step |
| `workerlog.0`, `workerlog.1` | two cards, k=2, 32 samples per card and micro-step, each card |
|  | printing its own mean loss; gradients all-reduced (averaged) once per window |
| `workerlog_unsynced.0`, `.1` | a bug: the same without the all-reduce: the replicas drift apart; |
|  | weights printed only after each update |
| `workerlog_share.0`, `.1` | two cards, each printing its share (its samples' loss sum over the |
|  | global count), gradients summed; weights printed only after each update |

Float32 matrix products sum in another order at another batch size, so the merged weights differ
from the baseline's in their last bits, as on real hardware. Regenerated on another machine (another
BLAS) the files may differ in those bits; the tests judge them, they never compare bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

F32 = np.float32
BATCH, UPDATES, K, LR, SEED = 128, 12, 4, 0.1, 0
PROBE = (-2, 2)  # a shown corner element of the weight grid, steered to cross 1e-4 mid-run

HEADER = [
    "W1122 08:14:03.512210 40211 gpu_resources.cc:119] Please NOTE: device: 0, GPU Compute "
    "Capability: 8.0, Driver API Version: 12.2, Runtime API Version: 11.8",
    "W1122 08:14:03.513902 40211 gpu_resources.cc:164] device: 0, cuDNN Version: 8.9.",
    "/usr/local/lib/python3.10/dist-packages/paddle/base/framework.py:688: UserWarning: "
    "paddle.static.gradient_merge is deprecated and will be removed in a future release",
    "  warnings.warn(",
    "I1122 08:14:04.100311 40211 interpretercore.cc:237] New Executor is Running.",
]
INTERLEAVED = [
    "I1122 08:14:05.002817 40211 program_interpreter.cc:212] New Executor is Running.",
    "W1122 08:14:05.914411 40211 dygraph_functions.cc:84] Detected an unused parameter; "
    "check your model",
]
LAUNCH = [
    "LAUNCH INFO 2026-11-22 08:15:00,101 -----------  Configuration  ----------------------",
    "LAUNCH INFO 2026-11-22 08:15:00,101 devices: 0,1",
    "[2026-11-22 08:15:01,234] [    INFO] distributed_strategy.py:214 - distributed strategy "
    "initialized",
    "I1122 08:15:01.443912 40311 tcp_utils.cc:181] The server starts to listen on IP_ANY:59457",
    "server not ready, wait 3 sec to retry...",
    "100%|" + "\u2588" * 10 + "| 2/2 [00:01<00:00,  1.52it/s]",
]


def make_data() -> tuple[np.ndarray, np.ndarray]:
    """Ten Gaussian classes in 784 features, BATCH * UPDATES rows in training order."""
    rng = np.random.default_rng(SEED + 1)
    centers = rng.normal(size=(10, 784)).astype(F32) * F32(0.15)
    labels = rng.integers(0, 10, size=BATCH * UPDATES)
    x = centers[labels] + rng.normal(size=(BATCH * UPDATES, 784)).astype(F32)
    return x.astype(F32), labels


def init_params(probe: float | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    params = {
        "w1": (rng.normal(size=(784, 256)) * 0.02).astype(F32),
        "b1": np.zeros(256, F32),
        "w2": (rng.normal(size=(256, 10)) * 0.05).astype(F32),
        "b2": (rng.normal(size=10) * 0.02).astype(F32),
    }
    if probe is not None:
        params["w1"][PROBE] = F32(probe)
    return params


def loss_and_grads(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, scale: float):
    """Mean cross-entropy over the rows of x (times `scale`), and its gradients, in float32."""
    h_pre = x @ p["w1"] + p["b1"]
    h = np.maximum(h_pre, F32(0))
    logits = h @ p["w2"] + p["b2"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    n = x.shape[0]
    loss = F32(-log_probs[np.arange(n), y].mean(dtype=F32) * F32(scale))
    d_logits = np.exp(log_probs)
    d_logits[np.arange(n), y] -= F32(1)
    d_logits *= F32(scale / n)
    d_h = (d_logits @ p["w2"].T) * (h_pre > 0)
    grads = {
        "w1": x.T @ d_h,
        "b1": d_h.sum(axis=0, dtype=F32),
        "w2": h.T @ d_logits,
        "b2": d_logits.sum(axis=0, dtype=F32),
    }
    return loss, grads


def train(
    cards: int = 1,
    k: int = 1,
    *,
    step_every_micro: bool = False,
    all_reduce: bool = True,
    card_loss: str = "mean",
    probe: float | None = None,
) -> list[dict]:
    """Per card, per micro-step: the loss printed and the parameters after the micro-step.

    `card_loss` "mean": each card's loss is the mean over its own samples and the cards'
    gradients are averaged; "sum": each card's loss is its samples' sum divided by the global
    count (its share), and the cards' gradients are summed."""
    share = 1.0 / cards if card_loss == "sum" else 1.0
    x, y = make_data()
    params = [init_params(probe) for _ in range(cards)]
    size = BATCH // (k * cards)
    steps: list[list[dict]] = [[] for _ in range(cards)]
    for update in range(UPDATES):
        sums: list[dict | None] = [None] * cards
        for micro in range(k):
            for card in range(cards):
                start = update * BATCH + (micro * cards + card) * size
                rows = slice(start, start + size)
                loss, grads = loss_and_grads(params[card], x[rows], y[rows], share)
                if step_every_micro:
                    for name in grads:
                        params[card][name] -= F32(LR) * (grads[name] / F32(k))
                else:
                    prev = sums[card]
                    sums[card] = grads if prev is None else {n: prev[n] + grads[n] for n in grads}
                last = micro == k - 1
                if last and not step_every_micro:
                    steps[card].append({"loss": loss})  # stepped below, once every card is done
                else:
                    steps[card].append({"loss": loss, "params": _copy(params[card])})
        if step_every_micro:
            continue
        total = sums
        if cards > 1 and all_reduce:  # x0 + x1 is the same in either order: identical replicas
            divide = F32(cards if card_loss == "mean" else 1)
            reduced = {n: sum(s[n] for s in sums) / divide for n in sums[0]}
            total = [reduced] * cards
        for card in range(cards):
            for name, grad in total[card].items():
                params[card][name] -= F32(LR) * (grad / F32(k))
            steps[card][-1]["params"] = _copy(params[card])
    return steps


def _copy(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {n: v.copy() for n, v in params.items()}


def render(
    steps: list[dict],
    k: int,
    *,
    header: list[str],
    weights_every: str = "micro",
    noise_every: int = 0,
    loss_format: str = "str",
    bias: bool = True,
) -> str:
    """The log a Paddle 3 script prints (numpy's default print options). `loss_format` "str":
    `print(step, "  ", loss)` shows a 0-d float32 array as `2.3205233`; "f-string":
    `print(f"{step}   {loss}")` formats it as a Python float, `2.320523262023926`; "array":
    Paddle 2's 1-element loss, `[2.3205233]`; "tensor": a dygraph script printing Paddle
    Tensors (`paddle_str`), the loss, the window mean and the weights alike. `bias`: also print
    the output bias (1-D)."""
    lines = list(header)
    window = F32(0)
    for step, record in enumerate(steps):
        loss = np.array(record["loss"], dtype=F32)  # a 0-d array: printed without brackets
        window += loss
        if step % k == k - 1 and k > 1:
            lines.append(f"avgloss -------->{_shown(window / F32(k), loss_format)}")
            window = F32(0)
        lines.append(f"{step}   {_shown(loss, loss_format)}")
        if weights_every == "micro" or step % k == k - 1:
            w1 = f"------------>{_array(record['params']['w1'], loss_format)}".splitlines()
            if noise_every and step % noise_every == noise_every - 1:
                w1.insert(3, INTERLEAVED[step // noise_every % len(INTERLEAVED)])
            lines.extend(w1)
            if bias:
                lines.append(f"------------>{_array(record['params']['b2'], loss_format)}")
    return "\n".join(lines) + "\n"


def _array(value: np.ndarray, loss_format: str) -> str:
    """A printed weight: numpy's print, or Paddle's for a script that prints Tensors."""
    return paddle_str(value, stop_gradient=False) if loss_format == "tensor" else f"{value}"


def _shown(value: np.ndarray, loss_format: str) -> str:
    if loss_format == "tensor":
        return paddle_str(value)
    if loss_format == "array":
        return str(np.asarray(value).reshape(1))
    return f"{value}" if loss_format == "f-string" else str(np.asarray(value))


def steered_probe() -> float:
    """An initial value for the probe element that crosses 1e-4 halfway through training, so the
    log holds weight blocks in both notations."""
    first = train()[0]
    drift = float(first[-1]["params"]["w1"][PROBE]) - float(init_params()["w1"][PROBE])
    return 1e-4 - drift / 2


def write_all(out: Path) -> list[Path]:
    with np.printoptions(**DEFAULT_PRINT):  # numpy's defaults, as a Paddle 3 script runs with
        return _write_all(out)


DEFAULT_PRINT = {
    "precision": 8,
    "threshold": 1000,
    "edgeitems": 3,
    "linewidth": 75,
    "suppress": False,
    "nanstr": "nan",
    "infstr": "inf",
    "sign": "-",
    "floatmode": "maxprec",
    "legacy": False,
}


def _write_all(out: Path) -> list[Path]:
    probe = steered_probe()
    base = train(probe=probe)[0]
    merged = train(k=K, probe=probe)[0]
    buggy = train(k=K, step_every_micro=True, probe=probe)[0]
    outputs = {
        "p3_run.log": render(base, 1, header=HEADER, noise_every=5),
        "p3_run_grad.log": render(merged, K, header=HEADER, noise_every=7),
        "p3_run_grad_updates.log": render(merged, K, header=HEADER, weights_every="update"),
        "p3_run_grad_step_every_micro.log": render(buggy, K, header=HEADER),
    }
    variants = {  # name: all-reduce, card loss, weights printed after
        "workerlog": (True, "mean", "micro"),
        "workerlog_unsynced": (False, "mean", "update"),
        "workerlog_share": (True, "sum", "update"),
    }
    for name, (all_reduce, card_loss, every) in variants.items():
        cards = train(cards=2, k=2, all_reduce=all_reduce, card_loss=card_loss, probe=probe)
        for card, card_steps in enumerate(cards):
            outputs[f"{name}.{card}"] = render(
                card_steps,
                2,
                header=LAUNCH + HEADER[:2],
                weights_every=every,
                loss_format="f-string",
            )
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in outputs.items():
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    return written


PADDLE_EDGE = 3  # paddle.set_printoptions defaults: edgeitems, threshold, linewidth, indent
PADDLE_THRESHOLD, PADDLE_WIDTH, PADDLE_INDENT = 1000, 80, len("Tensor(")


def paddle_str(
    value: np.ndarray, *, place: str = "Place(gpu:0)", stop_gradient: bool = True
) -> str:
    """`str(tensor)` of a Paddle dygraph Tensor (paddle/tensor/to_string.py, default options:
    8 digits after the point, every float in fixed notation, whole ones as `2.`, a `...`
    summary above 1000 elements, rows wrapped at 80 columns): the header
    `Tensor(shape=[2], dtype=float32, place=.., stop_gradient=..,`, then the data, indented."""
    value = np.asarray(value)
    summary = value.ndim > 0 and value.size > PADDLE_THRESHOLD
    shown = _paddle_summary(value) if summary else value
    width = max((len(_paddle_item(v)) for v in shown.flat), default=0)
    data = _paddle_format(value, summary, PADDLE_INDENT, width, bool((shown < 0).any()))
    shape = ", ".join(str(d) for d in value.shape)
    return (
        f"Tensor(shape=[{shape}], dtype={value.dtype}, place={place}, "
        f"stop_gradient={stop_gradient},\n{' ' * PADDLE_INDENT}{data})"
    )


def _edges(items: list, cut: bool, gap: list) -> list:
    """The first and last PADDLE_EDGE items around `gap` when `cut`, else all of them."""
    return [*items[:PADDLE_EDGE], *gap, *items[-PADDLE_EDGE:]] if cut else items


def _paddle_summary(value: np.ndarray) -> np.ndarray:
    """The elements a summarized print shows."""
    if value.ndim == 0:
        return value
    rows = _edges(list(value), len(value) > 2 * PADDLE_EDGE, [])
    return np.stack([_paddle_summary(np.asarray(r)) for r in rows])


def _paddle_item(item: float, width: int = 0, signed: bool = False) -> str:
    item = np.float32(item)
    text = f"{item:.0f}." if np.ceil(item) == item else f"{item:.8f}"
    if width <= len(text):
        return text
    return text.ljust(width) if not signed or item < 0 else " " + text.ljust(width - 1)


def _paddle_format(value: np.ndarray, summary: bool, indent: int, width: int, signed: bool) -> str:
    if value.ndim == 0:
        return _paddle_item(value.item(), width, signed)
    cut = summary and len(value) > 2 * PADDLE_EDGE
    shown = _edges(list(value), cut, [None])  # only what is printed gets formatted
    if value.ndim == 1:
        items = ["..." if v is None else _paddle_item(v, width, signed) for v in shown]
        per_line = max(1, (PADDLE_WIDTH - indent) // (width + 2))
        lines = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
        return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"
    rows = [
        "..." if r is None else _paddle_format(r, summary, indent + 1, width, signed) for r in shown
    ]
    return "[" + ("," + "\n" * (value.ndim - 1) + " " * (indent + 1)).join(rows) + "]"
