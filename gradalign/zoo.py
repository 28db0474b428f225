"""Built-in models and their deterministic built-in data (generated, never downloaded)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .config import TrainConfig

FEATURES = 784
CLASSES = 10


@dataclass
class Batches:
    """A fixed sequence of samples; micro-batch m of size b is rows m*b .. m*b+b-1, in order."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def micro_batch(self, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = slice(index * size, (index + 1) * size)
        return self.inputs[rows], self.targets[rows]


def classification_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-sized synthetic classes: a fixed centre per class plus Gaussian noise (PCG64)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CLASSES, FEATURES)).astype(np.float32)
    targets = rng.integers(0, CLASSES, size=samples)
    noise = rng.standard_normal((samples, FEATURES)).astype(np.float32)
    inputs = 0.3 * centres[targets] + noise
    return inputs.astype(np.float32), targets.astype(np.int64)


def build_model(config: TrainConfig) -> nn.Module:
    """The model named by `config.model`, initialised from `config.seed` on the CPU."""
    torch.manual_seed(config.seed)
    return nn.Sequential(
        nn.Linear(FEATURES, config.hidden), nn.ReLU(), nn.Linear(config.hidden, CLASSES)
    )


def build_data(config: TrainConfig, device: torch.device, dtype: torch.dtype) -> Batches:
    """Exactly the samples the run consumes: `updates` batches of `batch_size` rows."""
    seed = config.seed if config.samples_seed is None else config.samples_seed
    inputs, targets = classification_data(config.batch_size * config.updates, seed)
    return Batches(
        torch.from_numpy(inputs).to(device=device, dtype=dtype),
        torch.from_numpy(targets).to(device),
    )
