"""Will it fit? Memory and disk a built-in run needs, checked before anything is allocated.

An absurd `--updates`, `--batch-size` or `--hidden` must be a one-line refusal with the numbers,
not a MemoryError minutes later or a full disk. The model is built on torch's `meta` device
(shapes only, no memory) to count its parameters; the user's own model and data factories are
not estimated (they run once in the preflight, where a failure is reported as such).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from ..config import TrainConfig
from ..errors import BadInput
from .models import FEATURES, build_model
from .tinylm import CONTEXT

GIB = 1 << 30
HEADROOM = 0.9  # use at most this share of what is free


def parameters(config: TrainConfig) -> int:
    """The number of parameters of a built-in model, counted without allocating it."""
    with torch.device("meta"):
        model = build_model(config)
    return sum(p.numel() for p in model.parameters())


def memory_needed(config: TrainConfig, params: int) -> int:
    """Bytes of the data (generated in float64, then cast), the model with its gradients and
    optimizer state, and two snapshots in flight."""
    samples = config.batch_size * config.updates
    if config.model == "tiny-lm":
        data = samples * (CONTEXT + 1) * 8 * 4
    else:
        data = samples * FEATURES * (8 + 4 + 8)
    width = 8 if config.param_dtype == "float64" else 4
    return data + params * width * 6


def disk_needed(config: TrainConfig, params: int, runs: int) -> int:
    """Bytes of `runs` run directories: weights after every update and the initial ones, and
    the gradients; a float64 reference counts twice (8-byte values)."""
    per_run = (2 * config.updates + 1) * params * 4
    return per_run * (runs + 1)


def available_memory() -> int | None:
    """What the system reports as available (Linux MemAvailable), else physical memory."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _free_disk(path: Path) -> int | None:
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def check_budget(config: TrainConfig, outs: list[Path]) -> None:
    """Refuse a built-in run that cannot fit in this machine's memory or on the output's disk."""
    if any(":" in (value or "") for value in (config.model, config.data)):
        return  # the user's own model or data: their factories decide
    params = parameters(config)
    need = memory_needed(config, params) * config.nproc  # each rank holds the data and model
    have = available_memory()
    if have is not None and need > HEADROOM * have:
        raise BadInput(
            f"this run needs about {need / GIB:.3g} GiB of memory ({params:,} parameters, "
            f"{config.batch_size * config.updates:,} samples); {have / GIB:.3g} GiB is available: "
            "reduce --hidden, --batch-size or --updates"
        )
    if outs:
        need_disk = disk_needed(config, params, len(outs))
        free = _free_disk(outs[0].parent)
        if free is not None and need_disk > HEADROOM * free:
            raise BadInput(
                f"the runs would take about {need_disk / GIB:.3g} GiB of disk; "
                f"{free / GIB:.3g} GiB is free where they go: reduce --updates or --hidden, or "
                "choose another --out"
            )
