"""One update's files for the streamed judge (judge/stream.py), and what is read from them
alone, before any drift: a gradient's sums (`sweep`) and a tensor's gradients beside the weights
the runs entered the update with (`entered`).

A sweep depends on the files alone, so the judge starts the next update's sweeps on its threads
behind this update's tensors: a thread that has finished its share of this update sweeps the
next one's gradients instead of waiting for the largest tensor (`UpdateFiles.ahead`). The sums
are the same whichever thread takes them, and whenever."""

from __future__ import annotations

from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass, field

from ..runs.layout import grads_file, weights_file
from ..runs.model import Run
from ..runs.store import SLICE, CheckedFile
from .fused import Pair, widen64
from .metrics import quiet
from .weight_term import Sums, sums_of

CHUNK = SLICE  # elements per slice: the checks before the judge read as many (runs/store.py)

Sweep = list[CheckedFile | None]  # baseline, merged (or None) and reference (or None) gradients


@dataclass
class UpdateFiles:
    """The files of one update: weights (b, m, r), gradients, start and previous weights; and
    per tensor its gradients' sweep, started ahead (a Future) or done."""

    wb: CheckedFile | None = None
    wm: CheckedFile | None = None
    wr: CheckedFile | None = None
    gb: CheckedFile | None = None
    gm: CheckedFile | None = None
    gr: CheckedFile | None = None
    start: CheckedFile | None = None
    pb: CheckedFile | None = None
    pr: CheckedFile | None = None
    pm: CheckedFile | None = None  # without a reference, the drift's other run is the merged
    first: bool = False  # update 0: both runs stepped from the same weights
    update: int = 0
    opened: list[CheckedFile] = field(default_factory=list)
    sweeps: dict[str, Future | Pair] = field(default_factory=dict)

    def ahead(self, pool: Executor, wanted: dict[str, Sweep]) -> None:
        """Start the sweeps `wanted` (per tensor, its files) on `pool`."""
        for name, files in wanted.items():
            self.sweeps[name] = pool.submit(quiet(sweep), files, name)

    def swept(self, name: str, files: Sweep) -> Pair:
        """A tensor's sweep of `files`: the one started ahead, or done before, or now."""
        got = self.sweeps.get(name)
        if got is None:
            got = self.sweeps[name] = sweep(files, name)
        return got.result() if isinstance(got, Future) else got

    def close(self) -> None:
        """Close the files, once no sweep started ahead reads them any more."""
        stop([f for f in self.sweeps.values() if isinstance(f, Future)])
        for f in self.opened:
            f.close()


def gradient_names(files: UpdateFiles, names: list[str]) -> list[str]:
    """The tensors whose gradients both runs recorded at this update."""
    if files.gb is None or files.gm is None:
        return []
    return [n for n in names if n in files.gb.file.entries and n in files.gm.file.entries]


def open_update(
    i: int,
    base: Run,
    merged: Run,
    ref: Run | None,
    shapes: dict[str, tuple],
    params: dict[str, tuple],
) -> UpdateFiles:
    """Update i's files of the runs: weights (of every tensor, `shapes`), gradients (`params`),
    the start and the weights entered with (the reference's, or else the merged run's)."""
    files = UpdateFiles(first=i == 0, update=i)

    def get(run: Run | None, relpath: str, shapes: dict) -> CheckedFile | None:
        if run is None or relpath not in run.store.checksums:
            return None
        opened = run.store.checked(relpath, shapes)
        files.opened.append(opened)
        return opened

    try:
        files.wb = get(base, weights_file(i), shapes)
        files.wm = get(merged, weights_file(i), shapes)
        files.wr = get(ref, weights_file(i), shapes)
        if base.has_grads:
            files.gb = get(base, grads_file(i), params)
        if merged.has_grads:
            files.gm = get(merged, grads_file(i), params)
        if ref is not None and ref.has_grads:
            files.gr = get(ref, grads_file(i), params)
        files.start = get(base, weights_file(None), shapes)
        previous = None if i == 0 else i - 1
        files.pb = get(base, weights_file(previous), shapes)
        if ref is not None:
            files.pr = get(ref if i else base, weights_file(previous), shapes)
        elif merged.has_grads:
            files.pm = get(merged if i else base, weights_file(previous), shapes)
    except BaseException:
        files.close()
        raise
    return files


def settled(tasks: list[Future]) -> list:
    """The tasks' results in order. Where one raises (a file refused), the others are cancelled
    or waited for first: they read the update's files, which are closed next."""
    try:
        return [t.result() for t in tasks]
    except BaseException:
        stop(tasks)
        raise


def stop(tasks: list[Future]) -> None:
    """Cancel the tasks not yet started; wait for the others."""
    wait([t for t in tasks if not t.cancel()])


def sweep(files: Sweep, name: str) -> Pair:
    """One pass over a gradient: baseline, merged (or None) and reference (or None)."""
    pair = Pair()
    streams = [c.stream(name) if c is not None else None for c in files]
    count = streams[0].count  # type: ignore[union-attr]
    done = 0
    while True:
        b, m, r = (widen64(s.read(CHUNK)) if s is not None else None for s in streams)
        pair.add(b, m, r)  # type: ignore[arg-type]
        done += b.size  # type: ignore[union-attr]
        if done >= count:
            break
    for stream in streams:
        if stream is not None:
            stream.finish()
    return pair


def entered(f: UpdateFiles, name: str) -> Sums:
    """A tensor's `Sums` of its gradients at this update and the weights the runs entered it
    with (all read before in this update or the one before it: checked)."""
    files = [c for c in (f.gb, f.gm, f.pb, f.pm) if c is not None]
    assert len(files) == 4, "both runs' gradients and the weights they entered with"
    streams = [c.stream(name, checked=True) for c in files]
    total, done, count = Sums(0.0, 0.0, 0.0), 0, streams[0].count
    while True:
        parts = [widen64(s.read(CHUNK)) for s in streams]
        total = total + sums_of(*parts)
        done += parts[0].size
        if done >= count:
            break
    for stream in streams:
        stream.finish()
    return total
