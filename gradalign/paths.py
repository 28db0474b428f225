"""What a path names, as the commands that read or write it need to know."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from .errors import BadInput

_DESCRIPTORS = re.compile(r"^/dev/(?:(stdout)|(stderr)|fd/(\d+))$|^/proc/self/fd/(\d+)$")


def descriptor(path: os.PathLike[str] | str) -> int | None:
    """The open file descriptor a path names as given (`/dev/stdout`, `/dev/fd/3`), else None:
    behind it may be a log the shell appends to (`--json /dev/stdout >> ci.log`), which is
    written into at the descriptor's place, never replaced nor reopened (truncated)."""
    match = _DESCRIPTORS.match(os.fspath(path))
    if match is None:
        return None
    return 1 if match[1] else 2 if match[2] else int(match[3] or match[4])


def is_stream(path: os.PathLike[str] | str) -> bool:
    """Whether `path` names something other than a regular file or a directory (a device, a
    pipe, a terminal, an open descriptor), following symbolic links: a report is written into
    it, never over it, and a config or golden file read from it might never end."""
    if descriptor(path) is not None:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


EMPTY_PATH = "an empty path names nothing (the current directory is '.'); give a path"
DASH_PATH = (
    "'-' would be a file or directory named '-', not standard input or output; give a path (a "
    "report to standard output: /dev/stdout; a file called '-': ./-)"
)


def nonempty(value: os.PathLike[str] | str, what: str) -> None:
    """Refuse "" as a path: pathlib (and the command line's Path options) turn it into ".", so a
    run or a report would silently land in, or be read from, the current directory."""
    if os.fspath(value) == "":
        raise BadInput(f"{what}: {EMPTY_PATH}")


def resolved(path: os.PathLike[str] | str) -> Path:
    """`Path.resolve()`, with a loop of symbolic links on the way as bad input (Python raises
    RuntimeError for it, an internal error to the command line, or OSError ELOOP)."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno != errno.ELOOP:
            raise
        raise BadInput(f"{path}: a loop of symbolic links; it names nothing") from None


def named(path: Path, what: str) -> Path:
    """`path` with a last component: "." or "./" as the directory it names (a run and its float64
    reference are named after it, NAME and NAME-fp64; "." made pathlib raise ValueError, an
    internal error), and the root directory refused."""
    if path.name:
        return path
    full = Path(os.path.abspath(path))
    if not full.name:
        raise BadInput(f"{what} {path}: the root directory cannot be a run; give one below it")
    return full


def process_alive(pid: int) -> bool:
    """Whether a process of that id exists (one of another user's counts: it may be writing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
