"""The model zoo's optimizers (bench/model_zoo.py), by name: the default grid's and the ones
outside it, among them Muon for the matrices with AdamW for the rest (`MuonAdamW`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

Opt = Callable[..., torch.optim.Optimizer]
OPTIMIZERS: dict[str, Opt] = {
    "adam-1e-2": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam-1e-3": lambda p: torch.optim.Adam(p, lr=1e-3),
    "adamw-wd": lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.1),
    "adam-eps6": lambda p: torch.optim.Adam(p, lr=1e-2, eps=1e-6),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
    "sgd-mom": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "nadam": lambda p: torch.optim.NAdam(p, lr=3e-3),
    "radam": lambda p: torch.optim.RAdam(p, lr=3e-3),
    "adamax": lambda p: torch.optim.Adamax(p, lr=1e-2),
}


class MuonAdamW:
    """torch's Muon for the 2-D weights and AdamW for the rest, as Muon is used (it takes
    matrices only): two optimizers the loop steps together. The Recorder watches Muon (found
    as `.optimizer`); the schedule, when asked for, moves Muon's learning rate."""

    def __init__(self, params) -> None:
        params = list(params)
        self.optimizer = torch.optim.Muon([p for p in params if p.dim() == 2], lr=2e-2)
        self.rest = torch.optim.AdamW([p for p in params if p.dim() != 2], lr=3e-3)

    def step(self) -> None:
        self.optimizer.step()
        self.rest.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()
        self.rest.zero_grad()


def hf_adafactor(params) -> torch.optim.Optimizer:
    """transformers' Adafactor as the Trainer's `optim="adafactor"` builds it (a fixed lr, no
    parameter scaling): it divides each tensor's update by its RMS over the tensor, and its
    eps1 (1e-30) normalizes a gradient that is rounding noise (docs/NOISE.md, "Without a
    reference"). Needs the transformers extra."""
    from transformers.optimization import Adafactor

    return Adafactor(params, lr=1e-2, scale_parameter=False, relative_step=False)


# Optimizers outside the default grid (`--optimizers` picks any of both), so the runs docs/NOISE.md
# names keep their draws.
MORE_OPTIMIZERS: dict[str, Opt] = {
    "adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-2),
    # eps[0] set: left None, torch fills it with the weights' dtype's epsilon, and a float64
    # rerun is another training (refused, README "The noise floor")
    "adafactor-eps": lambda p: torch.optim.Adafactor(
        p, lr=1e-2, eps=(torch.finfo(torch.float32).eps, 1e-3)
    ),
    "rprop": lambda p: torch.optim.Rprop(p, lr=1e-3),
    "adadelta": lambda p: torch.optim.Adadelta(p, lr=1.0),
    "asgd": lambda p: torch.optim.ASGD(p, lr=1e-2),
    "sgd-nesterov-wd": lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2
    ),
    "muon-adamw": MuonAdamW,
    "hf-adafactor": hf_adafactor,
}
