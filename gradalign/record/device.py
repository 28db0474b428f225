"""Where and how exactly a run computes: the device, deterministic kernels, and the environment
facts (versions, threads, TF32, cuDNN) that decide whether two runs can agree bit for bit."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .. import __version__
from ..errors import BadInput
from .tf32 import fp32_precisions, tf32_uses


def resolve_device(name: str) -> torch.device:
    """cpu, cuda (must be present) or auto (cuda when present)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BadInput("device cuda was asked for, but torch sees no CUDA device")
    return torch.device(name)


def make_deterministic() -> None:
    """Same command, same bits: deterministic kernels, no autotuning, no TF32 shortcuts."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def autocast_dtype(device_type: str) -> str | None:
    """The dtype a forward computes in under autocast on that device type (None: no autocast)."""
    try:
        on = torch.is_autocast_enabled(device_type)
        dtype = torch.get_autocast_dtype(device_type) if on else None
    except (TypeError, AttributeError):  # torch before 2.4: no per-device query
        return None
    return str(dtype).removeprefix("torch.") if on and dtype is not None else None


def narrower_parameters(module: torch.nn.Module, recorded: str) -> str | None:
    """The dtype of a module's own parameters as its forward sees them, where narrower than the
    dtype recorded (None: as recorded)."""
    bits = torch.finfo(getattr(torch, recorded)).bits if recorded.startswith("float") else 0
    for param in module.parameters(recurse=False):
        if param.is_floating_point() and torch.finfo(param.dtype).bits < bits:
            return str(param.dtype).removeprefix("torch.")
    return None


class _Seen:
    """What one layer's hook saw. Attributes, not a dict: torch.compile replays a traced
    hook's attribute writes without guarding on them, where it guards a dict's contents."""

    dtype: str | None = None
    traced: bool = False


def watch_autocast(
    model: torch.nn.Module, env: dict[str, Any], device_type: str
) -> Callable[..., None]:
    """Set `env["compute_dtype"]` when a forward runs under autocast, or with parameters narrower
    than the recorded ones (FSDP's mixed precision casts them for the forward). Every layer
    holding parameters watches, not the model alone: frameworks enter autocast inside the model's
    forward (accelerate patches it) or call its layers from elsewhere (Lightning's
    training_step). Returns `settle(final=False)`: the Recorder calls it after the first
    micro-step, and with `final` when it closes.

    A hook that torch.compile traced into a graph stays until the run closes: a graph is
    guarded by its modules' hooks, so removing one recompiles it (a second compile of the
    model after the first micro-step). The hooks only write what they saw, never read it (a
    read is a guard too). Hooks that ran uncompiled go after the first micro-step."""
    recorded = env["dtype"]
    layers = [
        m
        for m in model.modules()
        if m is model or next(m.parameters(recurse=False), None) is not None
    ]
    seen = [_Seen() for _ in layers]

    def watcher(into: _Seen) -> Callable[[torch.nn.Module, Any], None]:
        def hook(module: torch.nn.Module, args: Any) -> None:
            if _compiling():
                into.traced = True
            dtype = autocast_dtype(device_type) or narrower_parameters(module, recorded)
            if dtype:
                into.dtype = dtype

        return hook

    hooks = [
        m.register_forward_pre_hook(watcher(into)) for m, into in zip(layers, seen, strict=True)
    ]

    settled = False  # after the first micro-step only `final` does anything

    def settle(final: bool = False) -> None:
        nonlocal settled
        if settled and not final:
            return
        if not settled:
            settled = True
            found = next((into.dtype for into in seen if into.dtype), None)
            if found and "compute_dtype" not in env:
                env["compute_dtype"] = found
        for i, into in enumerate(seen):
            if hooks[i] is not None and (final or not into.traced):
                hooks[i].remove()
                hooks[i] = None

    return settle


def _compiling() -> bool:
    """Whether torch.compile is tracing the calling code (torch 2.3 on; before: torch._dynamo)."""
    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None) or torch._dynamo.is_compiling
    return bool(check())


def environment(
    device: torch.device, dtype: torch.dtype, model: torch.nn.Module | None = None
) -> dict[str, Any]:
    """Versions, device and the numerical settings that decide whether runs agree bit for bit
    (with `model`: where its float32 math may round to TF32, `tf32_uses`)."""
    precisions = fp32_precisions()
    env: dict[str, Any] = {
        "gradalign": __version__,
        "python": platform.python_version(),
        "platform": sys.platform,
        "machine": platform.machine(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "matmul_allow_tf32": precisions["matmul"] != "ieee",
        "cudnn_allow_tf32": precisions["conv"] != "ieee",
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["gpu"] = torch.cuda.get_device_name(device)
    uses = tf32_uses(model, device, dtype)
    if uses:
        env["tf32"] = uses
    return env
