"""Warnings before training: layers that make B/K micro-batches compute something else than B."""

from __future__ import annotations

from typing import Any


def warnings_for(facts: dict[str, Any]) -> list[str]:
    """One line per layer kind that couples samples or draws random numbers."""
    found = []
    if facts.get("batchnorm"):
        found.append(
            f"the model has BatchNorm ({', '.join(facts['batchnorm'])}): micro-batches of B/K "
            "are normalized with their own statistics, so the merged run cannot match B "
            "(expect diagnosis 'batchnorm'; GroupNorm or LayerNorm avoid it)"
        )
    if facts.get("dropout"):
        found.append(
            f"the model has dropout ({', '.join(facts['dropout'])}): the runs agree only if "
            "both draw the same masks (expect 'dropout-rng' otherwise)"
        )
    return found


def determinism_line(environment: dict[str, Any]) -> str:
    """The numerical settings a run used, in one line."""
    keys = (
        "device",
        "dtype",
        "threads",
        "deterministic_algorithms",
        "cudnn_benchmark",
        "matmul_allow_tf32",
    )
    return ", ".join(f"{key}={environment.get(key)}" for key in keys)
