"""The devices a device-aware test runs on: the CPU always, CUDA where the suite sees it (only
under GRADALIGN_TEST_CUDA=1, which scripts/gpu_check.sh sets; tests/conftest.py hides it
otherwise)."""

from __future__ import annotations

import os

import pytest
import torch


def on_cuda(*values: object) -> object:
    """A parameter set that needs CUDA: skipped where the suite does not see it, unless
    GRADALIGN_TEST_CUDA=1 asked for it (then it runs, and fails without CUDA)."""
    absent = not torch.cuda.is_available() and os.environ.get("GRADALIGN_TEST_CUDA") != "1"
    why = "CUDA not visible (GRADALIGN_TEST_CUDA=1 on a GPU machine)"
    return pytest.param(*values, marks=pytest.mark.skipif(absent, reason=why))


DEVICES = ["cpu", on_cuda("cuda")]
