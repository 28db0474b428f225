"""The side of the streamed judge (judge/stream.py) a child process runs (judge/owners.py): at
each update the parent asks for, it judges its share of the tensors with its own files, thread
and drift, and answers with their outcomes and what its drift lets the others follow; then, when
asked, it judges some of them again (net of a weight term, or following another's drift)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .drift_files import DriftFiles
from .owners import answer, folder_of, portable
from .update_files import gradient_names
from .weight_term import Sums


class ChildSide:
    """StreamJudge's methods for a child process (they use its state: files, drift, tensors)."""

    def _serve(self, k: int, share: list[str], conn: Any) -> None:
        """In child k: judge `share` at each update the parent asks for."""
        self.own, self.owners = share, None
        self.drift = DriftFiles(folder_of(self.folder, k), self.drift.published)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="gradalign-judge")
        self.next = None
        self._ahead(0)
        try:
            answer(conn, lambda name, args: getattr(self, name)(*args))
        finally:
            # the parent kills its children before it closes their pipes: a pipe that ended
            # means the parent died first (SIGKILL), and left the judge's drift folder behind
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)

    def child_judge(self, i: int, grad_atol: float, floor16: float, apart: bool) -> tuple:
        """Update i's tensors of this child (`_judge_own`), with the parent's tolerances (and
        whether the runs entered update i apart: `apart.passes`)."""
        if self.current is not None:
            self.current.close()
            self.current = None
        files = self.current = self._take(i)
        self.grad_atol, self.floor16, self.apart = grad_atol, floor16, apart
        self.current_grads = set(gradient_names(files, self.names))
        found, failure = self._judge_own(files, self.current_grads)
        if failure is not None:
            failure = (failure[0], portable(failure[1]))
        return found, failure, self.drift.facts(self.own)

    def child_net(self, redo: dict[str, Sums], c: float) -> tuple:
        """`_net_of_weights`' second judgement of this child's tensors in `redo`."""
        assert self.current is not None
        files, grads = self.current, self.current_grads
        found = {n: self._tensor(n, files, grads, netting=(c, s)) for n, s in redo.items()}
        return found, self.drift.facts(self.own)

    def child_follow(self, follows: dict[str, list[str]], foreign: dict) -> dict[str, Any]:
        """`_follow`'s judgement of this child's followers."""
        assert self.current is not None
        self.drift.follow(foreign)
        files, grads = self.current, self.current_grads
        return {n: self._tensor(n, files, grads, f) for n, f in follows.items()}
