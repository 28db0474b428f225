"""Runs and golden files edited by hand or merged by git: what the edit made ambiguous is refused
in one line, never resolved silently. Each test is a defect once reproduced by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import one_line_error


def test_a_manifest_key_written_twice_is_refused(cli, small_copy):
    """`"accum_steps": 4, "accum_steps": 1`: json kept the last, and the merged run was refused
    for a series that "holds no micro/loss of 4 floating values", a message about something
    else."""
    manifest = small_copy["merged"] / "manifest.json"
    text = manifest.read_text()
    top = '{\n  "accum_steps": 4,'
    assert text.startswith(top)
    manifest.write_text(text.replace(top, top + '\n  "accum_steps": 1,', 1))
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    one_line_error(result, "manifest.json", "'accum_steps' appears twice")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_manifest_number_strict_json_lacks_is_refused(cli, small_copy, constant):
    """docs/FORMAT.md says strict JSON; Python's json reads `NaN` and `Infinity`, and a config
    value edited to one was judged as if it were a number."""
    manifest = small_copy["merged"] / "manifest.json"
    data = json.loads(manifest.read_text())
    data["config"]["lr"] = float(constant.replace("Infinity", "inf"))
    manifest.write_text(json.dumps(data, indent=2))  # json writes NaN and Infinity by default
    assert constant in manifest.read_text()
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    one_line_error(result, "manifest.json", f"{constant} is not a number in strict JSON")


def test_a_gradient_file_dropped_from_the_manifest_is_refused(cli, small_copy):
    """Deleting a tampered gradient file's line from the manifest (what a user tries after "fails
    its checksum") made the judge skip that update's gradients and pass; the file is still in
    the run, so the run is refused."""
    manifest = small_copy["merged"] / "manifest.json"
    data = json.loads(manifest.read_text())
    listed = "grads/update_000001.safetensors"
    assert listed in data["files"] and (small_copy["merged"] / listed).exists()
    del data["files"][listed]
    manifest.write_text(json.dumps(data, indent=2))
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    one_line_error(result, listed, "is in the run but not listed in the manifest")


def test_a_golden_key_written_twice_is_refused(cli, small_runs, tmp_path):
    """A merge that keeps both sides of a conflict repeats keys; json kept the last one and the
    golden was judged as if nothing were wrong."""
    golden = tmp_path / "golden.json"
    written = cli("golden", "write", small_runs["baseline"], "--out", golden, "--reference", "none")
    assert written.code == 0, written.err
    text = golden.read_text()
    golden.write_text(text.replace('  "updates": 4,', '  "updates": 4,\n  "updates": 4,', 1))
    result = cli("golden", "check", golden, small_runs["merged"])
    one_line_error(result, "'updates' appears twice")


def _loop(folder: Path) -> Path:
    """Two symbolic links naming each other."""
    (folder / "loop-a").symlink_to("loop-b")
    (folder / "loop-b").symlink_to("loop-a")
    return folder / "loop-a"


@pytest.mark.parametrize(
    "args",
    [
        ["compare", "LOOP", "MERGED"],
        ["compare", "BASE", "MERGED", "--reference", "LOOP"],
        ["compare", "BASE", "MERGED", "--json", "LOOP"],
        ["compare", "BASE", "MERGED", "--markdown", "LOOP/r.md"],
        ["golden", "write", "BASE", "--out", "LOOP"],
        ["baseline", "-o", "LOOP", "--updates", "1", "--hidden", "8", "--batch-size", "8"],
    ],
    ids=" ".join,
)
def test_a_loop_of_symbolic_links_is_bad_input_not_an_internal_error(
    cli, small_runs, tmp_path, args
):
    """Path.resolve() raises RuntimeError on a loop: exit 3, 'internal error ... a gradalign
    bug', for a path that merely names nothing."""
    loop = _loop(tmp_path)
    named = {"BASE": small_runs["baseline"], "MERGED": small_runs["merged"], "LOOP": loop}
    given = [str(named.get(a, a)).replace("LOOP", str(loop)) for a in args]
    one_line_error(cli(*given), "a loop of symbolic links")


@pytest.mark.parametrize("where", ["out", "report", "input"])
def test_a_path_too_long_for_the_file_system_is_bad_input(cli, small_runs, tmp_path, where):
    """ENAMETOOLONG (a name over 255 bytes, a path over PATH_MAX) was exit 3, 'internal error',
    with the whole path in the message."""
    deep = tmp_path.joinpath(*["d" * 200] * 25)
    args = {
        "out": ["baseline", "-o", deep, "--updates", "1", "--hidden", "8", "--batch-size", "8"],
        "report": ["compare", small_runs["baseline"], small_runs["merged"], "--json", deep],
        "input": ["compare", deep, small_runs["merged"]],
    }[where]
    result = cli(*args)
    one_line_error(result, "too long")
    assert len(result.err) < 400


def test_a_manifest_cannot_steer_a_golden_file_out_of_its_directory(cli, small_copy, tmp_path):
    """The golden's file name is the run's environment key, built from its manifest: a device of
    "../../escaped" wrote the golden two directories above the one asked for."""
    manifest = small_copy["baseline"] / "manifest.json"
    data = json.loads(manifest.read_text())
    data["environment"]["device"] = "../../escaped"
    manifest.write_text(json.dumps(data))
    folder = tmp_path / "a" / "b" / "goldens"
    result = cli("golden", "write", small_copy["baseline"], "--out", folder, "--reference", "none")
    assert result.code == 0, result.err
    written = list(tmp_path.rglob("*escaped*.json"))
    assert written and all(folder in path.parents for path in written), written


def _named(arg: str, named: dict[str, Path]) -> str:
    """`arg` with its first part replaced by the path it names (BASE/manifest.json)."""
    head, _, rest = arg.partition("/")
    return arg if head not in named else str(named[head] / rest if rest else named[head])


@pytest.mark.parametrize(
    "args",
    [
        ["golden", "write", "BASE", "--out", "MERGED/manifest.json", "--reference", "none"],
        ["golden", "write", "BASE", "--out", "MERGED", "--reference", "none"],
        ["golden", "check", "BASE/manifest.json", "MERGED", "--update"],
        ["golden", "check", "OTHER/package.json", "MERGED", "--update"],
        # a file not named .json: it said `other: holds no golden file`
        ["golden", "write", "BASE", "--out", "OTHER/notes", "--reference", "none"],
    ],
    ids=" ".join,
)
def test_a_golden_is_never_written_over_a_run_or_a_file_that_is_no_golden(
    cli, small_copy, tmp_path, args
):
    """`golden write --out RUN/manifest.json` and `golden check RUN/manifest.json ... --update`
    wrote the golden over that run's manifest (exit 0, the run gone); `--update` given any other
    file (a package.json) overwrote it too."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "package.json").write_text('{"name": "mine"}\n')
    (other / "notes").write_text("mine\n")
    named = {"BASE": small_copy["baseline"], "MERGED": small_copy["merged"], "OTHER": other}
    given = [_named(arg, named) for arg in args]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    result = cli(*given)
    said = ["exists and is not a golden file"] if "OTHER/notes" in args else []
    one_line_error(result, *said)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("command", ["compare", "verify", "golden check", "golden check --update"])
def test_a_report_never_lands_on_the_config_or_golden_file_it_reads(
    cli, small_copy, tmp_path, command
):
    """`compare A B -c tol.yaml --json tol.yaml` wrote the JSON report over the config it had just
    read, and `golden check G RUN --json G` over the golden file: exit 0, the input gone."""
    config = tmp_path / "tol.yaml"
    config.write_text("tolerances:\n  loss_atol: 0.001\n")
    golden = tmp_path / "golden.json"
    written = cli("golden", "write", small_copy["baseline"], "--out", golden, "--reference", "none")
    assert written.code == 0, written.err
    base, merged = small_copy["baseline"], small_copy["merged"]
    args = {
        "compare": ["compare", base, merged, "-c", config, "--json", config],
        "verify": ["verify", "-c", config, "-o", tmp_path / "v", "--junit", config],
        "golden check": ["golden", "check", golden, merged, "--json", golden],
        "golden check --update": [
            "golden",
            "check",
            golden,
            merged,
            "--update",
            "--markdown",
            golden,
        ],
    }[command]
    before = {p: p.read_bytes() for p in (config, golden)}
    one_line_error(cli(*args), "would be written over or inside the input")
    assert {p: p.read_bytes() for p in (config, golden)} == before


def test_a_report_at_the_folder_verify_writes_its_runs_in_is_refused_before_training(cli, tmp_path):
    """`verify --out D --json D`: D, still absent, was let through, the three runs recorded,
    and only then refused as a directory; it is refused before any work, as `--json
    D/baseline` was."""
    out = tmp_path / "v"
    result = cli("verify", "--updates", "1", "--reference", "none", "--out", out, "--json", out)
    one_line_error(result, f"report {out} is the folder the run {out / 'baseline'} is to be")
    assert not out.exists() and "baseline:" not in result.err


def test_a_first_update_into_a_new_directory_makes_a_directory(cli, small_runs, tmp_path):
    """`golden check ci/golden RUN --update` (docs/CI.md) before ci/golden existed wrote a file
    named `golden`, where `golden write --out ci/golden` makes a directory: the two commands then
    refused each other's path."""
    folder = tmp_path / "ci" / "golden"
    result = cli("golden", "check", folder, small_runs["merged"], "--update")
    assert result.code == 0, result.err
    assert folder.is_dir() and [p.suffix for p in folder.iterdir()] == [".json"]
    written = cli("golden", "write", small_runs["baseline"], "--out", folder, "--reference", "none")
    assert written.code == 0, written.err


TINY = ["--updates", "1", "--hidden", "8", "--batch-size", "8"]


@pytest.mark.parametrize("out", [".", "./", "/"])
@pytest.mark.parametrize("command", ["baseline", "merged"])
def test_an_output_run_without_a_name_is_refused_or_named(cli, tmp_path, monkeypatch, command, out):
    """`baseline -o .` and `-o /` raised ValueError in pathlib (a run's reference is named
    NAME-fp64): exit 3, 'internal error'. Both are refused: "/" has no name, and "." is the
    working directory, which a run replaces by moving it aside and deleting it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("keep\n")
    result = cli(command, "-o", out, *TINY)
    one_line_error(result, "root directory" if out == "/" else "the working directory")
    assert (tmp_path / "mine.txt").read_text() == "keep\n"


def test_an_empty_current_directory_is_not_replaced_by_the_run(cli, tmp_path, monkeypatch):
    """It took the run: the folder was moved aside and deleted under the shell standing in it
    (its next command died with `Intel oneMKL FATAL ERROR`, not one line)."""
    folder = tmp_path / "run"
    folder.mkdir()
    monkeypatch.chdir(folder)
    before = folder.stat().st_ino
    result = cli("baseline", "-o", ".", "--reference", "none", *TINY)
    one_line_error(result, "the working directory (or one above it) is no place for a run")
    assert folder.stat().st_ino == before and not list(folder.iterdir())


def test_a_manifest_or_golden_saved_with_a_byte_order_mark_is_read(cli, small_copy, tmp_path):
    """An editor that saves UTF-8 with a BOM made the manifest 'unreadable or not JSON' and the
    golden 'not a valid golden file'; YAML configs read past it already."""
    manifest = small_copy["merged"] / "manifest.json"
    manifest.write_bytes(b"\xef\xbb\xbf" + manifest.read_bytes())
    assert cli("compare", small_copy["baseline"], small_copy["merged"]).code == 0
    golden = tmp_path / "golden.json"
    written = cli("golden", "write", small_copy["baseline"], "--out", golden, "--reference", "none")
    assert written.code == 0, written.err
    golden.write_bytes(b"\xef\xbb\xbf" + golden.read_bytes())
    result = cli("golden", "check", golden, small_copy["merged"])
    assert result.code == 0, result.err


@pytest.mark.parametrize(
    ("value", "on"), [("", False), ("0", False), ("false", False), ("1", True), ("yes", True)]
)
def test_gradalign_debug_0_means_off(value, on):
    from gradalign.errors import debug_wanted

    assert debug_wanted({"GRADALIGN_DEBUG": value}) is on
    assert debug_wanted({}) is False
