"""Several card logs of one data-parallel run as one Run. Numpy-only.

Each card prints its own loss for its share of every micro-batch. The run's loss at a micro-step
is the cards' losses combined by the convention the user names: `mean` when each card's loss is
the mean over its own samples (the usual per-card mean: with equal shares, the global mean is
their mean), `sum` when each card's loss is already divided by the global item count. The
weights are card 0's; the other cards ride along as replicas, whose printed weights the judge
checks against card 0's (data-parallel replicas hold the same weights after every step).
A log whose launcher lines say the run used more devices than card logs were given gets a note
naming the missing ones (`missing_cards`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...errors import BadInput
from ..model import Run
from .cleaned import clean
from .lines import head

CARD_LOSSES = ("mean", "sum")
_DEVICES = re.compile(  # Paddle's launcher: `LAUNCH INFO <time> devices: 0,1` (`gpus: 0,1`)
    r"^(?:devices|gpus|selected_gpus|[xn]pus)\s*[:=]\s*(?P<ids>\d+(?:\s*,\s*\d+)*)$", re.I
)
_NPROC = re.compile(  # torchrun's launch configs: `nproc_per_node   : 2`
    r"^(?:nproc_per_node|world_size|nranks|trainers_num)\s*[:=]\s*(?P<n>\d+)$", re.I
)
_NUMBERED = re.compile(r"(?P<stem>.*?)(?P<card>\d+)")  # `workerlog.0`


def launch_devices(text: str) -> int | None:
    """The devices a launcher's configuration line (cleaned: its prefix dropped) says the run
    used; None for any other line."""
    found = _DEVICES.match(text)
    if found is not None:
        return len(found["ids"].split(","))
    found = _NPROC.match(text)
    return None if found is None else int(found["n"])


def missing_cards(paths: Sequence[Path]) -> str | None:
    """A note where the first log's launcher lines (in its first MiB) say the run used more
    devices than `paths` are logs: the merged losses are then those cards' alone, not the
    run's; it names the logs missing (`workerlog.1`, beside `workerlog.0`)."""
    lines = head(paths[0])
    if lines is None:
        return None
    for text, number in zip(lines.texts, lines.numbers, strict=True):  # noqa: B007
        devices = launch_devices(clean(text))
        if devices is not None:
            break
    else:
        return None
    if devices <= len(paths):
        return None
    given = [_NUMBERED.fullmatch(p.name) for p in paths]
    stem = given[0]["stem"] if given[0] else None
    if stem is not None and all(g is not None and g["stem"] == stem for g in given):
        cards = {int(g["card"]) for g in given if g is not None}
        names = [str(paths[0].with_name(f"{stem}{i}")) for i in range(devices) if i not in cards]
        missing = f"missing: {', '.join(names)}"
    else:
        missing = "the other cards' logs are missing"
    shown = "card 0's loss" if len(paths) == 1 else f"the losses of {len(paths)} cards"
    return (
        f"{paths[0]}:{number}: the launcher's line '{clean(text)}' says the run used "
        f"{devices} devices, and {len(paths)} card log(s) were given: the "
        f"merged loss is {shown} alone, on its share of each batch, not the run's; give every "
        f"card's log, card 0 first ({missing})"
    )


def _combine(series: list[np.ndarray], card_loss: str) -> np.ndarray:
    stacked = np.stack(series)
    return stacked.mean(axis=0) if card_loss == "mean" else stacked.sum(axis=0)


def _known(runs: list[Run]) -> np.ndarray | None:
    """Which combined losses every card printed (None: all of them)."""
    known = [r.loss_known for r in runs if r.loss_known is not None]
    return np.logical_and.reduce(known) if known else None


def combine_cards(runs: list[Run], card_loss: str) -> Run:
    """One Run from card runs (card 0 first), losses combined by `card_loss`."""
    if card_loss not in CARD_LOSSES:
        raise BadInput(f"--card-loss must be one of {', '.join(CARD_LOSSES)}, got {card_loss!r}")
    if len(runs) < 2:
        raise BadInput("combining card logs needs at least two of them")
    first = runs[0]
    layout = [(t.name, t.shape) for t in first.tensors]
    for card, run in enumerate(runs[1:], start=1):
        if run.micro_steps != first.micro_steps:
            raise BadInput(
                f"{run.source}: card {card} logged {run.micro_steps} micro-steps, card 0 "
                f"({first.source}) {first.micro_steps}: the logs are not of one run"
            )
        if [(t.name, t.shape) for t in run.tensors] != layout:
            raise BadInput(f"{run.source}: card {card} printed other arrays than card 0")
    quanta = [
        r.loss_quantum if r.loss_quantum is not None else np.zeros(r.micro_steps) for r in runs
    ]
    printed = np.stack([r.printed_window_loss for r in runs])
    printed_quanta = np.stack([r.printed_window_quantum for r in runs])
    complete = np.isfinite(printed).all(axis=0)
    cards = [r.source for r in runs]
    how = "mean" if card_loss == "mean" else "sum"
    note = (
        f"merged run: {len(runs)} card logs ({', '.join(cards)}); each micro-step's loss is the "
        f"{how} of the cards' losses (--card-loss {card_loss}); the weights compared are card "
        "0's, and every card's printed weights are checked against card 0's"
    )
    return dataclasses.replace(
        first,
        source=f"{first.source} + {len(runs) - 1} more card(s)",
        micro_loss=_combine([r.micro_loss for r in runs], card_loss),
        loss_quantum=_combine(quanta, card_loss),
        loss_known=_known(runs),
        printed_window_loss=np.where(complete, _combine(list(printed), card_loss), np.nan),
        printed_window_quantum=np.where(
            complete, _combine(list(printed_quanta), card_loss), np.nan
        ),
        config={
            **first.config,
            "ignored_lines": sum(int(r.config.get("ignored_lines", 0)) for r in runs),
            "cards": len(runs),
            "card_loss": card_loss,
        },
        notes=[note, *(n for r in runs for n in r.notes)],
        cards=cards,
        card_loss=card_loss,
        replicas=list(runs[1:]),
    )
