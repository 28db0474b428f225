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


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2019) as its common implementations write it (eps 1e-6, decoupled
    weight decay inside the trust ratio): Adam's bias-corrected update plus wd·w, scaled per
    tensor by ||w|| / ||update|| (1 where either is 0). torch has none built in."""

    def __init__(self, params, lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "wd": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            (b1, b2), lr = group["betas"], group["lr"]
            for p in (p for p in group["params"] if p.grad is not None):
                state = self.state[p]
                if not state:
                    state.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                state["step"] += 1
                state["m"].lerp_(p.grad, 1 - b1)
                state["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m_hat = state["m"] / (1 - b1 ** state["step"])
                v_hat = state["v"] / (1 - b2 ** state["step"])
                update = m_hat / (v_hat.sqrt() + group["eps"]) + group["wd"] * p
                w_norm, u_norm = float(p.norm()), float(update.norm())
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
                p.add_(update, alpha=-lr * ratio)


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
    "lamb": Lamb,
    # eps small enough that an element whose gradient is rounding noise steps as far as any
    # (as transformers' Adafactor's eps1 does): the trust ratio then moves by that noise
    "lamb-eps12": lambda p: Lamb(p, eps=1e-12),
}
