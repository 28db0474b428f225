"""Writing run directories: whole or not at all, never over anything that is not gradalign's.

A run is staged in a hidden sibling (`.NAME.partial-PID`) and swapped into place when complete,
in one atomic exchange where the system has one (Linux `renameat2`), so an interrupted run is
never readable and an earlier run at the path stays intact until then. One process writes a path
at a time (`locks.RunLock`); the next writer of a path removes what a killed one left behind.
Several runs that belong together (a baseline and its float64 reference, a verify set) are
recorded in a private area and committed together (`RunSet`, runs/runset.py).
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
from .layout import FORMAT, FORMAT_VERSION, MANIFEST, SERIES, is_run_dir
from .locks import RunLock
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


_PROBE = ".gradalign-probe-"  # a file made and removed to learn whether a folder takes files


def foreign_entries(path: Path) -> list[str]:
    """Files in an existing run directory that the run does not list (the user's own)."""
    return _entries(path)[0]


def _entries(path: Path) -> tuple[list[str], list[Path]]:
    """An existing run directory's entries the run does not list, and its folders (one walk)."""
    try:
        listed = json.loads((path / MANIFEST).read_text()).get("files", {})
    except (OSError, ValueError, RecursionError):
        listed = {}
    known = {MANIFEST, *(listed if isinstance(listed, dict) else {})}
    found, folders = [], [path]
    for entry in sorted(path.rglob("*")):
        rel = entry.relative_to(path).as_posix()
        if entry.name.startswith(_PROBE):
            continue  # a write probe a kill left behind: gradalign's own, never the user's
        if entry.is_dir() and not entry.is_symlink():
            folders.append(entry)
            if not any(k.startswith(rel + "/") for k in known):
                found.append(rel + "/")
        elif rel not in known:
            found.append(rel)
    return found, folders


def ensure_writable(out_dir: str | os.PathLike[str]) -> Path:
    """Refuse, before any work, a path where a run cannot or must not be written: one that holds
    something other than a gradalign run (or an empty directory), a run holding the user's own
    files, a path under a regular file, or a directory this user cannot write."""
    path = Path(out_dir)
    if os.fspath(out_dir) == "" or _holds_cwd(path):
        raise BadInput(  # replacing it would move the working directory away, and delete it
            f"{os.fspath(out_dir)!r}: the working directory (or one above it) is no place for a "
            "run: name a folder for it"
        )
    holder = _run_holding(path)
    if holder is not None:  # replacing that run would delete this one with it
        raise BadInput(f"{path} lies inside the run {holder}: choose a folder outside it")
    if path.is_symlink():  # a run is replaced by renaming: the link, not what it names
        raise BadInput(
            f"{path} is a symbolic link (to {os.readlink(path)}); a run is written in place of "
            "its path, never through a link: give the folder itself, or another path"
        )
    if path.exists() and not path.is_dir():
        raise BadInput(f"{path} exists and is not a gradalign run; refusing to overwrite it")
    if path.is_dir() and any(path.iterdir()):
        if not is_run_dir(path):
            raise BadInput(f"{path} exists and is not a gradalign run; refusing to overwrite it")
        foreign, folders = _entries(path)
        if foreign:
            raise BadInput(
                f"{path} holds files that are not the run's ({', '.join(foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}); refusing to replace it: move them "
                "or choose another output"
            )
        for folder in folders:
            probe_writable(folder, path)  # moved aside, then deleted: each folder written in
    ensure_parent_writable(path, str(path))
    return path


def kept_aside(refusal: BadInput, staged: Path, aside: Path, said: str) -> BadInput:
    """`refusal` of a final path, the complete runs at `staged` moved to `aside` and `said` so
    with it; the refusal as it was where they cannot be moved (they are dropped then)."""
    try:
        os.rename(staged, aside)
    except OSError:
        return refusal
    return BadInput(f"{refusal}; {said} {aside}")


def _run_holding(path: Path) -> Path | None:
    """The recorded run that `path` lies inside, if any, on disk: through links and `..` as
    the system resolves them (a link into a run, `link/..` standing for the run); said relative
    to the working directory where `path` is relative and lies below it."""
    try:
        real = Path(os.path.realpath(path))
        cwd = None if path.is_absolute() else Path(os.path.realpath(Path.cwd()))
    except OSError:  # the working directory is gone: nothing relative to resolve
        return None
    for folder in real.parents:
        if (folder / MANIFEST).is_file() and is_run_dir(folder):
            inside = cwd is not None and folder.is_relative_to(cwd)
            return folder.relative_to(cwd) if inside else folder
    return None


def _holds_cwd(path: Path) -> bool:
    """Whether `path` is the working directory or a folder above it."""
    try:
        return Path.cwd().is_relative_to(os.path.abspath(path))
    except OSError:  # the working directory is gone: nothing holds it
        return False


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
        fd, name = tempfile.mkstemp(prefix=_PROBE, dir=directory)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        # an existing directory that answers "no such file" takes no new files (/proc, /sys)
        why = "it takes no new files" if exc.errno == errno.ENOENT else exc.strerror
        raise BadInput(f"{for_path}: cannot write in {directory} ({why})") from None


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


def discard_run(final: Path) -> None:
    """Remove the run (or file) at `final`: moved aside in one rename first (`.NAME.partial-PID`,
    which the next write there clears), so an interrupt leaves the run whole or gone, never half.
    Its lock is held for the rename, as every writer of that path holds it: a run another process
    is writing there is refused (BadInput), not taken from under it."""
    if not final.exists():
        return
    aside = final.parent / f".{final.name}.partial-{os.getpid()}"
    with RunLock(final):
        os.rename(final, aside)
    if aside.is_dir():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink()


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
            from .runset import recover_commits  # runset.py builds on this module

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
            self._check_staged()
            try:
                ensure_writable(self.final)  # nobody put their own files there meanwhile
            except BadInput as exc:  # a complete run is not thrown away for a stray file
                aside = self.final.with_name(f"{self.final.name}.gradalign-{os.getpid()}")
                raise kept_aside(exc, self.staging, aside, "the recorded run was kept at") from None
            with deferred_interrupts():
                swap_into_place(self.staging, self.final)
        except BaseException:
            self.abort()
            raise
        self.lock.release()
        return self.final

    def _check_staged(self) -> None:
        """Every file the manifest lists is where it was written: a staging folder removed
        while the run was recorded (a cleanup job, a tmp reaper) is made again by the next
        write, and the run swapped in would lack the files written before."""
        missing = [rel for rel in self.checksums if not (self.staging / rel).is_file()]
        if missing:
            raise BadInput(
                f"{self.final}: {len(missing)} of the run's files vanished while it was recorded "
                f"(first {missing[0]}: was {self.staging} removed?); nothing was put in place, "
                "and what stood there stays"
            )

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
