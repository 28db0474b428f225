"""Random draws between micro-steps: whether torch's default generators (the CPU's, and the
current CUDA device's once CUDA is in use) advanced since the previous micro() call.

A loop that draws at every micro-step (noise in its forward: a VAE's reparameterization, a
diffusion model's timesteps and noise, a hand-written dropout, random masking) draws other
numbers for K micro-batches than for one batch of B, even with one seed: torch's CPU `randn`
fills a tensor of B x d rows otherwise than K tensors of B/K x d unless each holds a multiple of
16 elements, and alternating draws interleave otherwise. The runs then train on other noise
(`dropout-rng`, not a loss over the micro-batch). A data loader's epoch seed is one draw in many
micro-steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


def _states() -> list[torch.Tensor]:
    states = [torch.default_generator.get_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.append(torch.cuda.default_generators[torch.cuda.current_device()].get_state())
    return states


@dataclass
class Draws:
    """Per micro-step, 1 where a default generator advanced since the previous one (or since
    the Recorder began), else 0."""

    last: list[torch.Tensor] = field(default_factory=_states)
    seen: list[int] = field(default_factory=list)

    def micro(self) -> None:
        now = _states()
        moved = len(now) != len(self.last) or any(
            not torch.equal(a, b) for a, b in zip(now, self.last, strict=False)
        )
        self.seen.append(int(moved))
        self.last = now

    def series(self) -> dict[str, np.ndarray]:
        """`micro/draws`, where any micro-step drew."""
        return {"micro/draws": np.asarray(self.seen, dtype=np.int64)} if any(self.seen) else {}
