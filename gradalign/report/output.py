"""Writing report files: whole or not at all, and a command's reports as one set."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import ReportRefused
from ..paths import descriptor, is_stream, process_alive

_NAMES = itertools.count()
_SETS: list[list[tuple[Path, Path]]] = []  # the open sets: (temporary file, its final path)


@contextlib.contextmanager
def one_set() -> Iterator[None]:
    """Files written inside are renamed into place together at the end: a failure before the last
    (a full disk while the HTML report is written) leaves every earlier report as it was, never
    new JSON beside an old JUnit file. Renames take no space."""
    staged: list[tuple[Path, Path]] = []
    _SETS.append(staged)
    try:
        yield
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    finally:
        _SETS.remove(staged)
    for tmp, final in staged:
        tmp.replace(final)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write via a temporary name and rename: a reader never sees half a file. Missing parent
    directories are created (the checks before any work found a writable ancestor). A path that
    is not a regular file (`/dev/stdout`, a pipe, `/dev/null`) is written into as it is, and a
    symbolic link to a file is kept: the file it names is replaced."""
    if is_stream(path):
        try:
            fd = descriptor(path)
            if fd is not None:
                _write_to(fd, data)
                return
            with open(path, "wb") as stream:
                stream.write(data)
        except OSError as exc:
            raise ReportRefused(f"{path}: cannot write the report ({exc.strerror})") from None
        return
    path = Path(os.path.realpath(path))
    tmp = path.with_name(f".gradalign-{os.getpid()}-{next(_NAMES)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clear_dead_temporaries(path.parent)
        tmp.write_bytes(data)
        if _SETS:  # renamed with the rest of its set
            _SETS[-1].append((tmp, path))
            return
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ReportRefused(f"{path}: cannot write the report ({exc.strerror})") from None


def clear_dead_temporaries(folder: Path) -> None:
    """Remove the temporary report files of gradalign processes that died before renaming
    them into place (killed while writing): never a report, and nothing else reads them."""
    for tmp in folder.glob(".gradalign-*-*.tmp"):
        pid = tmp.name.split("-")[1]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _write_to(fd: int, data: bytes) -> None:
    """All of `data` at the descriptor's own place, after what Python buffered for it."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            if stream.fileno() == fd:
                stream.flush()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def printable(text: str) -> str:
    """Text that encodes as UTF-8: a file name that is not UTF-8 reaches Python as lone
    surrogates (PEP 383), which no report may hold; they are written as `\\udce9`."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c != 0x09}


def visible(text: str) -> str:
    """Text for the terminal with its control characters written as escapes (`\\x1b`): a run's
    path holding an ESC sequence recoloured or rewrote the terminal's title line."""
    return text.translate(_CONTROL)


def write_text_atomic(path: Path, text: str) -> None:
    """Text written whole or not at all (UTF-8; see `printable`)."""
    write_bytes_atomic(path, printable(text).encode("utf-8"))
