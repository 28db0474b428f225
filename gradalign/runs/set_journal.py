"""Putting a set of runs in place under a journal, and finishing what a kill cut short: the
commit protocol of `RunSet` (runs/runset.py). Recovery acts only on what gradalign itself made."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput
from .layout import JOURNAL, MANIFEST, is_run_dir
from .locks import RunLock, held_here
from .writer import _exchange, _write_atomic, foreign_entries

# -- putting a set in place, and finishing what a kill cut short ----------------------------------
#
# A set's private area `parent/.set-PID` holds gradalign's marker file, `new/NAME` (the recorded
# runs) and `old/NAME` (the runs they replace, moved there whole before anything deletes them).
# The journal `parent/.gradalign-commit-PID.json` names the area and, per member, the identity of
# its new run: the recorded directory's inode (a rename keeps it) and its manifest's SHA-256. So
# whoever finds the journal tells by looking which run stands at each path, never by where a
# step might have stopped. Its phase says whether the replaced runs may still be needed ("swap")
# or are being deleted ("done").

_NEW, _OLD = "new", "old"
AREA_MARKER = "gradalign-set"
_MARKER_TEXT = b"gradalign: runs recorded together, put in place together (runs/runset.py)\n"
JOURNAL_VERSION = 2
_SWAP, _DONE = "swap", "done"
_MAX_JOURNAL = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
_COMMITTING: set[Path] = set()  # journals this process is acting on right now

Identity = tuple[int, str]  # a new run's directory inode and its manifest's SHA-256


@dataclass(frozen=True)
class _Plan:
    """A journal, checked: the area, each member's new-run identity, the phase."""

    area: Path
    members: dict[str, Identity]
    phase: str


def _commit(parent: Path, area: Path, members: dict[str, Identity], journal: Path) -> None:
    """Put the recorded set in place. The journal, written first, is the commit point: from then
    on the set goes in whole, by this process or by whoever finds the journal after a kill
    (every new run is complete and stays so; every replaced one stays whole until all are in)."""
    _write_journal(journal, area, members, _SWAP)
    placed: list[str] = []
    try:
        for name, identity in members.items():
            placed.append(name)
            _place(parent, area, name, identity)
    except OSError:  # a rename refused (not a kill): undo, so nobody rolls a failure forward
        if _roll_back(parent, area, {n: members[n] for n in reversed(placed)}):
            journal.unlink(missing_ok=True)
        raise
    _write_journal(journal, area, members, _DONE)  # now, and only now, the old runs may go
    _discard(area, journal)


def _roll_back(parent: Path, area: Path, members: dict[str, Identity]) -> bool:
    """Put back the runs that `_place` replaced (or began to), newest first; False where a
    rename fails again (the journal then stays, and the set goes in as after a kill)."""
    try:
        for name, identity in members.items():
            final, staged, trash = parent / name, area / _NEW / name, area / _OLD / name
            if _holds(final, identity):
                if os.path.lexists(staged):  # exchanged: the earlier run waits where it stood
                    if not _exchange(staged, final):
                        return False
                    continue
                os.rename(final, staged)
            if not os.path.lexists(final) and os.path.lexists(trash):
                os.rename(trash, final)
    except OSError:
        return False
    return True


def _place(parent: Path, area: Path, name: str, identity: Identity) -> None:
    """Move member `name`'s new run to its path, the run there into `old/`; renames only."""
    final, staged, trash = parent / name, area / _NEW / name, area / _OLD / name
    if _holds(final, identity):
        return  # in place already (what stands at `staged` now is the replaced run, whole)
    if not os.path.lexists(final):
        os.rename(staged, final)
    elif _exchange(staged, final):  # readers of `final` see one run or the other, never none
        os.rename(staged, trash)
    else:  # two renames: a kill between them leaves `final` absent, the old run in `old/`
        os.rename(final, trash)
        os.rename(staged, final)


def _discard(area: Path, journal: Path) -> None:
    """Delete the replaced runs, then the journal, then the area (its marker last), so a kill
    at any point leaves either the journal with its area or an area the next writer clears."""
    for part in (_OLD, _NEW):
        shutil.rmtree(area / part, ignore_errors=True)
    if os.path.lexists(area / _OLD) or os.path.lexists(area / _NEW):
        return  # could not delete them all: the journal stays, and the next process retries
    journal.unlink(missing_ok=True)
    shutil.rmtree(area, ignore_errors=True)


def _identity(run: Path) -> Identity:
    """The identity the journal records for a new run (OSError where there is none)."""
    digest = hashlib.sha256((run / MANIFEST).read_bytes()).hexdigest()
    return os.lstat(run).st_ino, digest


def _holds(path: Path, identity: Identity) -> bool:
    """Whether the directory at `path` (not a link) is the new run of that identity."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and _identity(path) == identity
    except OSError:
        return False


def _write_journal(journal: Path, area: Path, members: dict[str, Identity], phase: str) -> None:
    body = {
        "version": JOURNAL_VERSION,
        "area": area.name,
        "phase": phase,
        "members": {n: {"inode": ino, "manifest": sha} for n, (ino, sha) in members.items()},
    }
    _write_atomic(journal, json.dumps(body, indent=1).encode(), durable=True)


def recover_commits(parent: Path) -> None:
    """Finish the set commits that killed processes left in `parent`: every member's new run is
    put in place (roll forward), then the replaced runs are deleted.

    Only a journal that is gradalign's own in every detail is acted on (`_read_plan`); any other
    (another version's, hand-made, hostile) is ignored, and nothing is moved or deleted for it.
    Runs move only between the journal's own area and the paths of its members, and a path is
    replaced only when it holds a gradalign run, as at the commit. A commit whose member locks a
    live process holds is left to it: its writer, or another recovery. One that cannot be
    finished (a new run moved away by hand) is refused with BadInput, nothing changed."""
    for journal in sorted(parent.glob(JOURNAL.format(pid="*"))):
        if journal.absolute() in _COMMITTING:
            continue
        plan = _read_plan(parent, journal)
        taken = None if plan is None else _take_locks(parent, list(plan.members))
        if plan is None or taken is None:
            continue
        try:
            if _read_plan(parent, journal) == plan:  # nobody finished it before we got the locks
                _finish(parent, journal, plan)
        finally:
            for lock in taken:
                lock.release()


def _read_plan(parent: Path, journal: Path) -> _Plan | None:
    """The journal's plan if gradalign wrote it: this version, an area named `.set-PID` for the
    journal's own PID that is a directory (not a link) holding gradalign's marker, members that
    are plain names with well-formed identities. Else None."""
    head, tail = JOURNAL.split("{pid}")
    pid = journal.name.removeprefix(head).removesuffix(tail)
    try:
        info = os.lstat(journal)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_JOURNAL:
            return None
        body = json.loads(journal.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not pid.isdigit() or not isinstance(body, dict) or body.get("version") != JOURNAL_VERSION:
        return None
    if body.get("area") != f".set-{pid}" or body.get("phase") not in (_SWAP, _DONE):
        return None
    members, area = _members(body.get("members")), parent / body["area"]
    if members is None or not _is_area(area):
        return None
    return _Plan(area, members, body["phase"])


def _members(raw: object) -> dict[str, Identity] | None:
    """A journal's members, each a plain name with an inode and a SHA-256; else None."""
    if not isinstance(raw, dict) or not raw:
        return None
    members = {}
    for name, ident in raw.items():
        if not _plain_name(name) or not isinstance(ident, dict):
            return None
        inode, digest = ident.get("inode"), ident.get("manifest")
        if type(inode) is not int or not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            return None
        members[name] = (inode, digest)
    return members


def _plain_name(name: object) -> bool:
    """One path component naming an entry of its directory: no separator, not "." or ".."."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in ("/", "\0", os.sep, os.altsep or "/"))
    )


def _is_area(area: Path) -> bool:
    """Whether `area` is a set's private area: a directory (not a link) with gradalign's marker."""
    try:
        marker = area / AREA_MARKER
        if not stat.S_ISDIR(os.lstat(area).st_mode) or not stat.S_ISREG(os.lstat(marker).st_mode):
            return False
        return marker.read_bytes() == _MARKER_TEXT
    except OSError:
        return False


def _take_locks(parent: Path, names: list[str]) -> list[RunLock] | None:
    """The members' locks that this process does not hold yet; None (and none kept) when a live
    process holds one: the kernel frees a killed writer's locks, so a free set means it died."""
    taken: list[RunLock] = []
    for name in names:
        if held_here(parent / name):
            continue
        lock = RunLock(parent / name)
        if not lock.try_acquire():
            for held in taken:
                held.release()
            return None
        taken.append(lock)
    return taken


def _finish(parent: Path, journal: Path, plan: _Plan) -> None:
    """Roll the commit forward from whatever step it stopped at, then clear it away."""
    if plan.phase == _SWAP:
        _check_finishable(parent, journal, plan)
        for name, identity in plan.members.items():
            _place(parent, plan.area, name, identity)
        _write_journal(journal, plan.area, plan.members, _DONE)
    _discard(plan.area, journal)


def _check_finishable(parent: Path, journal: Path, plan: _Plan) -> None:
    """Every member's new run is in place or in the area, and each path it goes to holds a
    gradalign run (or nothing); else BadInput, before anything moves."""
    for name, identity in plan.members.items():
        final = parent / name
        if _holds(final, identity):
            continue
        if not _holds(plan.area / _NEW / name, identity):
            why = f"the new {name} is neither at {final} nor in {plan.area}"
        elif not _replaceable(final):
            why = f"{final} holds something other than a gradalign run now"
        else:
            continue
        raise BadInput(
            f"{parent}: a gradalign process was killed while putting runs in place, and this "
            f"cannot be finished: {why}; nothing was changed. Put it back, or remove "
            f"{journal.name} to leave the runs as they are"
        )


def _replaceable(final: Path) -> bool:
    """Nothing, or a gradalign run holding none of the user's files (as `ensure_writable`)."""
    if not os.path.lexists(final):
        return True
    if final.is_symlink() or not is_run_dir(final):
        return False
    return not foreign_entries(final)
