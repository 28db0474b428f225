"""Writing run directories: whole or not at all, never over anything that is not gradalign's.

A run is staged in a hidden sibling (`.NAME.partial-PID`) and swapped into place when complete,
in one atomic exchange where the system has one (Linux `renameat2`), so an interrupted run is
never readable and an earlier run at the path stays intact until then. One process writes a path
at a time (`locks.RunLock`); the next writer of a path removes what a killed one left behind.
Several runs that belong together (a baseline and its float64 reference, a verify set) are
recorded in a private area and committed together (`RunSet`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import BadInput
from . import checksums
from .layout import FORMAT, FORMAT_VERSION, JOURNAL, MANIFEST, SERIES, is_run_dir
from .locks import RunLock, held_here
from .model import Tensors
from .tensorfile import parts, write_parts


def _write_atomic(path: Path, data: bytes | Sequence[memoryview], durable: bool = False) -> str:
    """Write via a temporary name and rename; returns the checksum (hex, runs/checksums.py's
    WRITTEN) of what was written.
    `data`: bytes, or buffers written one after the other (a tensor file's header and arrays).
    Data files skip fsync: the manifest's checksums already expose a file that a crash left
    short, so only the manifest itself is synced."""
    if not path.parent.is_dir():  # a stat: mkdir on an existing folder cost 0.4 ms here
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    chunks = [memoryview(data)] if isinstance(data, bytes) else data
    digest = write_parts(tmp, chunks)
    if durable:
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    return digest or ""


def foreign_entries(path: Path) -> list[str]:
    """Files in an existing run directory that the run does not list (the user's own)."""
    try:
        listed = json.loads((path / MANIFEST).read_text()).get("files", {})
    except (OSError, ValueError, RecursionError):
        listed = {}
    known = {MANIFEST, *(listed if isinstance(listed, dict) else {})}
    found = []
    for entry in sorted(path.rglob("*")):
        rel = entry.relative_to(path).as_posix()
        if entry.is_dir() and not entry.is_symlink():
            if not any(k.startswith(rel + "/") for k in known):
                found.append(rel + "/")
        elif rel not in known:
            found.append(rel)
    return found


def ensure_writable(out_dir: str | os.PathLike[str]) -> Path:
    """Refuse, before any work, a path where a run cannot or must not be written: one that holds
    something other than a gradalign run (or an empty directory), a run holding the user's own
    files, a path under a regular file, or a directory this user cannot write."""
    path = Path(out_dir)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise BadInput(f"{path} exists and is not a gradalign run; refusing to overwrite it")
    if path.is_dir() and any(path.iterdir()):
        if not is_run_dir(path):
            raise BadInput(f"{path} exists and is not a gradalign run; refusing to overwrite it")
        foreign = foreign_entries(path)
        if foreign:
            raise BadInput(
                f"{path} holds files that are not the run's ({', '.join(foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}); refusing to replace it: move them "
                "or choose another output"
            )
    ensure_parent_writable(path, str(path))
    return path


def ensure_parent_writable(path: Path, label: str) -> None:
    """The nearest existing ancestor of `path` must be a directory this process can write in."""
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise BadInput(f"{label}: {ancestor} is a file, not a directory")
    probe_writable(ancestor, label)


def probe_writable(directory: Path, for_path: Path | str) -> None:
    """Create and remove a file in `directory`: permission bits do not tell (root ignores them,
    a read-only file system does not show in them)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".gradalign-probe-", dir=directory)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise BadInput(f"{for_path}: cannot write in {directory} ({exc.strerror})") from None


# -- swapping a complete run into place ----------------------------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
try:
    _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
except (AttributeError, OSError):  # not Linux, or a libc without it
    _renameat2 = None


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths; False where the system or file system cannot."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def swap_into_place(staging: Path, final: Path) -> None:
    """Put the complete run at `staging` at `final`, replacing what stood there whole."""
    if not final.exists():
        os.rename(staging, final)
    elif _exchange(staging, final):
        shutil.rmtree(staging)  # it holds the previous run now
    else:  # two renames: a kill between them leaves `.NAME.old-PID`, restored by clear_stale
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old)


def clear_stale(final: Path) -> None:
    """Remove what killed writers of `final` left (call with its lock held): staging directories
    go; a previous run moved aside is put back if nothing took its place."""
    for left in _siblings(final, ".old-"):
        if not final.exists() and is_run_dir(left):
            os.rename(left, final)
        else:
            shutil.rmtree(left, ignore_errors=True)
    for left in _siblings(final, ".partial-"):
        shutil.rmtree(left, ignore_errors=True)


def _siblings(final: Path, infix: str) -> list[Path]:
    """`.NAME{infix}*` beside `final`, sorted (a directory scan: a glob compiles a pattern per
    name)."""
    prefix = f".{final.name}{infix}"
    try:
        with os.scandir(final.parent) as entries:
            return sorted(final.parent / e.name for e in entries if e.name.startswith(prefix))
    except FileNotFoundError:
        return []


class RunWriter:
    """Writes one run directory: data files first, then the manifest, then the swap into place."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.final = ensure_writable(out_dir)
        self.made = missing_dirs(self.final.parent)
        self.lock = RunLock(self.final).acquire()
        try:
            recover_commits(self.final.parent)
            clear_stale(self.final)
            self.final.parent.mkdir(parents=True, exist_ok=True)
            self.staging = self.final.parent / f".{self.final.name}.partial-{os.getpid()}"
            self.staging.mkdir()
        except BaseException:
            self.lock.release()
            remove_if_empty(self.made)
            raise
        self.checksums: dict[str, str] = {}

    def write_tensors(self, relpath: str, tensors: Tensors) -> None:
        """Write one tensor file now, streamed from the arrays (docs/FORMAT.md)."""
        self.checksums[relpath] = _write_atomic(self.staging / relpath, parts(tensors))

    def finish(self, manifest: dict, series: Tensors) -> Path:
        """Write the series and the manifest, then move the run into place."""
        try:
            self.write_tensors(SERIES, series)
            body = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest}
            body["checksum"] = checksums.WRITTEN
            body["files"] = dict(sorted(self.checksums.items()))
            text = json.dumps(body, indent=2, sort_keys=True, allow_nan=False) + "\n"
            _write_atomic(self.staging / MANIFEST, text.encode(), durable=True)
            ensure_writable(self.final)  # nobody put their own files there meanwhile
            with deferred_interrupts():
                swap_into_place(self.staging, self.final)
        except BaseException:
            self.abort()
            raise
        self.lock.release()
        return self.final

    def abort(self) -> None:
        """Drop the staged files; whatever stood at the final path stays untouched."""
        shutil.rmtree(self.staging, ignore_errors=True)
        self.lock.release()
        remove_if_empty(self.made)


# -- runs that belong together --------------------------------------------------------------------


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back while a few renames run, then deliver them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if signal.SIGTERM in caught:
        signal.raise_signal(signal.SIGTERM)  # to the handler before: Terminated, or the default
    if caught:
        raise KeyboardInterrupt


class RunSet:
    """Runs recorded together, committed together: `parent/NAME` for each name appears as a
    new set, or the earlier set stays as it was.

    Each run is recorded complete into a private area (`parent/.set-PID/NAME`, so relative links
    between members hold) while this process holds every member's lock; `commit` writes a
    journal, swaps each member into place and removes the journal. A commit cut short (a kill
    between two swaps) is finished by the next gradalign process that writes or reads there.
    """

    def __init__(self, parent: str | os.PathLike[str], names: list[str]) -> None:
        self.parent = Path(parent)
        self.names = list(dict.fromkeys(names))
        for name in self.names:
            ensure_writable(self.parent / name)
        self.made = missing_dirs(self.parent)  # removed again if nothing is committed
        self.locks: list[RunLock] = []
        try:
            for name in self.names:
                self.locks.append(RunLock(self.parent / name).acquire())
            recover_commits(self.parent)
            for name in self.names:
                clear_stale(self.parent / name)
            _clear_dead_areas(self.parent)
            self.area = self.parent / f".set-{os.getpid()}"
            shutil.rmtree(self.area, ignore_errors=True)
            self.area.mkdir(parents=True)
        except BaseException:
            self._release()
            raise

    def path(self, name: str) -> Path:
        """Where member `name` is recorded until the commit."""
        return self.area / name

    def commit(self) -> None:
        missing = [n for n in self.names if not is_run_dir(self.path(n))]
        if missing:
            raise RuntimeError(f"run set incomplete: {', '.join(missing)}")
        for name in self.names:
            ensure_writable(self.parent / name)
        journal = self.parent / JOURNAL.format(pid=os.getpid())
        with deferred_interrupts():
            _write_atomic(
                journal,
                json.dumps({"area": self.area.name, "names": self.names}).encode(),
                durable=True,
            )
            _roll_forward(self.parent, self.area, self.names, journal)
        self._release()

    def abort(self) -> None:
        shutil.rmtree(self.area, ignore_errors=True)
        self._release()
        remove_if_empty(self.made)

    def _release(self) -> None:
        for lock in self.locks:
            lock.release()
        self.locks = []

    def __enter__(self) -> RunSet:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self.locks:
            self.commit()
        elif self.locks:
            self.abort()


def missing_dirs(path: Path) -> list[Path]:
    """The directories that writing at `path` will create, outermost first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing[::-1]


def remove_if_empty(made: list[Path]) -> None:
    """Remove directories this process created, innermost first, as long as they are empty."""
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:
            return


def _roll_forward(parent: Path, area: Path, names: list[str], journal: Path) -> None:
    for name in names:
        if (area / name).exists():
            swap_into_place(area / name, parent / name)
    shutil.rmtree(area, ignore_errors=True)
    journal.unlink(missing_ok=True)


def recover_commits(parent: Path) -> None:
    """Finish set commits that a killed process left half done in `parent` (its journal says
    which members; their staged runs are complete). A commit whose members are locked by a live
    process is left to it."""
    for journal in sorted(parent.glob(JOURNAL.format(pid="*"))):
        pid = journal.name.split("-")[-1].removesuffix(".json")
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue  # its writer is still at work
        try:
            plan = json.loads(journal.read_text())
            names, area = [str(n) for n in plan["names"]], parent / str(plan["area"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if Path(area.name).name != area.name or area.name.startswith(".."):
            continue
        taken: list[RunLock] = []
        try:
            for name in names:
                if not held_here(parent / name):
                    taken.append(RunLock(parent / name).acquire())
            _roll_forward(parent, area, names, journal)
        finally:
            for lock in taken:
                lock.release()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clear_dead_areas(parent: Path) -> None:
    """Private areas of set writers that died before their commit: never committed, removed.
    (Areas named by a journal were rolled forward by `recover_commits` already.)"""
    for area in parent.glob(".set-*"):
        pid = area.name.removeprefix(".set-")
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(area, ignore_errors=True)
