"""The ranks of a data-parallel run: each rank's own series, and their combination.

A run recorded on W ranks (torch.distributed) keeps, beside its usual files, one series file per
rank (`ranks/rankR/series.safetensors`): that rank's micro-batch losses, item counts and sample
digests, the bit fingerprints of its weights and of the gradient it handed to `step()`, and
its own bookkeeping counts (`COUNTS`: zero_grad() and clip calls inside a window, and the like).
The run's own `micro/loss`, `micro/items` and `micro/data` are their combination over the ranks
(`combine`): the items-weighted mean loss, the summed items and the summed digests of each
micro-step, so that a reader that knows nothing of ranks still judges the whole training. The
manifest's `distributed` object says how many ranks, which backend and which launcher. The
run's own counts are rank 0's; the reader takes each as the largest over the ranks
(`rank_counts`), so that a bug on one rank alone is judged, and `counted_on` names that rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BadInput, shown

RANK_SERIES = "ranks/rank{rank}/series.safetensors"
LAUNCHERS = ("gradalign", "torchrun", "unknown")
MAX_WORLD = 65536
# What every rank records; per micro-step (M rows), per update (N rows), fingerprints (P columns).
PER_MICRO = {
    "micro/loss": np.float64,
    "micro/items": np.float64,
    "micro/data": np.int64,
    "micro/pairs": np.int64,
    "micro/samples": np.int64,
}
PER_UPDATE = {
    "update/state": np.int64,
    "update/grad_state": np.int64,
    "update/lr": np.float64,
    "update/optimizer_steps": np.int64,
    "update/state_step": np.int64,
    "update/grad_norm_pre_clip": np.float64,  # its own norm before clipping: a clip before the
    # all-reduce sees each rank's share (ranks/rankR/ only where the run clipped by norm)
}
# What each rank counts of its own loop, absent where it counted nothing (as in the run's series,
# which holds rank 0's): the run's count is the largest over its ranks (`rank_counts`), so that a
# bug on one rank alone is judged as one on all. (shape per row, dtype)
COUNTS = {
    "micro/steps": ((), np.int64),
    "micro/draws": ((), np.int64),
    "update/scaler_calls": ((2,), np.int64),
    "update/clip_calls": ((), np.int64),
    "update/clips_before_unscale": ((), np.int64),
    "update/zero_grads_inside": ((), np.int64),
    "update/zero_grads_before_step": ((), np.int64),
    "update/bypassed_forwards": ((), np.int64),
    "update/clip_value": ((), np.float64),  # not a count: the first rank's that clipped by value
}
REQUIRED = ("micro/loss", "init/state", "update/state", "update/grad_state")
LOSS_RTOL = 1e-12  # the run's combined loss against the one recomputed from its ranks


def rank_series_file(rank: int) -> str:
    return RANK_SERIES.format(rank=rank)


@dataclass
class RankSeries:
    """What one rank recorded (numpy arrays; absent series are None)."""

    rank: int
    micro_loss: np.ndarray  # float64 [M], its own micro-batches' mean losses
    init_state: np.ndarray  # int64 [P]
    update_state: np.ndarray  # int64 [N, P], its weights after each update
    grad_state: np.ndarray  # int64 [N, P], the gradient it handed to step() (0 for buffers)
    micro_items: np.ndarray | None = None  # float64 [M]
    micro_data: np.ndarray | None = None  # int64 [M]
    micro_samples: np.ndarray | None = None  # int64 [M], rows of its micro-batches (`batch=`)
    lr: np.ndarray | None = None  # float64 [N]
    optimizer_steps: np.ndarray | None = None  # int64 [N]
    state_step: np.ndarray | None = None  # int64 [N]
    grad_norm_pre_clip: np.ndarray | None = None  # float64 [N], its own norm before clipping
    counts: dict[str, np.ndarray] = field(default_factory=dict)  # its own COUNTS, where recorded


def combine(ranks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per micro-step over the ranks: the mean loss weighted by items (else by samples, else
    plain), the summed items and samples, and the summed sample digests (int64, wrapping)."""
    losses = np.stack([np.asarray(r["micro/loss"], dtype=np.float64) for r in ranks])
    out: dict[str, np.ndarray] = {"micro/loss": losses.mean(axis=0)}
    for key in ("micro/samples", "micro/items"):  # items, when recorded, weigh the loss
        if all(r.get(key) is not None for r in ranks):
            counts = np.stack([np.asarray(r[key], dtype=np.float64) for r in ranks])
            total = counts.sum(axis=0)
            weighted = (losses * counts).sum(axis=0)
            safe = np.where(total > 0, total, 1.0)
            out["micro/loss"] = np.where(total > 0, weighted / safe, losses.mean(axis=0))
            out[key] = total.astype(np.int64) if key == "micro/samples" else total
    for key in ("micro/data", "micro/pairs"):  # digests add up over the ranks' rows
        if all(r.get(key) is not None for r in ranks):
            data = np.stack([np.asarray(r[key], dtype=np.int64) for r in ranks])
            out[key] = data.sum(axis=0, dtype=np.int64)
    return out


def check_distributed(value: Any, where: str) -> dict[str, Any]:
    """The manifest's `distributed` object: {world_size, backend, launcher, ranks: [{rank}]}."""

    def bad(what: str) -> BadInput:
        return BadInput(f"{where}: manifest field 'distributed' {what}")

    if not isinstance(value, dict):
        raise bad("must be an object {world_size, backend, launcher, ranks}")
    world = value.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or not 1 <= world <= MAX_WORLD:
        raise bad(f"world_size must be an integer in [1, {MAX_WORLD}], got {shown(world)}")
    for key in ("backend", "launcher"):
        if not isinstance(value.get(key), str):
            raise bad(f"{key} must be a string, got {shown(value.get(key))}")
    ranks = value.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != world:
        raise bad(f"ranks must list {world} entries, one per rank")
    for index, entry in enumerate(ranks):
        if not isinstance(entry, dict) or entry.get("rank") != index:
            raise bad(f"ranks[{index}] must be an object with rank {index}")
    return value


def read_ranks(
    manifest: dict,
    where: str,
    load: Callable[[str], dict[str, np.ndarray]],
    run_series: dict[str, np.ndarray],
    micro: int,
    updates: int,
    columns: int,
) -> tuple[list[RankSeries], dict[str, Any] | None]:
    """Each rank's series, checked (shapes, dtypes, presence) and checked against the run's own
    combined series; ([], None) for a run recorded by one process."""
    if manifest.get("distributed") is None:
        return [], None
    facts = check_distributed(manifest["distributed"], where)
    raw = []
    for rank in range(facts["world_size"]):
        relpath = rank_series_file(rank)
        if relpath not in manifest["files"]:
            raise BadInput(f"{where}: rank {rank}'s series {relpath} is not listed in the manifest")
        raw.append(_checked(load(relpath), f"{where}: {relpath}", micro, updates, columns))
    for key in ("micro/items", "micro/data", "micro/pairs", "micro/samples"):
        present = [r.get(key) is not None for r in raw]
        if len(set(present)) > 1 or any(present) != (run_series.get(key) is not None):
            raise BadInput(f"{where}: {key} is recorded by some ranks (or the run) and not others")
    _agrees(combine(raw), run_series, where)
    return [_rank(index, r) for index, r in enumerate(raw)], facts


def _checked(
    series: dict[str, np.ndarray], where: str, micro: int, updates: int, columns: int
) -> dict[str, np.ndarray]:
    for key in REQUIRED:
        if key not in series:
            raise BadInput(f"{where}: holds no {key}")
    shapes = {"init/state": (columns,)}
    shapes.update({key: (micro,) for key in PER_MICRO})
    shapes.update({key: (updates,) for key in PER_UPDATE})
    shapes.update({"update/state": (updates, columns), "update/grad_state": (updates, columns)})
    kinds = {**PER_MICRO, **PER_UPDATE, "init/state": np.int64}
    for key, (row, kind) in COUNTS.items():
        shapes[key] = (micro if key.startswith("micro/") else updates, *row)
        kinds[key] = kind
    for key, shape in shapes.items():
        value = series.get(key)
        if value is None:
            continue
        if value.shape != shape:
            raise BadInput(f"{where}: {key} has shape {value.shape}, expected {shape}")
        wanted = np.dtype(kinds[key])
        if value.dtype.kind != wanted.kind or (wanted.kind == "i" and value.dtype != wanted):
            raise BadInput(f"{where}: {key} is {value.dtype}, expected {wanted}")
    return series


def _agrees(combined: dict[str, np.ndarray], run: dict[str, np.ndarray], where: str) -> None:
    """The run's micro-step series must be the combination of its ranks' (else the run is not
    what its ranks recorded)."""
    for key, value in combined.items():
        mine = run.get(key)
        if mine is None or mine.shape != value.shape:
            raise BadInput(f"{where}: series {key} is not the combination of its ranks'")
        if key in ("micro/data", "micro/pairs", "micro/samples"):
            same = np.array_equal(mine.astype(np.int64), value)
        else:
            both = np.isfinite(value) & np.isfinite(mine)
            same = bool(np.array_equal(np.isfinite(value), np.isfinite(mine))) and bool(
                np.all(np.abs(mine[both] - value[both]) <= LOSS_RTOL * np.abs(value[both]))
            )
        if not same:
            raise BadInput(f"{where}: series {key} is not the combination of its ranks' series")


def _rank(index: int, s: dict[str, np.ndarray]) -> RankSeries:
    return RankSeries(
        rank=index,
        micro_loss=s["micro/loss"].astype(np.float64),
        init_state=s["init/state"],
        update_state=s["update/state"],
        grad_state=s["update/grad_state"],
        micro_items=s.get("micro/items"),
        micro_data=s.get("micro/data"),
        micro_samples=s.get("micro/samples"),
        lr=s.get("update/lr"),
        optimizer_steps=s.get("update/optimizer_steps"),
        state_step=s.get("update/state_step"),
        grad_norm_pre_clip=s.get("update/grad_norm_pre_clip"),
        counts={key: s[key] for key in COUNTS if key in s},
    )


def rank_counts(ranks: list[RankSeries], run: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The run's COUNTS over its ranks: the largest count of any rank at each row (the clip
    value: rank 0's, else the first other rank's that clipped by value there). The run's own
    (rank 0's) stand where no rank's file holds a count (a run recorded before ranks kept them)."""
    out: dict[str, np.ndarray] = {}
    for key in COUNTS:
        held = [v for v in (run.get(key), *(r.counts.get(key) for r in ranks)) if v is not None]
        if len(held) < 2:  # the run's own, or a count only one rank (or the run) kept: as it is
            continue
        if key == "update/clip_value":
            value = np.array(held[0], dtype=np.float64)
            for other in held[1:]:
                value = np.where(np.isnan(value), other, value)
        else:
            value = np.maximum.reduce([np.asarray(v, dtype=np.int64) for v in held])
        out[key] = value
    return out


def counted_on(ranks: list[RankSeries], key: str, row: int, above: float = 0) -> list[int] | None:
    """The ranks whose own `key` exceeds `above` at `row` (the clip value: is set there); None
    where that names no rank: one process, every rank counted alike, or ranks that kept no
    counts (a run recorded before they did)."""
    if len(ranks) < 2 or not any(key in r.counts for r in ranks):
        return None
    found = []
    for r in ranks:
        value = r.counts.get(key)
        if value is None:
            continue
        here = np.asarray(value[row], dtype=np.float64)
        seen = ~np.isnan(here) if key == "update/clip_value" else here > above
        if bool(np.any(seen)):
            found.append(r.rank)
    return found if 0 < len(found) < len(ranks) else None
