"""Data-parallel runs: the ranks must be replicas, bit for bit.

After every update each rank must hold the same parameters and must have stepped with the same
gradient, the same learning rate and the same number of steps as rank 0: an all-reduce hands
every rank the same bits, so any difference is a bug, never noise. Ranks that stepped otherwise
(or not at all) yet held rank 0's weights after every update had them made equal after the step
(rank 0 steps, then broadcasts): what they did with their gradients never reached the training,
and they count as replicas. Buffers (BatchNorm's running
statistics) are not synchronized by the gradient all-reduce; ranks whose buffers differ are kept
apart, as the evidence of per-rank statistics. The loss and sample digests judged elsewhere are
already the ranks' combination (runs/ranks.py); the weights and gradients judged are rank 0's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import BadInput
from ..runs.model import Run
from .results import FAIL, PASS, Check

SHOWN = 4  # tensor names listed in a message


@dataclass
class RankFacts:
    """Where the ranks differ from rank 0: {rank: names} at the start, {update: {rank: names}}
    after each update."""

    world: int
    init: dict[int, list[str]] = field(default_factory=dict)
    synced: list[int] = field(default_factory=list)  # ranks whose other start was broadcast away
    overwritten: list[int] = field(default_factory=list)  # ranks whose other steps were, too
    # where they were: the tensors each stepped with another gradient in, by update and rank
    overwritten_grads: dict[int, dict[int, list[str]]] = field(default_factory=dict)
    weights: dict[int, dict[int, list[str]]] = field(default_factory=dict)
    grads: dict[int, dict[int, list[str]]] = field(default_factory=dict)
    buffers: dict[int, dict[int, list[str]]] = field(default_factory=dict)
    steps: dict[int, dict[int, str]] = field(default_factory=dict)  # lr or step counts

    @property
    def agree(self) -> bool:
        return not (self.init or self.weights or self.grads or self.steps)

    def first_update(self) -> int | None:
        updates = [*self.weights, *self.grads, *self.steps, *([0] if self.init else [])]
        return min(updates) if updates else None


def rank_facts(run: Run) -> RankFacts | None:
    """Compare every rank's fingerprints with rank 0's (None: one process)."""
    if len(run.ranks) < 2:
        return None
    names = [t.name for t in run.tensors]
    params = np.array([t.kind == "param" for t in run.tensors])
    first, facts = run.ranks[0], RankFacts(len(run.ranks))
    for other in run.ranks[1:]:
        r = other.rank
        differ = (other.init_state != first.init_state) & params
        if differ.any() and not _synced_before_first_step(first, other, params):
            facts.init[r] = _names(names, differ)
        elif differ.any():
            facts.synced.append(r)
        for i in range(run.updates):
            for target, mine, theirs, mask in (
                (facts.weights, first.update_state[i], other.update_state[i], params),
                (facts.grads, first.grad_state[i], other.grad_state[i], params),
                (facts.buffers, first.update_state[i], other.update_state[i], ~params),
            ):
                differ = (mine != theirs) & mask
                if differ.any():
                    target.setdefault(i, {})[r] = _names(names, differ)
            text = _step_difference(first, other, i)
            if text:
                facts.steps.setdefault(i, {})[r] = text
    if not (facts.init or facts.weights) and (facts.grads or facts.steps):
        facts.overwritten = sorted(
            {r for t in (facts.grads, facts.steps) for v in t.values() for r in v}
        )
        facts.overwritten_grads, facts.grads, facts.steps = facts.grads, {}, {}
    return facts


def _synced_before_first_step(first, other, params: np.ndarray) -> bool:
    """A rank that recorded other initial weights, yet stepped with rank 0's gradient into rank
    0's weights at update 0: the weights were made equal before the first step (DDP broadcasts
    rank 0's when it wraps the model, after the Recorder began)."""
    if not len(first.update_state) or not len(other.update_state):
        return False
    same_after = np.array_equal(first.update_state[0][params], other.update_state[0][params])
    return same_after and np.array_equal(first.grad_state[0][params], other.grad_state[0][params])


def _names(names: list[str], mask: np.ndarray) -> list[str]:
    return [names[j] for j in np.flatnonzero(mask)]


def _step_difference(first, other, i: int) -> str | None:
    for label, a, b in (
        ("learning rate", first.lr, other.lr),
        ("optimizer steps", first.optimizer_steps, other.optimizer_steps),
        ("optimizer step counter", first.state_step, other.state_step),
    ):
        if a is not None and b is not None and not _same(a[i], b[i]):
            return f"{label} {b[i]:.8g} (rank 0: {a[i]:.8g})"
    return None


def _same(a: float, b: float) -> bool:
    return bool(a == b or (np.isnan(a) and np.isnan(b)))


def listed(names: list[str], shown: int = SHOWN) -> str:
    """The first `shown` names, and how many more there are."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def rank_problems(run: Run, facts: RankFacts | None) -> dict[int, list[str]]:
    """Per update, what differs across the ranks (the comparison's per-update problems)."""
    found: dict[int, list[str]] = {}
    if facts is None:
        return found
    for r, names in facts.init.items():
        found.setdefault(0, []).append(f"rank {r} started from other weights ({listed(names)})")
    params = sum(t.kind == "param" for t in run.tensors)
    for label, table in (
        ("stepped with another gradient", facts.grads),
        ("holds other weights", facts.weights),
    ):
        for i, ranks in sorted(table.items()):
            for r, names in ranks.items():
                found.setdefault(i, []).append(
                    f"rank {r} {label} than rank 0 in {len(names)} of {params} parameters "
                    f"({listed(names)})"
                )
    for i, ranks in sorted(facts.steps.items()):
        for r, text in ranks.items():
            found.setdefault(i, []).append(f"rank {r}: {text}")
    return found


def items_per_rank(run: Run, update: int) -> list[float] | None:
    """Each rank's items in window `update` (None: items not recorded)."""
    counted = counts_per_rank(run, update, rows=False)
    return None if counted is None else counted[0]


def counts_per_rank(
    run: Run, update: int, rows: bool = True
) -> tuple[list[float], list[list[int]], str] | None:
    """Each rank's items in window `update` and its micro-batches' counts, with their unit:
    "items", or (`rows`, where no items were recorded) "samples", the rows of `batch=`."""
    if not run.ranks:
        return None
    series, unit = [rank.micro_items for rank in run.ranks], "items"
    if any(s is None for s in series) and rows:
        series, unit = [rank.micro_samples for rank in run.ranks], "samples"
    if any(s is None for s in series):
        return None
    w = run.window(update)
    micro = [[int(n) for n in s[w.start : w.stop]] for s in series]
    return [float(s[w.start : w.stop].sum()) for s in series], micro, unit


def rank_check(run: Run, facts: RankFacts) -> Check:
    """Replica agreement, with the per-rank facts that matter (W, backend, items per rank)."""
    name = f"ranks hold the same replica (W={facts.world})"
    how = run.distributed or {}
    where = f"{how.get('backend', '?')}, launched by {how.get('launcher', '?')}"
    if not facts.agree:
        first = facts.first_update()
        problems = rank_problems(run, facts).get(first or 0, ["?"])
        return Check(name, FAIL, f"from update {first}: {problems[0]} ({where})")
    items = items_per_rank(run, 0)
    shown = f"; items per rank in window 0: {', '.join(f'{n:g}' for n in items)}" if items else ""
    buffers = ""
    if facts.buffers:
        i = min(facts.buffers)
        r, names = next(iter(facts.buffers[i].items()))
        buffers = f"; buffers differ (rank {r}, update {i}: {listed(names)}): per-rank statistics"
    synced = (
        f"; rank(s) {', '.join(map(str, facts.synced))} recorded other initial weights, made "
        "equal to rank 0's before the first step (a broadcast after the Recorder began)"
        if facts.synced
        else ""
    )
    overwritten = (
        f"; rank(s) {', '.join(map(str, facts.overwritten))} stepped with other gradients or "
        "step counts (or not at all), their weights made rank 0's after every step (a broadcast "
        "from rank 0)"
        if facts.overwritten
        else ""
    )
    equal = (
        "parameters"
        if facts.overwritten
        else "parameters, stepped gradients, learning rates and step counts"
    )
    return Check(
        name,
        PASS,
        f"{facts.world} ranks ({where}): {equal} bitwise equal after all {run.updates} "
        f"updates{shown}{buffers}{synced}{overwritten}",
    )


def ranks_summary(run: Run, facts: RankFacts | None) -> dict | None:
    """The JSON report's `merged_ranks`."""
    if facts is None:
        return None
    how = run.distributed or {}
    return {
        "world_size": facts.world,
        "backend": how.get("backend"),
        "launcher": how.get("launcher"),
        "replicas_agree": facts.agree,
        "first_disagreement": facts.first_update(),
        "items_per_rank": [items_per_rank(run, i) for i in range(run.updates)]
        if run.ranks[0].micro_items is not None
        else None,
    }


def check_baseline_ranks(base: Run) -> None:
    """A data-parallel baseline whose ranks are not replicas is not one training at batch B:
    refused, naming where they parted (the merged run's ranks are a check of the comparison,
    the baseline's a condition of it)."""
    facts = rank_facts(base)
    if facts is None or facts.agree:
        return
    first = facts.first_update()
    problem = rank_problems(base, facts).get(first or 0, ["its ranks differ"])[0]
    raise BadInput(
        f"{base.source}: the baseline's ranks are not replicas from update {first} ({problem}): "
        "it is not one training at batch B; fix its data-parallel step (DDP's all-reduce, "
        "no_sync only before the window's last micro-step) and record it again"
    )
