"""The Recorder's checks of its arguments: misuse of the Python API is one `RecorderError` sentence
saying what was wrong, raised before any directory is staged or as the call is made, never a
torch, numpy or json error from deep inside, and never a run that records something else.

Calls in the wrong order (micro() more or fewer than K times, grads() twice, update() forgotten)
are not misuse here: they are recorded as they ran, and the judge names them (record/window.py).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
import torch

from ..errors import shown
from ..runs.schema import compute_dtype_error, is_int
from .facts import RecorderError, sample_digest
from .samples import Digest


def check_arguments(
    out_dir: Any,
    model: Any,
    accum_steps: Any,
    config: Any,
    texts: dict[str, Any],
    record: Any,
    modes: tuple[str, ...],
    snapshot_every: Any,
    updates: Any,
    sketch_width: Any,
    scaler: Any,
) -> dict[str, Any]:
    """Refuse, before any work, a Recorder argument that cannot describe a run; returns a copy of
    `config`. `texts`: the arguments that are a string or None (fault, reference, ...)."""
    if not isinstance(out_dir, str | os.PathLike):
        raise RecorderError(f"out_dir must be a path (a str or a Path), got {_kind(out_dir)}")
    if not isinstance(model, torch.nn.Module):
        raise RecorderError(f"model must be a torch.nn.Module, got {_kind(model)}")
    if not is_int(accum_steps) or accum_steps < 1:
        raise RecorderError(f"accum_steps must be a positive integer, got {accum_steps!r}")
    if not isinstance(record, str) or record not in modes:
        raise RecorderError(f"record must be one of {', '.join(modes)}, got {record!r}")
    if not is_int(snapshot_every) or snapshot_every < 0:
        raise RecorderError(f"snapshot_every must be an integer >= 0, got {snapshot_every!r}")
    if updates is not None and (not is_int(updates) or updates < 1):
        raise RecorderError(f"updates must be a positive integer (or None), got {updates!r}")
    if not is_int(sketch_width) or sketch_width < 2 or not _prime(sketch_width):
        raise RecorderError(
            f"sketch_width must be an integer >= 2 and a prime, got {sketch_width!r}"
        )
    for name, value in texts.items():
        if value is not None and (not isinstance(value, str) or not value):
            raise RecorderError(f"{name} must be a non-empty string (or None), got {_kind(value)}")
    if (why := compute_dtype_error(texts.get("compute_dtype"))) is not None:
        raise RecorderError(f"compute_dtype {why}")
    if scaler is not None and not all(callable(getattr(scaler, m, None)) for m in _SCALER):
        raise RecorderError(
            f"scaler must be the loop's GradScaler (with unscale_() and update()), got "
            f"{_kind(scaler)}"
        )
    return config_of(config)


_SCALER = ("unscale_", "update", "get_scale")


def _prime(n: int) -> bool:
    return all(n % d for d in range(2, math.isqrt(n) + 1))


def _kind(value: Any) -> str:
    """A wrong argument for a message: its type, and its value where that is short."""
    if value is None or isinstance(value, bool | int | float | str):
        return shown(value)
    return type(value).__name__


def config_of(config: Any) -> dict[str, Any]:
    """The config, a dict the run's manifest (JSON) can hold: refused now, not at close()."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise RecorderError(f"config must be a dict of JSON values, got {_kind(config)}")
    plain = {}
    for key, value in config.items():
        if not isinstance(key, str):
            raise RecorderError(f"config keys must be strings, got {_kind(key)}")
        try:
            plain[key] = _plain(value)
            json.dumps(plain[key], allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            raise RecorderError(
                f"config[{shown(key)}] must be a JSON value (a number, string, bool, None, or a "
                f"list or dict of them; no NaN), got {_kind(value)}"
            ) from None
    return plain


def _plain(value: Any) -> Any:
    """numpy scalars and one-element tensors as the Python numbers they hold (a learning rate
    read from a param group may be a tensor); lists, tuples and dicts item by item."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.detach().reshape(()).item()
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def check_parameters(
    optimizer: torch.optim.Optimizer, named: dict[str, tuple[torch.Tensor, str, tuple]]
) -> dict[str, int] | None:
    """A model whose weights hold no data (the meta device), or an optimizer that steps none of
    its parameters (another model's), would be recorded as a run that never trains. Returns
    `outside_parameters`: what else the optimizer steps."""
    for name, (tensor, _, _) in named.items():
        if tensor.is_meta:
            raise RecorderError(
                f"{name} is on the meta device (it holds no data): create the Recorder once the "
                "model's weights are materialized (to_empty() and loaded, or moved to a device)"
            )
    mine = {id(t) for t, kind, _ in named.values() if kind == "param"}
    if not mine:
        only = " (only buffers)" if named else ""
        raise RecorderError(f"the model has no parameters to record{only}")
    stepped = [p for group in optimizer.param_groups for p in group["params"]]
    if stepped and not any(id(p) in mine for p in stepped):
        raise RecorderError(
            "the optimizer updates none of the model's parameters: pass the optimizer built from "
            "this model's parameters (model.parameters()); for float32 master weights of a "
            "16-bit model, give the Recorder the masters (nn.ParameterList(masters)) and the "
            "model's dtype as compute_dtype="
        )
    return outside_parameters(optimizer, named)


def outside_parameters(
    optimizer: torch.optim.Optimizer, named: dict[str, tuple[torch.Tensor, str, tuple]]
) -> dict[str, int] | None:
    """Tensors the optimizer steps that the model given to the Recorder does not hold (a loss's
    learnable weights kept apart): how many, and their elements; None where there are none."""
    mine = {id(t) for t, kind, _ in named.values() if kind == "param"}
    seen: set[int] = set()
    outside = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in mine and id(p) not in seen:
                seen.add(id(p))
                outside.append(p)
    if not outside:
        return None
    return {"tensors": len(outside), "elements": sum(p.numel() for p in outside)}


def check_unchanged(
    model: torch.nn.Module,
    named: dict[str, tuple[torch.Tensor, str, tuple]],
    dtypes: dict[str, torch.dtype],
) -> dict[str, torch.Tensor]:
    """The model's parameters are still the tensors the Recorder watches, of the same shapes and
    dtypes: one replaced, added, resized or cast (`model.half()` keeps the objects) during the
    run would be recorded as it was, not as it trains. Returns the buffers the model assigned
    anew with the same shape and dtype (`self.count = self.count + 1`), recorded from now on;
    a buffer resized (a cache grown for longer sequences), added or removed is left as it was
    watched: buffers are the model's own state, not training's."""
    params = {name: (t, shape) for name, (t, kind, shape) in named.items() if kind == "param"}
    now = dict(model.named_parameters())
    for name, param in now.items():
        before = params.get(name)
        if before is None:
            what = "was added"
        elif before[0] is not param:
            what = "was replaced by a new tensor"
        elif tuple(param.shape) != before[1]:
            what = f"changed shape from {tuple(before[1])} to {tuple(param.shape)}"
        elif param.dtype != dtypes[name]:
            what = f"changed dtype from {dtypes[name]} to {param.dtype}"
        else:
            continue
        raise RecorderError(
            f"parameter {name} {what} during the run: change the model before creating the "
            "Recorder (it records the parameters it was given, as they were)"
        )
    gone = [name for name in params if name not in now]
    if gone:
        raise RecorderError(
            f"parameter {gone[0]} was removed from the model during the run: change the model "
            "before creating the Recorder (it records the parameters it was given)"
        )
    renewed = {}
    for name, buffer in model.named_buffers():
        watched = named.get(name)
        if watched is None or watched[1] != "buffer" or watched[0] is buffer:
            continue
        if tuple(buffer.shape) == watched[2] and buffer.dtype == dtypes[name]:
            renewed[name] = buffer
    return renewed


def count_of_items(items: Any, what: str = "micro(items)") -> float:
    """micro(items=...) as a float: a count >= 0 (an int, a float, or a one-element tensor)."""
    value = number(items, what)
    if not math.isfinite(value) or value < 0:
        raise RecorderError(f"{what} must be a count >= 0, got {shown(value)}")
    return value


def loss_scale_of(value: Any) -> float | None:
    """update(loss_scale=...): the GradScaler's scale, a positive number (not the loss)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.requires_grad:
        raise RecorderError(
            "update(loss_scale) got a tensor that requires grad (the loss?): the loss goes to "
            "micro(); loss_scale is the GradScaler's scale (scaler.get_scale())"
        )
    scale = number(value, "update(loss_scale)")
    if not math.isfinite(scale) or scale <= 0:
        raise RecorderError(f"update(loss_scale) must be a positive number, got {shown(scale)}")
    return scale


def number(value: Any, what: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise RecorderError(
                f"{what} must be one number; got a tensor of shape {tuple(value.shape)}"
            )
        value = value.detach().reshape(()).item()
    if isinstance(value, str | bytes | bool | complex) or value is None:
        raise RecorderError(f"{what} must be a number, got {_kind(value)}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RecorderError(f"{what} must be a number, got {_kind(value)}") from None


def digest_of(batch: Any, pad: Any, mask: Any) -> Digest | None:
    """micro()'s sample digests (None without a batch): `pad` and `mask` need a batch."""
    if batch is None:
        if pad is not None or mask is not None:
            raise RecorderError("micro(pad=, mask=) leave padding out of batch=: give the batch")
        return None
    return sample_digest(batch, pad=pad, mask=mask)
