"""Your own model, data and loss for the built-in trainer, named as `module:attribute`.

    model: mypkg.nets:make_model   # make_model() -> torch.nn.Module (torch is seeded first)
    data:  mypkg.data:make_data    # make_data(samples: int, seed: int) -> (inputs, targets)
    loss:  mypkg.losses:loss_sum   # loss_sum(outputs, targets) -> (summed loss, item count)

`module` is an importable module (the working directory is on the path) or a file path ending in
`.py`. Every mistake (a missing module or attribute, a wrong return type) is a one-line error.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import BadInput, cut, shown


def is_entry_point(value: str | None) -> bool:
    return value is not None and ":" in value


def load(spec: str, what: str) -> Callable[..., Any]:
    """The callable named by `module:attribute` (or `path/file.py:attribute`)."""
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise BadInput(f"{what} {spec!r}: expected module:attribute")
    module = _import(module_name, what, spec)
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise BadInput(f"{what} {spec!r}: module {module_name} has no {attribute!r}") from None
    if not callable(target):
        raise BadInput(f"{what} {spec!r}: {attribute} is not callable")
    return target


def _import(module_name: str, what: str, spec: str):
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise BadInput(f"{what} {spec!r}: no such file {path}")
            name = f"gradalign_user_{path.stem}"
            loader = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader)  # type: ignore[arg-type]
            loader.loader.exec_module(module)  # type: ignore[union-attr]
            return module
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        return importlib.import_module(module_name)
    except BadInput:
        raise
    except ModuleNotFoundError as exc:
        raise BadInput(f"{what} {spec!r}: cannot import {exc.name}") from None
    except SystemExit as exc:  # a script's own argument parsing, run at import
        raise BadInput(
            f"{what} {spec!r}: importing it exited (sys.exit({exc.code!r})); a script that "
            'parses its arguments or trains at import needs an `if __name__ == "__main__":`'
        ) from None
    except Exception as exc:  # the user's module failed while importing
        raise BadInput(
            f"{what} {spec!r}: importing it raised {type(exc).__name__}: {exc}"
        ) from None


def _call(fn: Callable[..., Any], what: str, spec: str, *args: Any) -> Any:
    try:
        return fn(*args)
    except BadInput:
        raise
    except SystemExit as exc:  # would end gradalign with the user's exit status, unjudged
        raise BadInput(
            f"{what} {spec!r} exited (sys.exit({exc.code!r})) instead of returning"
        ) from None
    except Exception as exc:
        text = cut(" ".join(str(exc).split()), 160)
        raise BadInput(f"{what} {spec!r} raised {type(exc).__name__}: {text}") from None


def build_model(spec: str) -> torch.nn.Module:
    model = _call(load(spec, "model"), "model", spec)
    if not isinstance(model, torch.nn.Module):
        raise BadInput(f"model {spec!r} must return a torch.nn.Module, got {type(model).__name__}")
    if not any(True for _ in model.parameters()):
        raise BadInput(f"model {spec!r} returned a module without parameters")
    return model


def build_data(spec: str, samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`samples` rows of (inputs, targets) from the user's factory, as tensors."""
    result = _call(load(spec, "data"), "data", spec, samples, seed)
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise BadInput(f"data {spec!r} must return (inputs, targets), got {type(result).__name__}")
    tensors = []
    for name, value in zip(("inputs", "targets"), result, strict=True):
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biuf":
                raise BadInput(f"data {spec!r}: {name} must hold numbers, got {value.dtype}")
            value = torch.from_numpy(np.ascontiguousarray(value))
        if not isinstance(value, torch.Tensor):
            raise BadInput(f"data {spec!r}: {name} must be a tensor or numpy array")
        if value.dim() == 0 or value.shape[0] < samples:
            raise BadInput(
                f"data {spec!r}: {name} has {value.shape[0] if value.dim() else 0} rows; "
                f"the run needs {samples} (batch_size x updates)"
            )
        tensors.append(value)
    inputs, targets = tensors
    if inputs.shape[0] != targets.shape[0]:  # rows pair by index: one more target shifts none
        raise BadInput(
            f"data {spec!r}: inputs has {inputs.shape[0]} rows and targets {targets.shape[0]}; "
            "they pair row by row, so give as many of each"
        )
    return inputs[:samples], targets[:samples]


def whole_count(value: Any) -> int | None:
    """An item count as an int: an integer, a whole float or a one-element tensor of one; None
    for anything else (int('x') raised ValueError, an internal error; int(2.5) was 2)."""
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else None
    elif isinstance(value, np.ndarray):
        value = value.item() if value.size == 1 else None
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return None
    return int(value) if math.isfinite(value) and value == int(value) else None


def loss_function(spec: str) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, int]]:
    """The user's loss, checked on every call: (a scalar summed loss, a positive item count)."""
    fn = load(spec, "loss")

    def checked(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
        result = _call(fn, "loss", spec, outputs, targets)
        ok = isinstance(result, tuple | list) and len(result) == 2
        if not ok or not isinstance(result[0], torch.Tensor) or result[0].numel() != 1:
            raise BadInput(f"loss {spec!r} must return (summed loss tensor, item count)")
        if torch.is_grad_enabled() and not result[0].requires_grad:
            raise BadInput(
                f"loss {spec!r} returned a loss that does not depend on the model's outputs by "
                "autograd (computed from detached outputs or under no_grad?)"
            )
        items = whole_count(result[1])
        if items is None or items < 1:
            raise BadInput(f"loss {spec!r} returned an item count of {shown(result[1])}")
        return result[0].reshape(()), items

    return checked
