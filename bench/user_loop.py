"""A user's own training loop of a chosen size, for the benchmarks: an MLP on random data,
AdamW, B=128, K micro-batches per update, recorded through the public `Recorder` (or not).

    SIZES: mlp-1m (784-1200-10, 0.95M parameters), mlp-10m (784-2048-2048-2048-10, 10.0M),
           mlp-50m (784-4096-4096-4096-4096-10, 53.6M), mlp-100m (784-8192-8192-4096-10, 107M)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SIZES = {
    "mlp-1m": [1200],
    "mlp-10m": [2048, 2048, 2048],
    "mlp-50m": [4096, 4096, 4096, 4096],
    "mlp-100m": [8192, 8192, 4096],
}


BUGS = ("no-zero-grad", "no-loss-scale", "penalty-every-micro")


def build(size: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    widths, layers, last = SIZES[size], [], 784
    for width in widths:
        layers += [torch.nn.Linear(last, width), torch.nn.ReLU()]
        last = width
    layers.append(torch.nn.Linear(last, 10))
    return torch.nn.Sequential(*layers).to(dtype)


def parameters(size: str) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build(size).parameters())


def data(batch: int, updates: int, seed: int = 0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch * updates, 784, generator=generator).to(dtype)
    y = torch.randint(0, 10, (batch * updates,), generator=generator)
    return x, y


def train(
    size: str,
    out: Path | None,
    *,
    k: int = 4,
    batch: int = 128,
    updates: int = 12,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    reference: str | None = None,
    device: str = "cpu",
    stand_in: Any = None,
    clip: float | None = None,
    bug: str | None = None,
    **recorder: Any,
) -> None:
    """Train `updates` updates of K micro-batches on `device`; record to `out` unless it is None.
    On CUDA it returns after the device has finished (the timings stop there). `stand_in`:
    given the model, an object taking the Recorder's calls instead (out must be None). `clip`:
    clip the accumulated gradient to that norm before each step. `bug`: one of BUGS, for a run
    that must fail (bench/failing_memory.py)."""
    from gradalign import Recorder

    model = build(size, seed, dtype).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    x, y = (t.to(device) for t in data(batch, updates, seed, dtype))
    rec = None if stand_in is None else stand_in(model)
    if out is not None:
        rec = Recorder(
            out,
            model,
            optimizer,
            k,
            {"model": size, "seed": seed},
            reference=reference,
            updates=updates,
            **recorder,
        )
    micro = batch // k
    try:
        for update in range(updates):
            for j in range(k):
                rows = slice(update * batch + j * micro, update * batch + (j + 1) * micro)
                loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows])
                if bug == "penalty-every-micro":  # 1e-3·Σw² in every micro loss, K times
                    loss = loss + 1e-3 * sum((p * p).sum() for p in model.parameters())
                (loss if bug == "no-loss-scale" else loss / k).backward()
                if rec is not None:
                    rec.micro(loss, batch=(x[rows], y[rows]))
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            if rec is not None:
                rec.update()
            if bug != "no-zero-grad":
                optimizer.zero_grad(set_to_none=True)
    except BaseException:
        if rec is not None:
            rec.abort()
        raise
    if rec is not None:
        rec.close()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
