"""Launch W ranks of the built-in loop: `gradalign merged --nproc W` without torchrun.

`torch.multiprocessing` spawns W processes; each sets `OMP_NUM_THREADS=1` (one thread per rank:
W ranks share the machine's cores), joins a process group through a TCP store that this process
holds on a free port of 127.0.0.1 (gloo on the CPU, nccl on CUDA, one GPU per rank), and trains
its jobs in turn through the same `train()` a single process uses. One launch runs many jobs,
since starting the ranks (importing torch in each) costs seconds: the selftest and the tests
record all their data-parallel runs in one. A rank leaves with `os._exit` once its work is done
and the group destroyed (an interpreter's teardown can abort on gloo's threads).

A rank that raises stops the launch; a rank that dies (killed, out of memory) makes the others
be terminated: the jobs' runs are then absent, and the caller's `RunSet` discards its area.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue as queues
import signal
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..config import TrainConfig
from ..errors import BadInput

Progress = Callable[[int, int], None]  # (job index, update)
POLL_S = 0.2


@dataclass(frozen=True)
class Job:
    """One merged run to record on every rank."""

    config: TrainConfig
    out: str  # the run directory (rank 0 writes it)
    fault: str | None = None


def backend_for(config: TrainConfig) -> str:
    """gloo on the CPU, nccl on CUDA; BadInput when this machine cannot run W ranks of it."""
    import torch
    import torch.distributed as dist

    from .device import resolve_device

    if not dist.is_available():
        raise BadInput("--nproc needs torch.distributed, which this torch build lacks")
    device = resolve_device(config.device)
    if device.type == "cuda":
        if not dist.is_nccl_available():
            raise BadInput("--nproc on CUDA needs the nccl backend, which this torch lacks")
        if torch.cuda.device_count() < config.nproc:
            raise BadInput(
                f"--nproc {config.nproc} on CUDA needs one GPU per rank; torch sees "
                f"{torch.cuda.device_count()}"
            )
        return "nccl"
    if not dist.is_gloo_available():
        raise BadInput("--nproc on the CPU needs the gloo backend, which this torch lacks")
    return "gloo"


def launch(jobs: list[Job], nproc: int, progress: Progress | None = None) -> None:
    """Record every job on `nproc` ranks, one job after the other, in one launch."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    if not jobs:
        return
    backends = {backend_for(job.config) for job in jobs}
    if len(backends) > 1 or any(job.config.nproc != nproc for job in jobs):
        raise ValueError("one launch runs jobs of one backend and one nproc")
    events = mp.get_context("spawn").SimpleQueue()
    store = _store()  # here, not in rank 0: it outlives every rank, however they end
    args = (nproc, store.port, backends.pop(), jobs, events)
    with _one_thread(), _quiet("torch.multiprocessing.spawn"), _hidden_main():
        context = mp.start_processes(_rank_main, args, nproc, join=False, start_method="spawn")
    with _quiet("torch.multiprocessing.spawn"):
        errors: list[tuple] = []
        done: set[int] = set()
        try:
            while not context.join(timeout=POLL_S):
                _drain(events, progress, errors, done)
        except ProcessException as exc:
            _drain(events, progress, errors, done)
            if len(done) < nproc:  # a rank that died after its work was done changes nothing
                exitcodes = [process.exitcode for process in context.processes]
                raise _failure(exc, errors, exitcodes) from None
        except BaseException:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
            for process in context.processes:
                process.join()
            raise
        _drain(events, progress, errors, done)
    del store


def _store():
    """The ranks' rendezvous: a TCP store on a free port of 127.0.0.1, held by this process."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)


def _rank_main(rank: int, world: int, port: int, backend: str, jobs: list[Job], events) -> None:
    """One rank: join the group, train every job, leave."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        GRADALIGN_LAUNCHER="gradalign",
    )
    import torch
    import torch.distributed as dist

    from .faults import get_fault
    from .loop import train

    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, world, False)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    try:
        for index, job in enumerate(jobs):
            report = (
                (lambda update, i=index: events.put(("update", i, update))) if not rank else None
            )
            train(job.config, job.out, report, fault=get_fault(job.fault, job.config))
    except BaseException as exc:
        events.put(("error", rank, type(exc).__name__, " ".join(str(exc).split()), _is_bad(exc)))
        raise
    events.put(("done", rank))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: gloo's threads may abort it (pytorch #179291)


def _is_bad(exc: BaseException) -> bool:
    return isinstance(exc, BadInput)


def _drain(events, progress: Progress | None, errors: list[tuple], done: set[int]) -> None:
    while True:
        try:
            if events.empty():
                return
            event = events.get()
        except (OSError, EOFError, queues.Empty):
            return
        if event[0] == "update" and progress is not None:
            progress(event[1], event[2])
        elif event[0] == "error":
            errors.append(event[1:])
        elif event[0] == "done":
            done.add(event[1])


def _failure(exc: BaseException, errors: list[tuple], exitcodes: list[int | None]) -> Exception:
    """What the caller sees when a rank failed: the rank's own BadInput as such, a death by a
    signal as bad input (the machine's, not gradalign's), anything else as a bug. A rank killed
    by a signal other than the SIGTERM that stops the others is the cause even where another
    rank reported first: its peers' errors ("Connection closed by peer") follow from it."""
    reported = {error[0] for error in errors}
    killed = [
        (rank, -code)
        for rank, code in enumerate(exitcodes)
        if code is not None and code < 0 and -code != signal.SIGTERM and rank not in reported
    ]
    if errors and (errors[0][3] or not killed):
        rank, kind, message, bad = errors[0]
        if bad:
            return BadInput(message)
        return RuntimeError(f"rank {rank} failed: {kind}: {message}")
    if killed:
        rank, number = killed[0]
        why = f"was killed by {signal.Signals(number).name}"
    else:
        rank = getattr(exc, "error_index", "?")
        name = getattr(exc, "signal_name", None)
        code = getattr(exc, "exit_code", "?")
        why = f"was killed by {name}" if name else f"exited with code {code}"
    return BadInput(f"rank {rank} {why}; the other ranks were stopped and no run was written")


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """OMP_NUM_THREADS=1 in the spawned ranks (they inherit this process's environment)."""
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before


@contextlib.contextmanager
def _hidden_main() -> Iterator[None]:
    """Spawned processes re-run the parent's `__main__` script (multiprocessing's rule) unless
    it is guarded by `if __name__ == "__main__"`; the ranks need nothing from it (their function
    and jobs live in gradalign), so it is hidden while they start."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """torch logs a warning per process it terminates; the error says what happened."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
