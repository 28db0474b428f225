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


def watch_autocast(
    model: torch.nn.Module, env: dict[str, Any], device_type: str
) -> Callable[[], None]:
    """Set `env["compute_dtype"]` when a forward runs under autocast, or with parameters narrower
    than the recorded ones (FSDP's mixed precision casts them for the forward); returns the
    function that stops watching (the Recorder stops after the first micro-step). Every layer
    holding parameters watches, not the model alone: frameworks enter autocast inside the model's
    forward (accelerate patches it) or call its layers from elsewhere (Lightning's
    training_step)."""

    def seen(module: torch.nn.Module, args: Any) -> None:
        if "compute_dtype" in env:
            return
        dtype = autocast_dtype(device_type) or narrower_parameters(module, env["dtype"])
        if dtype:
            env["compute_dtype"] = dtype

    hooks = [
        m.register_forward_pre_hook(seen)
        for m in model.modules()
        if m is model or next(m.parameters(recurse=False), None) is not None
    ]

    def stop() -> None:
        while hooks:
            hooks.pop().remove()

    return stop


def environment(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """Versions, device and the numerical settings that decide whether runs agree bit for bit."""
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
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["gpu"] = torch.cuda.get_device_name(device)
    return env
