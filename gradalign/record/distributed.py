"""The Recorder under torch.distributed: which rank this process is, and the few messages the
ranks exchange (at the start, and when the run is closed).

Every rank records its own facts; the rank labelled 0 writes the run. Messages go over gloo (a
gloo group beside an nccl one, so no CUDA device has to be chosen for them); there are three:
the ranks' labels when the Recorder starts, each rank's series when it closes, and whether the
writer succeeded (so that no rank waits forever on one that failed).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..runs.ranks import COUNTS
from .facts import RecorderError

_SIDE_GROUPS: list[tuple[Any, Any]] = []  # (default group, its gloo twin), made once per group


_LAUNCHED_BY: ContextVar[str | None] = ContextVar("gradalign_launched_by", default=None)

# Launchers known by the variables they set in every rank's environment, in this order: torchrun
# run inside a Slurm or MPI job is named torchrun.
_LAUNCHER_VARIABLES = (
    ("GRADALIGN_LAUNCHER", "gradalign"),
    ("TORCHELASTIC_RUN_ID", "torchrun"),
)
_JOB_VARIABLES = (
    ("SLURM_PROCID", "slurm"),
    ("OMPI_COMM_WORLD_RANK", "mpirun"),
    ("PMIX_RANK", "mpirun"),
    ("PMI_RANK", "mpirun"),
)


@contextmanager
def launched_by(name: str | None) -> Iterator[None]:
    """Name the launcher for Recorders opened inside (a framework integration that knows it
    started the ranks itself, as Lightning's `strategy="ddp"` does); None names none."""
    token = _LAUNCHED_BY.set(name)
    try:
        yield
    finally:
        _LAUNCHED_BY.reset(token)


def launcher() -> str:
    """Who started the ranks: gradalign's own launcher or torchrun (by their environment), a
    framework that said so (`launched_by`), Slurm's srun or an MPI launcher (by theirs), a
    parent Python process (`torch.multiprocessing.spawn`), else 'unknown'."""
    for variable, name in _LAUNCHER_VARIABLES:
        if os.environ.get(variable):
            return name
    if said := _LAUNCHED_BY.get():
        return said
    for variable, name in _JOB_VARIABLES:
        if os.environ.get(variable):
            return name
    if multiprocessing.parent_process() is not None:  # torch.multiprocessing.spawn's children
        return "multiprocessing"
    return "unknown"


_SHARDS = {  # DTensors (fully_shard, tensor parallel) are read whole (record/sharded.py)
    "FlatParameter": "a flat shard (FullyShardedDataParallel; use fully_shard)",
    "ZeRO": "a DeepSpeed ZeRO-3 partition",
}


def refuse_sharded(model: torch.nn.Module) -> None:
    """Refuse a model whose parameters are sharded across ranks in a form the Recorder cannot
    gather (FullyShardedDataParallel's flat shards, DeepSpeed ZeRO-3 partitions): it copies and
    fingerprints whole tensors on every rank, and a shard is not one."""
    for name, param in model.named_parameters():
        how = _SHARDS.get("ZeRO" if hasattr(param, "ds_id") else type(param).__name__)
        if how is not None:
            raise RecorderError(
                f"parameter {name} is {how}: sharded parameters cannot be recorded yet; record "
                "the same loop with DistributedDataParallel (or on one process) to check its "
                "accumulation"
            )


@dataclass
class Ranks:
    """This process's place among the ranks of one recorded run."""

    rank: int  # this process's rank in the run (its label)
    world: int
    backend: str
    launcher: str
    group: Any  # the group the recorder's own messages travel in

    @property
    def writes(self) -> bool:
        """Whether this rank writes the run (the one labelled 0)."""
        return self.rank == 0

    def exchange(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in the order of the group's ranks."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def agree(self, error: str | None) -> str | None:
        """Tell every rank whether this one failed; returns the first failure (any rank's)."""
        failures = [e for e in self.exchange(error) if e]
        return failures[0] if failures else None

    def facts(self, infos: list[dict[str, Any]]) -> dict[str, Any]:
        """The manifest's `distributed` object."""
        facts = {
            "world_size": self.world,
            "backend": self.backend,
            "launcher": self.launcher,
            "ranks": sorted(infos, key=lambda info: info["rank"]),
        }
        if self.backend == "nccl":
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        return facts


def join(distributed: bool | None, group: Any = None, rank: int | None = None) -> Ranks | None:
    """This process's rank, when a process group is initialized (None: record as one process).

    `distributed`: None detects, False records this process alone, True requires a group.
    `group`: the process group the run spans (default: the whole world). `rank`: this process's
    rank in the run, if not its rank in the group (each rank must give a distinct one)."""
    if distributed is False:
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if distributed or rank not in (None, 0):
            raise RecorderError(
                "recording as a rank needs an initialized process group: call "
                "torch.distributed.init_process_group first (or pass distributed=False)"
            )
        return None
    world = dist.get_world_size(group)
    if world == 1 and not distributed and rank is None:
        return None
    backend = str(dist.get_backend(group))
    ranks = Ranks(
        dist.get_rank(group) if rank is None else rank,
        world,
        backend,
        launcher(),
        group if backend == "gloo" else _gloo_twin(group),
    )
    _await_every_rank(ranks)
    labels = ranks.exchange(ranks.rank)
    if sorted(labels) != list(range(world)):
        raise RecorderError(f"the ranks gave the labels {labels}; each of 0..{world - 1} once")
    return ranks


JOIN_TIMEOUT_S = 600.0  # how long a rank waits for the others' Recorders (GRADALIGN_JOIN_TIMEOUT)


def _await_every_rank(ranks: Ranks) -> None:
    """Wait for every rank's Recorder, at most JOIN_TIMEOUT_S: a Recorder made on rank 0 alone
    (`if rank == 0:`) waited silently until gloo's own timeout, 30 minutes, while the other
    ranks trained on. Then name the ranks that did not come."""
    import datetime

    import torch.distributed as dist

    if dist.get_backend(ranks.group) != "gloo":
        return  # the messages travel over gloo; without it, the group's own timeout
    value = os.environ.get("GRADALIGN_JOIN_TIMEOUT", "")
    seconds = float(value) if value.replace(".", "", 1).isdigit() else JOIN_TIMEOUT_S
    started = time.monotonic()
    try:
        dist.monitored_barrier(
            group=ranks.group, timeout=datetime.timedelta(seconds=seconds), wait_all_ranks=True
        )
    except RuntimeError as exc:
        said = " ".join(str(exc).split())[:200]
        waited = time.monotonic() - started
        if waited < 0.9 * seconds:  # not a timeout: a rank went away (its own error says why)
            raise RecorderError(
                f"a rank ended before every rank created its Recorder ({waited:.3g} s in, of "
                f"the {seconds:g} s each waits; {said}): see that rank's own error, and create "
                "the same Recorder on every rank"
            ) from None
        raise RecorderError(
            f"not every rank created its Recorder within {seconds:g} s ({said}): create the "
            "same Recorder on every rank, not on rank 0 alone (each rank records its own part, "
            "rank 0 writes the run)"
        ) from None


def _gloo_twin(group: Any) -> Any:
    """A gloo group over the same ranks, for the recorder's messages (made once per group)."""
    import torch.distributed as dist

    if group is not None or not dist.is_gloo_available():
        return group
    world = dist.group.WORLD
    for known, twin in _SIDE_GROUPS:
        if known is world:
            return twin
    twin = dist.new_group(backend="gloo")
    _SIDE_GROUPS.append((world, twin))
    return twin


def rank_info(ranks: Ranks | None, device: torch.device, env: dict[str, Any]) -> dict[str, Any]:
    """What the manifest says about this rank ({} for one process); `env` gets the world size."""
    if ranks is None:
        return {}
    env["world_size"] = ranks.world
    return {
        "rank": ranks.rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": str(device),
    }


def settle(ranks: Ranks, error: BaseException | None, abort: Callable[[], None]) -> None:
    """After a Recorder started (or failed to), every rank learns whether all could: a rank whose
    own start failed re-raises its error (the caller does), the others abort and raise this."""
    failure = ranks.agree(None if error is None else f"{type(error).__name__}: {error}")
    if failure and error is None:
        abort()
        raise RecorderError(f"another rank could not start the run ({failure})")


# What each rank sends the writer when the run closes (its own series, under these names).
RANK_KEYS = (
    "micro/loss",
    "micro/items",
    "micro/data",
    "micro/pairs",
    "micro/samples",
    "init/state",
    "update/state",
    "update/lr",
    "update/optimizer_steps",
    "update/state_step",
    "update/grad_norm_pre_clip",
    *COUNTS,  # its own bookkeeping counts: a bug on one rank alone is judged from them
)


def close_ranks(rec: Any) -> Path | None:
    """Close a Recorder on every rank: each sends its series, the writer writes every rank's
    file, the combined series and the manifest (the run appears whole or not at all), and every
    rank learns whether that worked. Returns the run's path."""
    from ..runs.ranks import combine, rank_series_file

    ranks: Ranks = rec._ranks
    series, manifest = rec._finalize()
    own = {key: series[key] for key in RANK_KEYS if key in series}
    own["update/grad_state"] = series["update/grad_state"]  # the stepped gradients' prints
    parts = ranks.exchange({"series": own, "info": rec._rank_info})
    problem = _mismatch(parts)
    error: BaseException | None = None
    if ranks.writes and problem is None:
        try:
            series.update(combine([part["series"] for part in parts]))
            for part in parts:
                rec._writer.write_tensors(rank_series_file(part["info"]["rank"]), part["series"])
            manifest["distributed"] = ranks.facts([part["info"] for part in parts])
            rec._writer.finish(manifest, series)
        except BaseException as exc:  # finish() has removed what it staged
            error = exc
    elif ranks.writes:
        rec._writer.abort()
    mine = problem or (None if error is None else f"{type(error).__name__}: {error}")
    failure = ranks.agree(mine)
    if error is not None:
        raise error
    if failure is not None:
        raise RecorderError(f"the run was not written: {failure}")
    return rec.out_dir


def _mismatch(parts: list[dict[str, Any]]) -> str | None:
    """Ranks that recorded other numbers of micro-steps or updates than rank 0 (their series
    cannot be combined micro-step by micro-step)."""
    counts = {part["info"]["rank"]: _counts(part["series"]) for part in parts}
    first = counts[0]
    for rank, count in sorted(counts.items()):
        if count != first:
            said = (
                f"rank {rank} recorded {count[0]} micro-steps and {count[1]} updates, rank 0 "
                f"{first[0]} and {first[1]}: every rank must record the same steps"
            )
            return said + (_UNEVEN if count[1] == first[1] else "")
    for key, given in _GIVEN.items():
        have = sorted(part["info"]["rank"] for part in parts if key in part["series"])
        if have and len(have) < len(parts):
            return (
                f"Recorder.micro() was given {given} on rank(s) {', '.join(map(str, have))} "
                f"and not on the others: give it on every rank, or on none"
            )
    return None


_UNEVEN = (
    " (the same updates in other numbers of micro-steps: the loader gave the ranks unequal "
    "numbers of batches, as accelerate's even_batches=False or a sampler that neither pads "
    "nor drops the rest does; give every rank the same number)"
)

# What a rank's micro() was given, by the series it keeps: the ranks' series are combined
# micro-step by micro-step, so one rank's cannot stand for all.
_GIVEN = {"micro/items": "items=", "micro/data": "batch="}


def _counts(series: dict[str, np.ndarray]) -> tuple[int, int]:
    return len(series["micro/loss"]), len(series["update/state"])
