"""What gradalign promises about the runs it replaces: whole or not at all.

Each test is a defect once reproduced by hand (a careless or hostile use), kept as a promise:
- a run, a baseline with its reference, a verify set: replaced whole or not at all;
- a set's commit, killed at each of its steps, is finished whole by the next process;
- a journal gradalign did not write, or cannot finish, moves and deletes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from gradalign import api
from gradalign.runs import runset, set_journal
from gradalign.runs import writer as run_writer
from gradalign.runs.locks import RunLock
from gradalign.runs.reader import read_run_dir

from . import file_promises
from .conftest import one_line_error
from .file_promises import SMALL_ARGS, SPLIT, digest

verified = file_promises.verified  # the fixture, shared


# -- whole or not at all -------------------------------------------------------------------------


def test_a_set_whose_commit_was_cut_short_is_finished_before_anyone_reads_it(
    cli, tmp_path, verified
):
    """A kill right after the first of a set's swaps: the next reader puts the whole new set in
    place (the replaced baseline, still beside it, is not swapped back), and a rerun works."""
    new = tmp_path / "new"
    api.verify({"hidden": 16, "updates": 3, "batch_size": 16, "optimizer": "adam"}, new)

    def stage(runs):
        for name in SPLIT:
            shutil.copytree(new / name, runs.path(name), dirs_exist_ok=True)

    assert commit_killed(verified, SPLIT, stage, step=3)  # after the first exchange
    read_run_dir(verified / "merged")
    assert sorted(p.name for p in verified.iterdir()) == list(SPLIT)
    for name in SPLIT:
        assert digest(verified / name) == digest(new / name), name
    assert api.compare(verified / "baseline", verified / "merged").verdict == "pass"
    assert cli("verify", *SMALL_ARGS, "--out", verified).code == 0


def test_a_kill_between_two_renames_never_leaves_the_path_empty(tmp_path, verified, monkeypatch):
    """Where no atomic exchange exists, a run is replaced by two renames; a kill between them
    leaves the old run aside, and the next writer puts it back."""
    monkeypatch.setattr(run_writer, "_exchange", lambda a, b: False)
    target = verified / "merged"
    before = digest(target)
    staged = tmp_path / ".merged.partial-999999"
    shutil.copytree(target, staged)
    real_replace = os.replace
    calls = []

    def dies_on_second(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise SystemExit("killed")
        real_replace(src, dst)

    monkeypatch.setattr(run_writer.os, "replace", dies_on_second)
    with pytest.raises(SystemExit):
        run_writer.swap_into_place(staged, target)
    monkeypatch.setattr(run_writer.os, "replace", real_replace)
    assert not target.exists()  # what the kill left: the old run lies aside
    with RunLock(target):
        run_writer.clear_stale(target)
    assert digest(target) == before


def test_swap_replaces_a_run_in_one_step(tmp_path, verified):
    if run_writer._renameat2 is None:
        pytest.skip("no renameat2 here: the two-rename path is tested above")
    staged = tmp_path / "staged"
    shutil.copytree(verified / "baseline", staged)
    (verified / "merged" / "manifest.json").touch()
    run_writer.swap_into_place(staged, verified / "merged")
    assert digest(verified / "merged") == digest(verified / "baseline")
    assert not staged.exists()


# -- a set's commit, killed at each of its steps, is finished whole by the next process ---------


def fake_run(path: Path, tag: str) -> None:
    """A directory the writer takes for a run (its manifest names the format), tagged `tag`."""
    files = {f"weights/update_{i:06d}.safetensors": "-" for i in range(4)}
    for rel in files:
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(f"{tag} {rel}")
    manifest = {"format": "gradalign-run", "files": files, "tag": tag}
    (path / "manifest.json").write_text(json.dumps(manifest))


def record_fake_set(parent: Path, names: tuple[str, ...], tag: str) -> None:
    runs = runset.RunSet(parent, list(names))
    for name in names:
        fake_run(runs.path(name), f"{tag}-{name}")
    runs.commit()


def fake_state(parent: Path, names: tuple[str, ...]) -> tuple[str | None, ...]:
    """Each member's tag where it is whole (every file as written), "PARTIAL" where not."""
    state = []
    for name in names:
        run = parent / name
        try:
            manifest = json.loads((run / "manifest.json").read_text())
            whole = all(
                (run / rel).read_text() == f"{manifest['tag']} {rel}" for rel in manifest["files"]
            )
        except FileNotFoundError:
            state.append(None if not run.exists() else "PARTIAL")
            continue
        state.append(manifest["tag"] if whole else "PARTIAL")
    return tuple(state)


def die_at(step: int) -> None:
    """From now on this (forked) process dies with no cleanup at all, as under SIGKILL, just
    before its `step`-th file-system change, or halfway through it if that deletes a tree (the
    manifest last, as may well happen). Between two changes the commit only reads, so dying
    after one is dying before the next."""
    count, busy = [0], [False]

    def halfway(path: Path) -> None:
        files = sorted((p for p in Path(path).rglob("*") if p.is_file()), reverse=True)
        for file in files[: len(files) // 2 + 1]:
            os.unlink(file)

    def wrap(owner: object, attr: str) -> None:
        real = getattr(owner, attr)

        def change(*args, **kwargs):
            if busy[0]:  # a step inside a step (the journal's rename): one step
                return real(*args, **kwargs)
            count[0] += 1
            if count[0] == step:
                if real is shutil.rmtree and os.path.isdir(args[0]):
                    halfway(args[0])
                os._exit(9)
            busy[0] = True
            try:
                return real(*args, **kwargs)
            finally:
                busy[0] = False

        setattr(owner, attr, change)

    for owner, attr in [
        (os, "rename"),
        (os, "replace"),
        (shutil, "rmtree"),
        (Path, "unlink"),
        (set_journal, "_exchange"),
        (set_journal, "_write_atomic"),
    ]:
        wrap(owner, attr)


def commit_killed(parent: Path, names, stage, step: int) -> bool:
    """Record a set over `parent` in a child process, `stage(runs)` filling its members, that
    dies at `step` of its commit (`die_at`); True if it died, False if it finished first."""
    child = os.fork()
    if child == 0:
        code = 0
        try:
            runs = runset.RunSet(parent, list(names))
            stage(runs)
            die_at(step)
            runs.commit()
        except BaseException:
            code = 3
        os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    assert code in (0, 9), code
    return code == 9


@pytest.mark.skipif(not hasattr(os, "fork"), reason="kills a forked child")
@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
@pytest.mark.parametrize("earlier", [SPLIT, ("baseline", "merged")], ids=["over-set", "new-member"])
def test_a_set_killed_at_any_step_of_its_commit_is_old_or_new_whole(
    tmp_path, monkeypatch, exchange, earlier
):
    """Kill the commit at each of its renames, exchanges, journal writes and deletions (a
    deletion halfway): the next process leaves each member the old run whole or the new one
    whole, all members alike, nothing of the commit behind it; and a rerun works."""
    if exchange and run_writer._renameat2 is None:
        pytest.skip("no renameat2 here")
    if not exchange:
        monkeypatch.setattr(set_journal, "_exchange", lambda a, b: False)
    old = tuple(f"old-{n}" if n in earlier else None for n in SPLIT)
    new = tuple(f"new-{n}" for n in SPLIT)

    def stage(runs):
        for name in SPLIT:
            fake_run(runs.path(name), f"new-{name}")

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not what is tested here
    outcomes = set()
    for step in range(1, 100):
        parent = tmp_path / str(step)
        record_fake_set(parent, earlier, "old")
        died = commit_killed(parent, SPLIT, stage, step)
        runset.recover_commits(parent)
        state = fake_state(parent, SPLIT)
        assert state in (old, new), (step, state)
        assert not list(parent.glob(".gradalign-commit-*")), step
        outcomes.add(state)
        record_fake_set(parent, SPLIT, "again")
        assert fake_state(parent, SPLIT) == tuple(f"again-{n}" for n in SPLIT)
        assert sorted(p.name for p in parent.iterdir()) == sorted(SPLIT), step
        if not died:
            break
    assert step > 8 and outcomes == {old, new}  # every step was reached, both ends seen


SOME = {"inode": 1, "manifest": "0" * 64}


WELL_FORMED = {"merged": SOME}


@pytest.mark.parametrize(
    ("journal", "marked"),
    [
        ({"names": [], "area": "precious"}, False),  # as fuzzed: a sibling deleted
        ({"names": [], "area": "."}, False),  # the whole parent deleted
        ({"names": ["precious"], "area": ".set-999999"}, True),  # another version's journal
        ({"version": 2, "area": "precious", "phase": "done", "members": WELL_FORMED}, False),
        ({"version": 2, "area": ".", "phase": "done", "members": WELL_FORMED}, False),
        ({"version": 2, "area": ".set-999998", "phase": "done", "members": WELL_FORMED}, True),
        ({"version": 2, "area": ".set-999999", "phase": "done", "members": WELL_FORMED}, False),
        ({"version": 2, "area": ".set-999999", "phase": "swap", "members": {"..": SOME}}, True),
        ({"version": 2, "area": ".set-999999", "phase": "swap", "members": {"a/b": SOME}}, True),
    ],
)
def test_a_stale_or_hostile_journal_deletes_nothing(cli, small_copy, journal, marked):
    """Reading runs beside a journal gradalign did not write (or another version did) moves and
    deletes nothing: not a sibling, not the parent, not a `.set-*` directory it did not mark, not
    through a member name that is not a plain one."""
    parent = small_copy["baseline"].parent
    (parent / "precious").mkdir()
    (parent / "precious" / "keep.txt").write_text("data")
    for area in (".set-999999", ".set-999998"):
        (parent / area / "new" / "merged").mkdir(parents=True)
        (parent / area / "mine.txt").write_text("not gradalign's")
        if marked:
            (parent / area / runset.AREA_MARKER).write_bytes(runset._MARKER_TEXT)
    (parent / ".gradalign-commit-999999.json").write_text(json.dumps(journal))
    before = digest(parent)
    assert cli("compare", small_copy["baseline"], small_copy["merged"]).code == 0
    assert digest(parent) == before


def test_a_journal_that_cannot_be_finished_changes_nothing(cli, small_copy):
    """A well-formed journal whose member path now holds the user's own directory: refused in
    one line, the directory and the staged run left as they are."""
    parent = small_copy["baseline"].parent
    (parent / "precious").mkdir()
    (parent / "precious" / "keep.txt").write_text("data")
    area = parent / ".set-999999"
    (area / "new").mkdir(parents=True)
    (area / runset.AREA_MARKER).write_bytes(runset._MARKER_TEXT)
    shutil.copytree(small_copy["merged"], area / "new" / "precious")
    inode, sha = runset._identity(area / "new" / "precious")
    members = {"precious": {"inode": inode, "manifest": sha}}
    journal = {"version": 2, "area": area.name, "phase": "swap", "members": members}
    (parent / ".gradalign-commit-999999.json").write_text(json.dumps(journal))
    before = digest(parent)
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    one_line_error(result, "cannot be finished", "precious", "nothing was changed")
    assert digest(parent) == before


def test_a_writer_clears_only_the_areas_gradalign_marked(tmp_path):
    """A killed writer's area (marked) goes; a user's directory named like one stays."""
    parent = tmp_path / "runs"
    dead, users = parent / ".set-999999", parent / ".set-999998"
    for area in (dead, users):
        (area / "new" / "merged").mkdir(parents=True)
        (area / "new" / "merged" / "data.bin").write_bytes(b"\0" * 100)
    (dead / runset.AREA_MARKER).write_bytes(runset._MARKER_TEXT)
    record_fake_set(parent, ("merged",), "new")
    assert sorted(p.name for p in parent.iterdir()) == [".set-999998", "merged"]
    assert (users / "new" / "merged" / "data.bin").stat().st_size == 100


# -- a commit refused (not killed) -----------------------------------------------------------------


@pytest.mark.parametrize("halfway", [False, True], ids=["before-b", "halfway-through-b"])
@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_a_commit_a_rename_refuses_is_undone_and_left_to_nobody(
    tmp_path, monkeypatch, exchange, halfway
):
    """A rename refused in the second member (before it moved anything, or after its first
    move) puts every earlier run back and removes the journal and the area: the command fails,
    and no later command rolls its runs in (it left them for whoever came next, even a
    `compare`, which then judged a run it was told was never written)."""
    names = ("a", "b", "c")
    record_fake_set(tmp_path, names, "old")
    if not exchange:
        monkeypatch.setattr(set_journal, "_exchange", lambda a, b: False)
    place, rename, calls, fired = set_journal._place, os.rename, [], []

    def refused_in_b(parent, area, name, identity):
        calls.append(name)
        if name == "b" and not halfway:
            raise PermissionError(13, "Permission denied")
        place(parent, area, name, identity)

    def second_move_of_b(src, dst):  # exchange: the earlier b into old/; else: the new b in
        second = Path(dst).parts[-2:] == ("old", "b") if exchange else Path(dst) == tmp_path / "b"
        if second and calls[-1:] == ["b"] and not fired:  # once: the undo's renames work
            fired.append(dst)
            raise PermissionError(13, "Permission denied")
        rename(src, dst)

    monkeypatch.setattr(set_journal, "_place", refused_in_b)
    runs = runset.RunSet(tmp_path, list(names))
    for name in names:
        fake_run(runs.path(name), f"new-{name}")
    if halfway:
        monkeypatch.setattr(os, "rename", second_move_of_b)
    with pytest.raises(api.BadInput) as refused:
        runs.commit()
    monkeypatch.setattr(os, "rename", rename)
    assert calls == ["a", "b"] and len(fired) == halfway
    assert "could not put the new run(s) in place (Permission denied)" in str(refused.value)
    assert "the earlier runs stay as they were" in str(refused.value)
    assert fake_state(tmp_path, names) == ("old-a", "old-b", "old-c")
    assert sorted(p.name for p in tmp_path.iterdir()) == list(names)  # no journal, no area
    monkeypatch.setattr(set_journal, "_place", place)
    runset.recover_commits(tmp_path)
    assert fake_state(tmp_path, names) == ("old-a", "old-b", "old-c")


@pytest.mark.parametrize("folder", ["", "weights"])
def test_a_run_directory_this_user_cannot_write_is_refused_before_work(folder):
    """Replacing a run moves its directory aside and deletes it, which needs writing in it and
    in each folder inside: a read-only earlier run (or one of its folders) is refused up front
    (the first failed at the swap, leaving a journal; the second left the replaced run's data
    and the journal behind for good)."""
    import subprocess
    import sys
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="gradalign-readonly-"))  # reachable by nobody
    fake_run(tmp_path / "m", "old")
    os.chmod(tmp_path, 0o777)
    os.chmod(tmp_path / "m", 0o777 if folder else 0o555)
    os.chmod(tmp_path / "m" / folder, 0o555)
    code = (
        "import sys; from gradalign.runs.writer import ensure_writable\n"
        "from gradalign.errors import BadInput\n"
        "try: ensure_writable(sys.argv[1])\n"
        "except BadInput as e: print(e); sys.exit(2)\n"
    )
    command = [sys.executable, "-c", code, str(tmp_path / "m")]
    if os.geteuid() == 0:  # root writes anywhere: ask as nobody
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        os.chmod(tmp_path / "m", 0o755)
        os.chmod(tmp_path / "m" / folder, 0o755)
        shutil.rmtree(tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    where = (tmp_path / "m" / folder).as_posix().rstrip("/")
    assert f"{tmp_path / 'm'}: cannot write in {where} " in done.stdout


def test_a_path_taken_while_a_set_recorded_keeps_the_new_runs_together(tmp_path):
    """A file dropped at a member's path while the set recorded: the commit refused to replace
    it (right) and threw the complete runs away (not): they are kept side by side."""
    runs = runset.RunSet(tmp_path, ["a", "b"])
    for name in ("a", "b"):
        fake_run(runs.path(name), f"new-{name}")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "mine.txt").write_text("mine")
    with pytest.raises(api.BadInput, match="the recorded runs were kept in") as refused:
        runs.commit()
    kept = Path(str(refused.value).rsplit(" kept in ", 1)[1])
    assert fake_state(kept, ("a", "b")) == ("new-a", "new-b")
    assert (tmp_path / "b" / "mine.txt").read_text() == "mine"
    assert not list(tmp_path.glob(".set-*")) and not list(tmp_path.glob(".gradalign-commit-*"))


def test_the_working_directory_is_no_place_for_a_run(cli, tmp_path, monkeypatch):
    """`merged -o .` in an empty folder moved the working directory aside and deleted it."""
    here = tmp_path / "proj"
    here.mkdir()
    monkeypatch.chdir(here)
    for out in (".", str(tmp_path)):
        one_line_error(cli("merged", *SMALL_ARGS, "-o", out), "the working directory")
    assert here.is_dir() and not list(here.iterdir())


def test_a_write_probe_a_kill_left_is_not_the_users_file(tmp_path):
    fake_run(tmp_path / "m", "old")
    (tmp_path / "m" / ".gradalign-probe-x1y2").write_text("")
    assert run_writer.foreign_entries(tmp_path / "m") == []
