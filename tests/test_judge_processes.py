"""The streamed judge over several processes (judge/owners.py): each owns a share of the tensors,
and every number, message and refusal is the one a single process gives, where a follower and
the tensor it follows lie in different processes, where gradients are judged net of a weight
term, and where a child's tensor is refused. Children are reaped and their drift files removed,
whatever ends the judge; a child that dies is an error, not a hang."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import signal
import struct
import sys
import time

import pytest

from gradalign.errors import BadInput
from gradalign.judge import owners, stream
from gradalign.judge.compare import compare
from gradalign.judge.owners import processes, published, shares
from gradalign.runs.reader import read_run_dir

from . import test_followers, test_weight_term


def _facts(c) -> str:
    """Everything a comparison says, as text (NaN equals NaN)."""
    results = [
        (
            r.update,
            [dataclasses.asdict(d) for d in r.weights + r.grads],
            r.grad_ratio,
            r.grad_cosine,
        )
        for r in c.results
    ]
    codes = [d.code for d in c.diagnosis]
    return repr((c.verdict, c.first_divergence, codes, c.notes, results))


def _requests_late(monkeypatch) -> None:
    """Each request to the children sent half a second late (they may have ended by then)."""
    send = owners.Owners.send_each

    def after_a_while(self, requests):
        time.sleep(0.5)
        return send(self, requests)

    monkeypatch.setattr(owners.Owners, "send_each", after_a_while)


def _judged(monkeypatch, count: int, base, merged, reference=None):
    monkeypatch.setenv("GRADALIGN_PROCESSES", str(count))
    return compare(base, merged, reference=reference, streaming=True)


def _owner(run, count: int, dealt=shares) -> dict[str, int]:
    sizes = {t.name: math.prod(t.shape) for t in run.tensors}
    return {n: k for k, share in enumerate(dealt(sizes, count)) for n in share}


def test_tensors_are_dealt_largest_first_to_the_least_loaded():
    assert shares({"a": 10, "b": 6, "c": 5, "d": 1}, 2) == [["a", "d"], ["b", "c"]]
    assert shares({"a": 1, "b": 0}, 3) == [["a"], ["b"]]  # none left empty


def test_a_drift_another_process_may_follow_is_published():
    """Followers follow tensors of their shape: where two processes hold tensors of one shape,
    each of those keeps its drift in a file the other reads."""
    shapes = {"a": (2, 3), "b": (2, 3), "c": (4,), "d": (4,), "e": (5,)}
    assert published(shapes, {"a": 0, "b": 1, "c": 0, "d": 0, "e": 1}) == {"a", "b"}
    assert published(shapes, dict.fromkeys(shapes, 0)) == set()


def test_how_many_processes(monkeypatch):
    monkeypatch.delenv("GRADALIGN_PROCESSES", raising=False)
    linux = sys.platform.startswith("linux")
    assert processes(4, owners.SMALLEST) == (4 if linux else 1)
    assert processes(4, owners.SMALLEST - 1) == 1  # too small to pay for a fork
    monkeypatch.setenv("GRADALIGN_PROCESSES", "3")
    assert processes(1, 10) == 3
    monkeypatch.setenv("GRADALIGN_PROCESSES", "1")
    assert processes(4, 1 << 30) == 1


@pytest.fixture(scope="module")
def follow_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("follow")
    test_followers._record(root / "ref", 1, float64=True)
    test_followers._record(root / "base", 1, reference="../ref")
    test_followers._record(root / "merged", test_followers.K)
    test_followers._record(root / "per-micro", test_followers.K, per_micro=True)
    runs = {n: read_run_dir(root / n) for n in ("ref", "base", "merged", "per-micro")}
    return {**runs, "root": root}


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("merged", ["merged", "per-micro"])
@pytest.mark.parametrize("referenced", [True, False])
def test_followers_of_another_process_judge_alike(
    follow_runs, monkeypatch, count, merged, referenced
):
    base, ref = follow_runs["base"], follow_runs["ref"] if referenced else None
    owner = _owner(base, count)
    followed = [t.name for t in base.tensors if t.kind == "param"]
    crossing = [n for n in followed if owner[n] != owner["ema_" + n.replace(".", "_")]]
    assert crossing  # some EMA follows a tensor whose drift another process keeps
    one = _judged(monkeypatch, 1, base, follow_runs[merged], ref)
    assert one.verdict == ("pass" if merged == "merged" else "fail")
    assert _facts(_judged(monkeypatch, count, base, follow_runs[merged], ref)) == _facts(one)


@pytest.fixture(scope="module")
def netted_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("netted")
    made = {
        "base": test_weight_term._record(root / "base", 1),
        "merged": test_weight_term._record(root / "merged", test_weight_term.K),
        "penalty-k": test_weight_term._record(
            root / "penalty-k", test_weight_term.K, penalty_k_times=True
        ),
    }
    return {n: read_run_dir(p) for n, p in made.items()}


@pytest.mark.parametrize("merged", ["merged", "penalty-k"])
def test_gradients_judged_net_of_a_weight_term_alike(netted_runs, monkeypatch, merged):
    base = netted_runs["base"]
    one = _judged(monkeypatch, 1, base, netted_runs[merged])
    netted = {d.name for r in one.results for d in r.grads if d.netted > 0}
    assert bool(netted) == (merged == "merged")  # the clean pair passes net of the penalty
    in_children = set()
    for count in (2, 3):
        for dealt in (shares, lambda sizes, count: shares(sizes, count)[::-1]):
            monkeypatch.setattr(stream, "shares", dealt)  # any dealing: the same numbers
            in_children |= {n for n in netted if _owner(base, count, dealt)[n] != 0}
            assert _facts(_judged(monkeypatch, count, base, netted_runs[merged])) == _facts(one)
    assert in_children == netted  # judged again in a child, for some dealing


def _alter(file, name: str) -> None:
    """Change one value of tensor `name` in a safetensors file, in place."""
    data = bytearray(file.read_bytes())
    (size,) = struct.unpack("<Q", data[:8])
    start, _ = json.loads(data[8 : 8 + size])[name]["data_offsets"]
    data[8 + size + start] ^= 0x40
    file.write_bytes(bytes(data))


def test_a_tensor_of_a_child_refused_alike(follow_runs, tmp_path, monkeypatch):
    import shutil

    for run in ("base", "merged", "ref"):
        shutil.copytree(follow_runs["root"] / run, tmp_path / run)
    owner = _owner(follow_runs["base"], 2)
    name = next(n for n in ("head.weight", "ema_head_weight", "conv.weight") if owner[n] == 1)
    kinds = {t.name: t.kind for t in follow_runs["base"].tensors}
    grads = "grads" if kinds[name] == "param" else "weights"
    _alter(tmp_path / "merged" / grads / "update_000003.safetensors", name)
    base, merged = read_run_dir(tmp_path / "base"), read_run_dir(tmp_path / "merged")
    refused = []
    for count in (1, 2):
        with pytest.raises(BadInput) as caught:
            _judged(monkeypatch, count, base, merged, read_run_dir(tmp_path / "ref"))
        refused.append(str(caught.value))
    assert refused[0] == refused[1] and name in refused[0] and "update_000003" in refused[0]


def _watched(monkeypatch) -> tuple[list[int], list[str]]:
    """The children's pids and the drift folders made, as the judge makes them."""
    pids: list[int] = []
    folders: list[str] = []
    start, mkdtemp = owners.Owners.__init__, stream.tempfile.mkdtemp

    def started(self, count, serve):
        start(self, count, serve)
        pids.extend(self.pids)

    monkeypatch.setattr(owners.Owners, "__init__", started)
    monkeypatch.setattr(
        stream.tempfile, "mkdtemp", lambda **kw: folders.append(mkdtemp(**kw)) or folders[-1]
    )
    return pids, folders


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _ended(pid: int) -> bool:
    """Gone, or a zombie: an orphan is reaped by whoever adopts it, which may take its time."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return _gone(pid)


def test_children_are_reaped_and_their_files_removed(follow_runs, monkeypatch):
    pids, folders = _watched(monkeypatch)
    runs = follow_runs
    _judged(monkeypatch, 3, runs["base"], runs["merged"], runs["ref"])
    assert len(pids) == 2 and folders
    assert all(_gone(pid) for pid in pids)
    assert not any(os.path.exists(folder) for folder in folders)


def test_an_interrupted_judge_leaves_no_child_and_no_file(follow_runs, monkeypatch):
    pids, folders = _watched(monkeypatch)
    judge_own = stream.StreamJudge._judge_own

    def interrupted(self, files, grads):
        if self.owners is not None and files.update == 2:  # the parent, at update 2
            raise KeyboardInterrupt
        return judge_own(self, files, grads)

    monkeypatch.setattr(stream.StreamJudge, "_judge_own", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _judged(monkeypatch, 2, follow_runs["base"], follow_runs["merged"], follow_runs["ref"])
    assert pids and all(_gone(pid) for pid in pids)
    assert folders and not any(os.path.exists(folder) for folder in folders)


def test_a_child_that_dies_is_an_error_that_says_how(follow_runs, monkeypatch):
    pids, _ = _watched(monkeypatch)
    monkeypatch.setattr(stream.StreamJudge, "child_judge", lambda self, *args: os._exit(3))
    with pytest.raises(
        RuntimeError, match=r"judge process .* ended unexpectedly with exit status 3"
    ):
        _judged(monkeypatch, 2, follow_runs["base"], follow_runs["merged"], follow_runs["ref"])
    assert pids and all(_gone(pid) for pid in pids)


@pytest.mark.parametrize("name", ["SIGKILL", "SIGABRT"])
def test_a_child_killed_by_a_signal_is_named_so(follow_runs, monkeypatch, name):
    """The system's out-of-memory killer sends SIGKILL: the machine's limit, said with what to
    do; any other signal (an abort) is a bug, named."""

    def killed(self, *args):
        signal.signal(signal.SIGABRT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.Signals[name])

    monkeypatch.setattr(stream.StreamJudge, "child_judge", killed)
    expected = (
        (
            BadInput,
            r"killed by SIGKILL, as the system does when it runs out of memory: .*"
            r"GRADALIGN_PROCESSES=1",
        )
        if name == "SIGKILL"
        else (RuntimeError, r"ended unexpectedly, killed by SIGABRT")
    )
    with pytest.raises(expected[0], match=expected[1]):
        _judged(monkeypatch, 2, follow_runs["base"], follow_runs["merged"], follow_runs["ref"])


@pytest.mark.parametrize("late", [False, True])
def test_a_child_that_fails_before_its_first_request_sends_its_error(
    follow_runs, monkeypatch, late
):
    """A child's error outside any request (its first files unreadable, say) reaches the parent
    as that error, whether the parent's next request finds the child alive or gone (`late`)."""

    def failed(self, k, share, conn):
        raise BadInput(f"{share[0]}: unreadable in process {k}")

    monkeypatch.setattr(stream.StreamJudge, "_serve", failed)
    if late:  # the child has ended before the parent sends it anything
        _requests_late(monkeypatch)
    with pytest.raises(BadInput, match=r"unreadable in process 1"):
        _judged(monkeypatch, 2, follow_runs["base"], follow_runs["merged"], follow_runs["ref"])


def test_a_system_that_cannot_fork_judges_in_one_process(follow_runs, monkeypatch):
    def refused():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    runs = follow_runs
    one = _judged(monkeypatch, 1, runs["base"], runs["per-micro"], runs["ref"])
    monkeypatch.setattr(owners.os, "fork", refused)
    _, folders = _watched(monkeypatch)
    assert _facts(_judged(monkeypatch, 2, runs["base"], runs["per-micro"], runs["ref"])) == _facts(
        one
    )
    assert folders and not any(os.path.exists(folder) for folder in folders)


def test_the_command_writes_the_same_bytes_in_one_process_or_two(follow_runs, tmp_path):
    """`gradalign compare` as a user runs it: the same JSON report, and the command ends (its
    children killed and reaped at the judge's close, before the exit)."""
    import subprocess

    root = follow_runs["root"]
    written = []
    for count in ("1", "2"):
        out = tmp_path / f"report-{count}.json"
        env = {**os.environ, "GRADALIGN_PROCESSES": count}
        args = ["compare", str(root / "base"), str(root / "per-micro"), "--json", str(out)]
        done = subprocess.run(
            [sys.executable, "-m", "gradalign", *args], env=env, capture_output=True, timeout=120
        )
        assert done.returncode == 1, done.stderr  # the EMA written inside the window fails
        written.append(out.read_bytes())
    assert written[0] == written[1]


HELD_STDERR = r"""
import sys, threading, time, warnings
from gradalign.judge import stream
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

def warned(self, *args):
    warnings.warn("a warning in the child", UserWarning)
    return judge(self, *args)

judge, stream.StreamJudge.child_judge = stream.StreamJudge.child_judge, warned
base = read_run_dir(sys.argv[1])
ref = read_run_dir(base.reference)
merged = read_run_dir(sys.argv[2])
threading.Thread(target=lambda: sys.stderr.write("x" * (1 << 20)), daemon=True).start()
time.sleep(0.5)  # that thread now holds stderr, blocked on a pipe nobody reads
print(compare(base, merged, reference=ref, streaming=True).verdict, flush=True)
"""


def test_a_child_never_waits_for_a_stream_locked_as_it_forked(follow_runs):
    """A thread of the parent (a progress display) may hold stderr's lock as the judge forks:
    a child that then warned waited for it forever, and the parent for the child."""
    import select
    import subprocess

    root = follow_runs["root"]
    env = {**os.environ, "GRADALIGN_PROCESSES": "2"}
    with subprocess.Popen(
        [sys.executable, "-c", HELD_STDERR, str(root / "base"), str(root / "merged")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:  # stderr is never read: its writer stays blocked
            ready, _, _ = select.select([process.stdout], [], [], 60)
            line = process.stdout.readline() if ready else "(no verdict in 60 s)"
        finally:
            process.kill()
    assert line.strip() == "pass"


KILLED_PARENT = r"""
import os, signal, sys
from gradalign.judge import stream
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

def killed(self, files, grads):
    if self.owners is not None and files.update == 2:  # the parent, at update 2
        print(self.folder, *self.owners.pids, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return judge(self, files, grads)

judge, stream.StreamJudge._judge_own = stream.StreamJudge._judge_own, killed
base = read_run_dir(sys.argv[1])
compare(base, read_run_dir(sys.argv[2]), reference=read_run_dir(base.reference), streaming=True)
"""


def test_a_parent_killed_outright_leaves_no_child_and_no_file(follow_runs):
    """SIGKILL runs none of the parent's cleanup: its children see their pipe end, remove the
    judge's drift folder and exit."""
    import subprocess

    root = follow_runs["root"]
    env = {**os.environ, "GRADALIGN_PROCESSES": "3"}
    done = subprocess.run(
        [sys.executable, "-c", KILLED_PARENT, str(root / "base"), str(root / "merged")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr
    folder, *pids = done.stdout.split()
    assert len(pids) == 2 and os.path.basename(folder).startswith("gradalign-drift-")
    children = [int(pid) for pid in pids]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(map(_ended, children)):
        time.sleep(0.05)
    assert all(map(_ended, children))
    assert not os.path.exists(folder)


class _Finalized:
    """Garbage in a reference cycle whose finalizer writes down the process it ran in."""

    def __init__(self, folder) -> None:
        self.folder, self.me = folder, self

    def __del__(self) -> None:
        (self.folder / str(os.getpid())).touch()


def test_the_callers_garbage_is_never_finalized_in_a_child(follow_runs, monkeypatch, tmp_path):
    """A caller's garbage not yet collected as the judge forks (a torch process group left by a
    test, whose destructor aborted the child that collected it) is finalized in the caller's
    process only."""
    fork = owners.os.fork

    def garbage_then_fork() -> int:
        _Finalized(tmp_path)  # unreachable at once, and young: the next collection takes it
        return fork()

    monkeypatch.setattr(owners.os, "fork", garbage_then_fork)
    runs = follow_runs
    _judged(monkeypatch, 2, runs["base"], runs["merged"], runs["ref"])
    gc.collect()
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(os.getpid())]


def test_a_signal_handler_of_the_callers_never_runs_in_a_child(follow_runs, monkeypatch, tmp_path):
    """A caller's handler (a checkpoint on SIGUSR1, as job schedulers send before a time limit)
    runs in the caller only: a child ignores the signal and goes on judging."""

    def handler(number, frame) -> None:
        (tmp_path / str(os.getpid())).touch()

    previous = signal.signal(signal.SIGUSR1, handler)
    pids, _ = _watched(monkeypatch)
    judge_own = stream.StreamJudge._judge_own

    def signalled(self, files, grads):
        if self.owners is not None and files.update == 1:  # the parent, at update 1
            for pid in [*self.owners.pids, os.getpid()]:
                os.kill(pid, signal.SIGUSR1)
            time.sleep(0.2)
        return judge_own(self, files, grads)

    monkeypatch.setattr(stream.StreamJudge, "_judge_own", signalled)
    try:
        runs = follow_runs
        judged = _judged(monkeypatch, 3, runs["base"], runs["merged"], runs["ref"])
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert len(pids) == 2 and judged.verdict == "pass"
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(os.getpid())]


def test_a_child_found_dead_is_never_signalled_again(follow_runs, monkeypatch):
    """A child reaped as it was found dead frees its pid for any new process: closing the judge
    signals only the children still its own."""

    pids, _ = _watched(monkeypatch)
    killed: list[int] = []
    kill = owners.os.kill

    def recorded(pid: int, number: int) -> None:
        killed.append(pid)
        kill(pid, number)

    def gone_early(self, k, share, conn):
        os._exit(4)  # before any request, without a word

    monkeypatch.setattr(stream.StreamJudge, "_serve", gone_early)
    _requests_late(monkeypatch)  # both children have ended: the request meets a closed pipe
    monkeypatch.setattr(owners.os, "kill", recorded)
    with pytest.raises(RuntimeError, match=r"ended unexpectedly with exit status 4"):
        _judged(monkeypatch, 3, follow_runs["base"], follow_runs["merged"], follow_runs["ref"])
    assert len(pids) == 2 and pids[0] not in killed  # the first, found dead; the second killed
    assert killed == [pids[1]]
