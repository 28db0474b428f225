"""The tensors of run directories judged streamed: per update, each tensor is read in slices from
every file that holds it (baseline, merged, reference, starting weights, previous update), and
its judgement computed in one pass (judge/stream_tensor.py, judge/fused.py); the next update's
gradient sweeps start behind this update's tensors (judge/update_files.py). Memory is a few
slices per thread, the noise-dominated drift is kept in a scratch file per tensor
(judge/drift.py), and every number equals what `compare._Judge.tensors` computes from whole
tensors, up to the order of float64 additions (tests/test_streaming.py).

Tensors are judged in parallel: in threads (numpy releases the GIL inside each slice's
arithmetic), or, for runs large enough and where the machine has the cores, in processes that
each own a share of the tensors (judge/owners.py, judge/stream_child.py), with the same numbers
(tests/test_judge_processes.py). Then, across all tensors, gradients are judged net of a weight
term and tensors without a gradient follow the drift of those of their shape.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..runs.model import Run
from ..runs.sketches import dot
from ..runs.store import CheckedFile
from .compatible import stray
from .drift_files import DriftFiles, allowance
from .followers import sources
from .fused import widen64
from .inputs import Inputs
from .metrics import fit_of, fit_total, quiet
from .owners import Owners, folder_of, foreign_facts, processes, published, shares
from .results import UpdateResult
from .rounding import floors
from .step_rules import stored_bits
from .stream_child import ChildSide
from .stream_tensor import Outcome, TensorSide, gradient_files
from .update_files import (
    CHUNK,
    UpdateFiles,
    entered,
    gradient_names,
    open_update,
    settled,
    stop,
)
from .weight_term import coefficient, failing, netted
from .window_sizes import judged_updates


def workers() -> int:
    """Threads for judging tensors: GRADALIGN_THREADS, else the CPUs this process may run on
    (at most 4)."""
    value = os.environ.get("GRADALIGN_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(4, cpus or 1))


def streamable(*runs: Run | None) -> bool:
    """Whether every given run is a full run directory the streaming judge can read (and reads
    as its loaders would: a Run given other loaders is judged through them)."""
    return all(r is None or _own_files(r) for r in runs)


def _own_files(run: Run) -> bool:
    if run.store is None or not run.full_weights or run.record != "full":
        return False
    return run.store.loaders == (run.load_init_weights, run.load_weights, run.load_grads)


class StreamJudge(ChildSide, TensorSide):
    """`compare._Judge.tensors` for run directories, streamed."""

    def __init__(self, inputs: Inputs) -> None:
        self.base, self.merged, self.ref, self.tol, self.floor, self.bound = inputs.unpack()
        self.shapes = {t.name: t.shape for t in self.base.tensors}
        self.params = {t.name: t.shape for t in self.base.tensors if t.kind == "param"}
        self.bits = stored_bits(self.base)
        self.dtype = inputs.dtype
        self.grad_atol = self.tol.weight_atol  # with the rounding floor, without a reference
        self.floor16 = 0.0  # 16-bit rounding in both runs (rounding.rounding_in_both)
        self.apart = False  # the update judged now was entered apart (UpdateResult's)
        self.names = [t.name for t in self.base.tensors]
        self.next: UpdateFiles | None = None  # the next update's files, its sweeps started
        self.current: UpdateFiles | None = None  # a child's files of the update judged now
        self.current_grads: set[str] = set()  # and the tensors both runs have gradients of
        self.updates = judged_updates(self.base, self.merged)  # compare._judge's
        sizes = {n: math.prod(self.shapes[n]) for n in self.names}
        self.own, self.owner = self.names, {n: 0 for n in self.names}
        self.owners: Owners | None = None
        self.folder: str | None = None  # the drift files of every process, where several judge
        self.drift = DriftFiles()  # against the reference, or else the merged run (drift.Drift)
        dealt = shares(sizes, processes(workers(), sum(sizes.values())))
        if len(dealt) > 1:
            self._fork(dealt)
        threads = 1 if self.owners is not None else workers()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="gradalign-judge")
        self._ahead(0)  # while the losses and the bookkeeping are judged

    def _fork(self, dealt: list[list[str]]) -> None:
        """Judge `dealt[0]` here and each other share in a child process; where the system
        cannot fork (out of processes or memory), judge them all here."""
        owner = {n: k for k, share in enumerate(dealt) for n in share}
        self.folder = tempfile.mkdtemp(prefix="gradalign-drift-")
        self.drift = DriftFiles(folder_of(self.folder, 0), published(self.shapes, owner))
        try:
            self.owners = Owners(len(dealt), lambda k, conn: self._serve(k, dealt[k], conn))
        except OSError:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder, self.drift = None, DriftFiles()
            return
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.own, self.owner = dealt[0], owner

    def close(self) -> None:
        if self.owners is not None:
            self.owners.close()
        self.pool.shutdown(cancel_futures=True)  # sweeps started ahead of an update never judged
        self.drift.close()
        for files in (self.next, self.current):
            if files is not None:
                files.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __call__(self, result: UpdateResult) -> None:
        i = result.update
        files = self._take(i)
        try:
            names = self.names
            grads = gradient_names(files, names)
            judged_grads = set(grads)  # looked up per tensor: a list made it quadratic
            self.grad_atol, self.floor16 = self.tol.weight_atol, 0.0
            self.apart = result.entered_apart
            if self.ref is None and grads:
                self.grad_atol, self.floor16 = self._rounding_floors(files.gb, grads)
            owners = self.owners
            if owners is not None:
                owners.send(("child_judge", (i, self.grad_atol, self.floor16, self.apart)))
            found, failure = self._judge_own(files, judged_grads)
            facts = [self.drift.facts(self.own)]
            if owners is not None:
                for outcomes, their_failure, their_facts in owners.replies():
                    found.update(outcomes)
                    facts.append(their_facts)
                    if their_failure and (failure is None or their_failure[0] < failure[0]):
                        failure = their_failure  # the first failing tensor in model order
            if failure is not None:
                raise failure[1]
            found = {n: found[n] for n in names}
            facts = self._net_of_weights(found, files, grads) or facts
            self._follow(found, files, judged_grads, facts)
            order = files.wb.file.names() if files.wb is not None else []
        finally:
            files.close()
        for name in order:  # the reference is refused at its first stray, in file order
            if name in found and found[name].strays is not None and self.bound is not None:
                raise stray(self.bound, i, name, found[name].strays)
        result.weights.extend(o.weight for o in found.values() if o.weight is not None)
        result.grads.extend(found[n].grad for n in grads if found[n].grad is not None)
        if grads:
            bb, mm, bm, rr = (fit_total([found[n].fit[k] for n in grads]) for k in range(4))
            result.grad_ratio, result.grad_cosine = fit_of(bb, mm, bm)
            if self.ref is not None:
                result.grad_norms = (math.sqrt(bb), math.sqrt(mm), math.sqrt(rr))

    def _judge_own(
        self, files: UpdateFiles, grads: set[str]
    ) -> tuple[dict[str, Outcome], tuple[int, BaseException] | None]:
        """This process's tensors at this update, and the first of them that failed (its place
        among all tensors, and its error); the next update's sweeps started behind them."""
        own = self.own
        judged = self._submit(lambda n: self._tensor(n, files, grads), own)
        self._ahead(files.update + 1)  # queued behind this update's tensors
        found: dict[str, Outcome] = {}
        try:
            for name, task in zip(own, judged, strict=True):
                found[name] = task.result()
        except BaseException as exc:
            if not isinstance(exc, Exception):
                raise  # Ctrl-C: the judge stops here
            return found, (self.names.index(name), exc)
        finally:
            stop(judged)  # none reads the files any more (a Ctrl-C while the next opened)
        return found, None

    def _net_of_weights(
        self, found: dict[str, Outcome], files: UpdateFiles, grads: list[str]
    ) -> list | None:
        """Without a reference: the failing gradients judged again net of c·Δw, and the tensors
        whose gradient passes so judged again with it (their drift counts where it passed;
        judge/weight_term.py). Returns every process's drift facts after it (None: none judged
        again)."""
        pb, pm = files.pb, files.pm
        if self.ref is not None or files.first or pb is None or pm is None:
            return None
        if not failing(found[n].grad for n in grads if found[n].grad is not None):
            return None
        names = [n for n in grads if n in pb.file.entries and n in pm.file.entries]
        read = settled(self._submit(lambda n: entered(files, n), names))
        sums = dict(zip(names, read, strict=True))
        c = coefficient(sums.values())
        redo = {}
        for name, s in sums.items():
            d = found[name].grad
            if d is not None and not d.ok and netted(d, s.residual(c), c).ok:
                redo[name] = s
        mine, *theirs = self._by_owner(redo)
        owners = self.owners
        if owners is not None:
            owners.send_each([("child_net", (share, c)) for share in theirs])
        for name, s in mine.items():
            found[name] = self._tensor(name, files, set(grads), netting=(c, s))
        facts = [self.drift.facts(self.own)]
        if owners is not None:
            for outcomes, their_facts in owners.replies():
                found.update(outcomes)
                facts.append(their_facts)
        return facts

    def _follow(
        self, found: dict[str, Outcome], files: UpdateFiles, grads: set[str], facts: list
    ) -> None:
        """Judge again the tensors without a gradient of their own, with the drift of the
        tensors they follow (judge/followers.py), once every graded tensor's is known; `facts`:
        each process's drift facts (`DriftFiles.facts`), where several judge."""
        every = {name: fact for share in facts for name, fact in share.items()}
        graded = {n for n, (is_graded, _, _) in every.items() if is_graded}
        follows = sources(self.shapes, graded, lambda o: allowance(every[o][2]) > 0)
        follows = {n: f for n, f in follows.items() if n in found}
        if not follows:
            return
        mine, *theirs = self._by_owner(follows)
        owners = self.owners
        if owners is not None:
            owners.send_each(
                [
                    ("child_follow", (share, foreign_facts(share, every, self.owner, k)))
                    for k, share in enumerate(theirs, start=1)
                ]
            )
        self.drift.follow(foreign_facts(mine, every, self.owner, 0))
        for name, follow in mine.items():
            found[name] = self._tensor(name, files, grads, follow)
        if owners is not None:
            for outcomes in owners.replies():
                found.update(outcomes)

    def _by_owner(self, named: dict[str, Any]) -> list[dict[str, Any]]:
        """`named` split by the process that owns each name: this one's first."""
        children = len(self.owners.pids) if self.owners is not None else 0
        split: list[dict[str, Any]] = [{} for _ in range(1 + children)]
        for name, value in named.items():
            split[self.owner[name]][name] = value
        return split

    def _rounding_floors(self, gb: CheckedFile, names: list[str]) -> tuple[float, float]:
        """The gradients' per-element tolerance with the rounding floor of this update, and the
        16-bit one (one more pass over the baseline's gradients, without a reference only)."""
        sumsq, elements = 0.0, 0
        for name in names:
            stream = gb.stream(name, checked=True)
            while (part := stream.read(CHUNK)).size:
                part = widen64(part)
                sumsq += dot(part, part)
                elements += part.size
            stream.finish()
        return floors(self.tol, self.dtype, sumsq, elements)

    def _submit(self, task: Callable[[str], Any], names: list[str]) -> list[Future]:
        """`task(name)` for each name, on the pool."""
        return [self.pool.submit(quiet(task), n) for n in names]

    def _take(self, i: int) -> UpdateFiles:
        """Update i's files: those opened ahead, or opened now."""
        ahead, self.next = self.next, None
        if ahead is not None and ahead.update == i:
            return ahead
        if ahead is not None:
            ahead.close()
        return self._open(i)

    def _ahead(self, i: int) -> None:
        """Open update i's files and start its gradients' sweeps on the pool. Where that fails,
        nothing is started: update i opens them again in its turn, and is refused there."""
        if i >= self.updates:
            return
        try:
            files = self._open(i)
        except Exception:
            return
        referenced, grads = self.ref is not None, set(gradient_names(files, self.names))
        wanted = {n: gradient_files(files, n, grads, referenced)[1] for n in self.own}
        files.ahead(self.pool, {n: w for n, w in wanted.items() if w is not None})
        self.next = files

    def _open(self, i: int) -> UpdateFiles:
        return open_update(i, self.base, self.merged, self.ref, self.shapes, self.params)


__all__ = ["StreamJudge", "np", "streamable"]
