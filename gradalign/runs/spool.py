"""A background worker for the slow half of recording: jobs (encode and write a file, hash it,
summarize tensors) run in order on one thread, off the training loop.

Memory is bounded: a job states the bytes it holds, and `submit` waits while the jobs queued
hold more than `limit` bytes (one job is always admitted). The first error a job raises is kept;
later jobs are skipped, and the error is raised on the caller's thread by the next `submit`,
`drain` or `check`, so a failed write never passes silently. `abort` stops after the job running
now and drops the rest; what a job holds is released through its `cleanup`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_LIMIT = 512 << 20


@dataclass
class _Job:
    run: Callable[[], None]
    nbytes: int
    cleanup: Callable[[], None] | None


class Spool:
    """Runs jobs in submission order on one daemon thread."""

    def __init__(self, limit: int = DEFAULT_LIMIT, name: str = "gradalign-spool") -> None:
        self.limit, self.name = limit, name
        self._jobs: deque[_Job] = deque()
        self._cv = threading.Condition()
        self._held = 0  # bytes held by queued and running jobs
        self._busy = False
        self._error: BaseException | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None

    def submit(
        self,
        job: Callable[[], None],
        nbytes: int = 0,
        cleanup: Callable[[], None] | None = None,
    ) -> None:
        """Queue `job`; waits while the queue holds more than `limit` bytes."""
        with self._cv:
            while self._held and self._held + nbytes > self.limit and self._error is None:
                self._cv.wait()
            self._raise()
            if self._stopping:
                raise RuntimeError("the spool is closed")
            self._jobs.append(_Job(job, nbytes, cleanup))
            self._held += nbytes
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def drain(self) -> None:
        """Wait until every queued job has run; raise the first error one raised."""
        with self._cv:
            while (self._jobs or self._busy) and self._error is None:
                self._cv.wait()
            self._raise()

    def check(self) -> None:
        """Raise the first error a job raised, if any."""
        with self._cv:
            self._raise()

    def close(self) -> None:
        """Drain, then stop the thread."""
        try:
            self.drain()
        finally:
            self.abort()

    def abort(self) -> None:
        """Stop after the running job; queued jobs are dropped (their cleanup runs)."""
        with self._cv:
            self._stopping = True
            dropped = list(self._jobs)
            self._jobs.clear()
            self._cv.notify_all()
        for job in dropped:
            if job.cleanup is not None:
                job.cleanup()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._stopping:
                    self._cv.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                self._busy = True
                failed = self._error is not None
            try:
                if not failed:
                    job.run()
            except BaseException as exc:  # surfaced on the caller's thread
                with self._cv:
                    if self._error is None:
                        self._error = exc
            finally:
                try:
                    if job.cleanup is not None:
                        job.cleanup()
                except BaseException as exc:
                    with self._cv:
                        self._error = self._error or exc
                with self._cv:
                    self._busy = False
                    self._held -= job.nbytes
                    self._cv.notify_all()
