"""The streamed judge (judge/stream.py) over several processes: each owns a fixed share of the
tensors and judges them at every update, with its own files, threads and drift.

Threads of one process share the GIL, taken back after every numpy call of every slice: two of
them judged the 4 GB benchmark set 1.2-1.3x faster than one, where two one-thread processes did
1.8x the work of one in the same time (docs/PERFORMANCE.md, "Threads against processes"). So on
a machine with the cores, and runs large enough to pay for a fork, the judge forks before it
starts any thread; each child serves requests from the parent over a pipe (pickled between
this program's own processes, never read from a file), and is killed when the judge closes,
whatever it was doing: it holds nothing that outlives it (its drift files lie in a folder the
parent removes, or, where the parent was killed outright, the children on their pipe's end)."""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import sys
import warnings
from collections.abc import Callable
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

from ..errors import BadInput

# Elements an update of a run must hold for more processes to pay (docs/PERFORMANCE.md: an
# 8-update GPT of 0.9M parameters took 0.79 s in two processes against 0.93 s in one; the
# default MLP, 0.2M, 0.62 against 0.61 s)
SMALLEST = 1 << 19


def processes(cpus: int, elements: int) -> int:
    """How many processes judge: GRADALIGN_PROCESSES if set (1: this one alone), else `cpus`
    where the platform forks cleanly (Linux) and an update holds `SMALLEST` elements or more."""
    value = os.environ.get("GRADALIGN_PROCESSES", "")
    if value.isdigit() and int(value) > 0:
        return int(value) if hasattr(os, "fork") else 1
    if not sys.platform.startswith("linux") or elements < SMALLEST:
        return 1
    return cpus


def shares(sizes: dict[str, int], count: int) -> list[list[str]]:
    """The tensors (name: elements) dealt to `count` owners, largest first to the least loaded;
    each share in the order given, the lightest first (the parent's: it also judges the losses
    and the bookkeeping, and gathers the others'). Owners left with nothing are dropped."""
    loads = [0] * count
    owner: dict[str, int] = {}
    for name in sorted(sizes, key=lambda n: -sizes[n]):
        k = min(range(count), key=lambda j: (loads[j], j))
        owner[name] = k
        loads[k] += max(sizes[name], 1)
    dealt = [
        [n for n in sizes if owner[n] == k] for k in sorted(range(count), key=loads.__getitem__)
    ]
    return [share for share in dealt if share]


def published(shapes: dict[str, tuple], owner: dict[str, int]) -> set[str]:
    """The tensors whose drift another process may follow: those whose shape another process's
    tensor has (followers follow tensors of their shape, judge/followers.py)."""
    by_shape: dict[tuple, set[int]] = {}
    for name, shape in shapes.items():
        by_shape.setdefault(tuple(shape), set()).add(owner[name])
    return {n for n, shape in shapes.items() if len(by_shape[tuple(shape)]) > 1}


def folder_of(parent: str | None, k: int) -> str | None:
    """Process k's drift folder inside the judge's (None: a single process makes its own)."""
    return None if parent is None else os.path.join(parent, str(k))


def foreign_facts(
    follows: dict[str, list[str]], every: dict[str, tuple], owner: dict[str, int], k: int
) -> dict[str, tuple[str, dict[int, float]]]:
    """Of the tensors `follows` lists, those of other processes than k: their paths and sums."""
    found = {}
    for follow in follows.values():
        for other in follow:
            if owner[other] != k:
                _, path, sums = every[other]
                assert path is not None, f"{other}'s drift is not published"
                found[other] = (path, sums)
    return found


class Owners:
    """The child processes of one judge: child k (1, 2, ...) runs `serve(k, connection)`."""

    def __init__(self, count: int, serve: Callable[[int, Connection], None]) -> None:
        self.pids: list[int] = []
        self.conns: list[Connection] = []
        self.reaped: set[int] = set()  # children reaped as they were found dead (`_ended`)
        # no collection between a fork and the child's freeze (`_child`): garbage of the caller's
        # (a torch process group, say) must never be finalized in a child
        collecting = gc.isenabled()
        gc.disable()
        try:
            for k in range(1, count):
                ours, theirs = Pipe()
                with warnings.catch_warnings():  # Python 3.12+ warns of fork beside threads
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
                if pid == 0:
                    _child(k, theirs, [ours, *self.conns], serve, collecting)
                theirs.close()
                self.pids.append(pid)
                self.conns.append(ours)
        except BaseException:
            self.close()
            raise
        finally:
            if collecting:
                gc.enable()

    def send(self, request: tuple[str, tuple]) -> None:
        """The same request to every child."""
        self.send_each([request] * len(self.conns))

    def send_each(self, requests: list[tuple[str, tuple]]) -> None:
        """Its own request to each child, in order."""
        for pid, conn, request in zip(self.pids, self.conns, requests, strict=True):
            try:
                conn.send(request)
            except OSError:  # its end closed: it died, maybe with word of why
                with contextlib.suppress(EOFError, OSError):
                    status, value = conn.recv() if conn.poll(0) else ("", None)
                    if status == "error":
                        raise value from None
                raise self._ended(pid) from None

    def replies(self) -> list[Any]:
        """Each child's reply to the last request, in order; a child's error raised here."""
        found = []
        for pid, conn in zip(self.pids, self.conns, strict=True):
            try:
                status, value = conn.recv()
            except (EOFError, OSError):
                raise self._ended(pid) from None
            if status == "error":
                raise value
            found.append(value)
        return found

    def close(self) -> None:
        """Kill the children (nothing they hold outlives them) and reap them."""
        living = [pid for pid in self.pids if pid not in self.reaped]  # a reaped pid may be reused
        for pid in living:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in living:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for conn in self.conns:
            conn.close()
        self.pids, self.conns = [], []

    def _ended(self, pid: int) -> Exception:
        """The error for child `pid`, whose pipe ended, reaped here (`_how`)."""
        with contextlib.suppress(ChildProcessError):  # (reaped already: nothing more to say)
            _, status = os.waitpid(pid, 0)
            self.reaped.add(pid)
            return _how(pid, status)
        return RuntimeError(f"a judge process (pid {pid}) ended unexpectedly")


def _how(pid: int, status: int) -> Exception:
    """How child `pid` ended, by its wait status. Killed by SIGKILL, as the system kills a
    process when memory runs out, it is the machine's limit (the command says so in one line, as
    of its own MemoryError); anything else is a bug."""
    how = "ended unexpectedly"
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        if name == "SIGKILL":
            return BadInput(
                f"a judge process (pid {pid}) was killed by SIGKILL, as the system does when it "
                "runs out of memory: free memory, or set GRADALIGN_PROCESSES=1 to judge in one "
                "process"
            )
        how += f", killed by {name}"
    elif os.WIFEXITED(status):
        how += f" with exit status {os.WEXITSTATUS(status)}"
    return RuntimeError(f"a judge process (pid {pid}) {how}")


_KEPT: list[Any] = []  # in a child: what the parent held that must not be finalized there


def _child(
    k: int,
    conn: Connection,
    inherited: list[Connection],
    serve: Callable[[int, Connection], None],
    collecting: bool,
) -> None:
    """In the child: serve the parent, then leave without running the parent's exit code. Of
    what the parent held, nothing is finalized here: the objects it tracked are frozen out of
    collection (a child that collected garbage the parent had left aborted in a destructor), its
    streams are kept (their buffers would be flushed twice), and no handler of its signals runs."""
    code = 0
    try:
        gc.freeze()
        if collecting:
            gc.enable()
        _KEPT.extend((sys.stdout, sys.stderr))
        for number in signal.valid_signals():  # the caller's handlers (a checkpoint on
            if callable(signal.getsignal(number)):  # SIGUSR1, say) are not the child's to run
                signal.signal(number, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the command's handler: just end
        # the parent's streams may have been locked by another thread (a progress display) as
        # it forked: a child that wrote to them, even a warning, would wait forever
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (kept to the end)
        warnings.simplefilter("ignore")
        for other in inherited:
            other.close()  # the parent's ends to other children: their EOF is the parent's
        serve(k, conn)
    except BaseException as exc:
        code = 1
        with contextlib.suppress(BaseException):  # the parent raises it as this child's reply
            conn.send(("error", portable(exc)))
    finally:
        os._exit(code)


def answer(conn: Connection, handle: Callable[[str, tuple], Any]) -> None:
    """Answer requests (a method's name and its arguments) until the parent closes the pipe."""
    while True:
        try:
            name, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[str, Any] = ("ok", handle(name, args))
        except BaseException as exc:
            reply = ("error", portable(exc))
        conn.send(reply)


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc
