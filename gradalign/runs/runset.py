"""Runs recorded together, put in place together: `RunSet`, its commit and its recovery.

A set's members are recorded complete into a private area, then put in place under a journal
that lets any later gradalign process finish a commit a kill cut short, each member then being
either its earlier run whole or its new run whole, all members alike (runs/set_journal.py:
`_commit`, `recover_commits`). Recovery acts only on what gradalign itself made.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from ..errors import BadInput
from ..paths import process_alive
from .layout import JOURNAL, is_run_dir
from .locks import RunLock
from .set_journal import (
    _COMMITTING,
    _MARKER_TEXT,
    _NEW,
    _OLD,
    AREA_MARKER,
    _commit,
    _identity,
    _is_area,
    _plain_name,
    recover_commits,
)
from .writer import (
    clear_stale,
    deferred_interrupts,
    ensure_writable,
    kept_aside,
    missing_dirs,
    remove_if_empty,
)


class RunSet:
    """Runs recorded together, committed together: `parent/NAME` for each name appears as a
    new set, or the earlier set stays as it was.

    Each run is recorded complete into a private area (`parent/.set-PID/new/NAME`, so relative
    links between members hold) while this process holds every member's lock; `commit` puts
    them in place under a journal (`_commit`). A commit cut short (a kill between two swaps) is
    finished by the next gradalign process that writes or reads there (`recover_commits`).
    """

    def __init__(self, parent: str | os.PathLike[str], names: list[str]) -> None:
        self.parent = Path(parent)
        self.names = list(dict.fromkeys(names))
        for name in self.names:
            ensure_writable(self.parent / name)
            if not _plain_name(name):  # recovery would refuse a journal naming it
                raise BadInput(f"{self.parent / name}: not a plain directory name for a run")
        self.made = missing_dirs(self.parent)  # removed again if nothing is committed
        self.locks: list[RunLock] = []
        try:
            for name in self.names:
                self.locks.append(RunLock(self.parent / name).acquire())
            recover_commits(self.parent)
            for name in self.names:
                clear_stale(self.parent / name)
            _clear_dead_areas(self.parent)
            self.area = _make_area(self.parent)
        except BaseException:
            self._release()
            raise

    def path(self, name: str) -> Path:
        """Where member `name` is recorded until the commit."""
        return self.area / _NEW / name

    def commit(self) -> None:
        try:
            missing = [n for n in self.names if not is_run_dir(self.path(n))]
            if missing:
                raise RuntimeError(f"run set incomplete: {', '.join(missing)}")
            for name in self.names:
                ensure_writable(self.parent / name)
            members = {name: _identity(self.path(name)) for name in self.names}
        except BadInput as exc:  # a path taken meanwhile: the complete runs are not thrown away
            kept = self.parent / f"gradalign-kept-{os.getpid()}"  # together: their links hold
            refusal = kept_aside(exc, self.area / _NEW, kept, "the recorded runs were kept in")
            self.abort()
            raise refusal from None
        except BaseException:
            self.abort()
            raise
        journal = self.parent / JOURNAL.format(pid=os.getpid())
        _COMMITTING.add(journal.absolute())
        try:
            with deferred_interrupts():
                _commit(self.parent, self.area, members, journal)
        except OSError as exc:
            shown = ", ".join(str(self.parent / n) for n in self.names)
            if os.path.lexists(journal):  # could not undo: it goes in as after a kill
                after = "the next gradalign command here finishes putting the new runs in place"
            else:
                shutil.rmtree(self.area, ignore_errors=True)
                remove_if_empty(self.made)
                after = "the earlier runs stay as they were"
            raise BadInput(
                f"{shown}: could not put the new run(s) in place ({exc.strerror or exc}); {after}"
            ) from None
        finally:  # as a kill would leave it: the journal, to whoever takes the locks next
            _COMMITTING.discard(journal.absolute())
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


def _make_area(parent: Path) -> Path:
    """This process's private area, marked as gradalign's. A leftover at the same name (pids are
    reused) is removed first if it is gradalign's and no journal names it; else refused."""
    pid = os.getpid()
    area = parent / f".set-{pid}"
    if os.path.lexists(area):
        named = os.path.lexists(parent / JOURNAL.format(pid=pid))
        if named or not (_is_area(area) or _empty_dir(area)):
            raise BadInput(f"{area} is in the way (not gradalign's, or a journal names it)")
        shutil.rmtree(area)
    area.mkdir(parents=True)
    (area / AREA_MARKER).write_bytes(_MARKER_TEXT)
    (area / _NEW).mkdir()
    (area / _OLD).mkdir()
    return area


def _empty_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and not any(path.iterdir())
    except OSError:
        return False


def _clear_dead_areas(parent: Path) -> None:
    """Private areas of set writers that died before their commit: never committed, removed.
    Only gradalign's own (marked, or empty: killed before the marker), and none that a journal
    still names (`recover_commits` finished those it could; the others are left as they are)."""
    for area in parent.glob(".set-*"):
        pid = area.name.removeprefix(".set-")
        if not pid.isdigit() or int(pid) == os.getpid() or process_alive(int(pid)):
            continue
        journal = parent / JOURNAL.format(pid=pid)
        if os.path.lexists(journal):
            continue
        if _is_area(area):
            shutil.rmtree(area, ignore_errors=True)
            journal.with_name(journal.name + ".tmp").unlink(missing_ok=True)  # cut short too
        elif _empty_dir(area):
            area.rmdir()
