"""One writer per run path: an exclusive lock held while a process writes a run there.

The lock is `PARENT/.NAME.lock`, locked with `flock` and holding the writer's pid for messages.
The kernel releases it when the process dies, however it dies, so a lock left by a killed
process is stale by construction and the next writer takes it over. Released locks are unlinked
(safely: a taker checks that the file it locked is still the one at the path).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from ..errors import BadInput

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: one writer per path is not enforced
    fcntl = None  # type: ignore[assignment]


_HELD: set[Path] = set()  # lock files this process holds


def lock_path(run: Path) -> Path:
    return run.parent / f".{run.name}.lock"


def held_here(run: str | os.PathLike[str]) -> bool:
    """Whether this process holds the lock on writing `run` already."""
    return lock_path(Path(run)).absolute() in _HELD


class RunLock:
    """An exclusive, non-blocking lock on writing the run at `run`."""

    def __init__(self, run: str | os.PathLike[str]) -> None:
        self.run = Path(run)
        self.path = lock_path(self.run)
        self._fd: int | None = None
        self.holder: int | None = None  # who held it when `try_acquire` found it taken

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock, or raise BadInput naming the process that holds it."""
        if self.try_acquire():
            return self
        if self.holder == os.getpid():
            raise BadInput(
                f"{self.run} is being written already by this process (a Recorder not "
                "yet closed?); close that one first or choose another output"
            )
        raise BadInput(
            f"{self.run} is being written by another gradalign process"
            + (f" (pid {self.holder})" if self.holder else "")
            + "; wait for it or choose another output"
        )

    def wait(self) -> RunLock:
        """Take the lock, waiting while another process holds it (its work then done first)."""
        self.try_acquire(block=True)
        return self

    def try_acquire(self, block: bool = False) -> bool:
        """Take the lock if no open file holds it (this process's own included); else False,
        with `holder` the pid written in it (`block`: wait for it instead). A lock that is free
        means its writer is gone, even where its pid now names another process (pids are
        reused, in containers soon)."""
        if self.held:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = self._open()
            if fcntl is None:
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
            except OSError:
                self.holder = _read_pid(fd)
                os.close(fd)
                return False
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the previous holder unlinked it after we opened it: take the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        _HELD.add(self.path.absolute())
        return True

    def _open(self) -> int:
        """The lock file, created where absent; never through a link, nor anything but a
        regular file (a link committed beside a golden file had its target's content
        replaced by a pid; a directory or a pipe there was an internal error)."""
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # not the file: its folder
                raise BadInput(
                    f"cannot write in {self.path.parent} ({exc.strerror}), where {self.run} "
                    "takes its lock; choose another output or make that folder writable"
                ) from None
            fd = None
        if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        if fd is not None:
            os.close(fd)
        raise BadInput(
            f"{self.path} (the lock on writing {self.run}) is not a lock file this tool made (a "
            "link, a folder or a pipe); remove it, or choose another output"
        )

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)  # closing releases the flock
        self._fd = None
        _HELD.discard(self.path.absolute())

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text.isdigit() else None
    except (OSError, UnicodeDecodeError):
        return None
