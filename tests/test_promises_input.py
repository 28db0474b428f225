"""What gradalign promises about bad input: nothing crashes, nothing is accepted silently.

Each test is a defect once reproduced by hand, kept as a promise:
- bad input is one line on stderr and exit 2; anything unexpected is one line and exit 3 (never
  exit 1, which means "not aligned": a crash must never look like a verdict);
- reads are bounded: no alias bombs, no unbounded messages, no whole-file slurps, no symlinks;
- what cannot be judged is refused or said, never passed;
- the commands are kind to a newcomer.
"""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gradalign import api
from gradalign import cli as cli_module
from gradalign.report import progress
from gradalign.runs import writer as run_writer

from .conftest import ROOT, one_line_error, rewrite_tensor_file

SMALL_ARGS = ["--hidden", "16", "--updates", "3", "--batch-size", "16"]


def manifest_of(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def with_manifest(run: Path, change) -> Path:
    data = manifest_of(run)
    change(data)
    (run / "manifest.json").write_text(json.dumps(data))
    return run


# -- a crash never looks like a verdict ----------------------------------------------------------


def test_an_internal_error_is_one_line_and_exit_3(cli, small_runs, monkeypatch):
    from gradalign.judge import compare as judge

    def broken(*args, **kwargs):
        raise ValueError("something gradalign did not expect")

    monkeypatch.setattr(judge, "compare", broken)
    result = cli("compare", small_runs["baseline"], small_runs["merged"])
    one_line_error(result, "internal error", "ValueError", "--debug", code=3)
    monkeypatch.setattr(cli_module, "_debug", {"on": False})
    with pytest.raises(ValueError):
        cli_module.main(
            ["--debug", "compare", str(small_runs["baseline"]), str(small_runs["merged"])]
        )


@pytest.mark.parametrize("signal", [KeyboardInterrupt, cli_module.Terminated])
def test_an_interrupt_wrapped_by_python_is_still_an_interrupt(cli, small_runs, monkeypatch, signal):
    """Python 3.11 wraps an exception raised in a class's `__set_name__` (an interrupt landing
    while an import creates classes) in a RuntimeError: still 130 or 143, never exit 3."""
    from gradalign.judge import compare as judge

    def interrupted(*args, **kwargs):
        try:
            raise signal()
        except BaseException as inner:
            raise RuntimeError("Error calling __set_name__ on 'Field'") from inner

    monkeypatch.setattr(judge, "compare", interrupted)
    result = cli("compare", small_runs["baseline"], small_runs["merged"])
    expected = 130 if signal is KeyboardInterrupt else 143
    assert result.code == expected, result.err
    assert "internal error" not in result.err and "interrupted" in result.err


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_disk_errors_while_writing_are_bad_input_and_leave_nothing(
    cli, tmp_path, monkeypatch, code
):
    def full(path, data, durable=False):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(run_writer, "_write_atomic", full)
    result = cli("verify", *SMALL_ARGS, "--out", tmp_path / "v")
    assert result.code == 2 and "Traceback" not in result.err
    last = result.err.strip().splitlines()[-1]  # after the settings line: the error, alone
    assert last.startswith("error: cannot write or read") and os.strerror(code) in last
    assert not (tmp_path / "v").exists()


def test_an_unwritable_output_is_refused_before_training(cli, tmp_path):
    target = Path("/sys/gradalign-test") if Path("/sys").is_dir() else tmp_path / "ro" / "v"
    if target.parent == tmp_path / "ro":
        (tmp_path / "ro").mkdir(mode=0o555)
    one_line_error(cli("verify", "--out", target), "cannot write")


def test_an_output_under_a_regular_file_is_refused(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    one_line_error(cli("verify", "--out", tmp_path / "afile" / "v"), "is a file")


@pytest.mark.parametrize(
    "args",
    [
        ["--updates", "1000000000"],
        ["--batch-size", "4000000000"],
        ["--hidden", "1000000000"],
    ],
)
def test_absurd_sizes_are_refused_before_allocating(cli, tmp_path, args):
    started = time.monotonic()
    one_line_error(cli("verify", *args, "--out", tmp_path / "v"), "GiB", "reduce")
    assert time.monotonic() - started < 20
    assert not (tmp_path / "v").exists()


def test_deeply_nested_json_is_bad_input(cli, small_copy):
    (small_copy["merged"] / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]))
    header = b'{"__metadata__":' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    target = small_copy["baseline"] / "weights" / "update_000001.safetensors"
    target.write_bytes(len(header).to_bytes(8, "little") + header)
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]))


WRONG_TYPES = {
    "environment as a string": lambda m: m.update(environment="cpu"),
    "environment.dtype as a number": lambda m: m["environment"].update(dtype=32),
    "an integer tensor name": lambda m: m["tensors"][0].update(name=7),
    "a shape of strings": lambda m: m["tensors"][0].update(shape=["784"]),
    "a negative dimension": lambda m: m["tensors"][0].update(shape=[-1]),
    "a dtype of nonsense": lambda m: m["tensors"][0].update(dtype="nonsense"),
    "a complex dtype": lambda m: m["tensors"][0].update(dtype="complex64"),
    "format version true": lambda m: m.update(format_version=True),
    "a tensor dtype that is not a string": lambda m: m["tensors"][0].update(dtype=None),
    "a tensor dtype of a list": lambda m: m["tensors"][0].update(dtype=[1]),  # was exit 3
    "an unknown tensor kind": lambda m: m["tensors"][0].update(kind="weights"),
    "a repeated tensor name": lambda m: m["tensors"].append(dict(m["tensors"][0])),
    "tensors as an object": lambda m: m.update(tensors={}),
    "no tensors": lambda m: m.update(tensors=[]),
    "files as a list": lambda m: m.update(files=[]),
    "a checksum that is not hex": lambda m: m["files"].update({"series.safetensors": 5}),
    "accum_steps as a string": lambda m: m.update(accum_steps="1"),
    "accum_steps as a bool": lambda m: m.update(accum_steps=True),
    "negative updates": lambda m: m.update(updates=-1),
    "absurd updates": lambda m: m.update(updates=10**12),
    "config as a list": lambda m: m.update(config=[1]),
    "model as a list": lambda m: m.update(model=["BatchNorm"]),
    "model lists of numbers": lambda m: m.update(model={"batchnorm": [1]}),
    "reference as a number": lambda m: m.update(reference=3),
    "fault as a number": lambda m: m.update(fault=1),
    "grad_dtype as a list": lambda m: m.update(grad_dtype=["float32"]),
    "micro_steps as a float": lambda m: m.update(micro_steps=4.0),
}


@pytest.mark.parametrize("change", WRONG_TYPES.values(), ids=WRONG_TYPES.keys())
def test_wrongly_typed_manifest_fields_are_bad_input(cli, small_copy, change):
    with_manifest(small_copy["baseline"], change)
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]), "manifest")


# -- reads are bounded ---------------------------------------------------------------------------

ALIAS_BOMB = """a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
batch_size: *g
"""


def test_a_yaml_alias_bomb_is_refused_at_once(cli, tmp_path):
    config = tmp_path / "bomb.yaml"
    config.write_text(ALIAS_BOMB)
    started = time.monotonic()
    result = cli("verify", "-c", config, "--out", tmp_path / "v")
    one_line_error(result, "aliases")
    assert time.monotonic() - started < 5 and len(result.err) < 300


def test_a_huge_value_is_never_printed_whole(cli, tmp_path):
    config = tmp_path / "long.yaml"
    config.write_text("optimizer: " + "x" * 100_000 + "\n")
    result = cli("verify", "-c", config, "--out", tmp_path / "v")
    one_line_error(result, "optimizer")
    assert len(result.err) < 400


READ_ONE = """
import resource, sys
from gradalign.errors import BadInput
from gradalign.runs.reader import read_run_dir
run = read_run_dir(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    run.weights(0)
except BadInput as exc:
    print("refused:", exc)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_a_data_file_is_checksummed_while_streaming(small_copy):
    """A 256 MB snapshot whose checksum fails is refused without being read into memory."""
    target = small_copy["merged"] / "weights" / "update_000000.safetensors"
    with open(target, "ab") as handle:
        handle.truncate(256 << 20)
    done = subprocess.run(
        [sys.executable, "-c", READ_ONE, str(small_copy["merged"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "refused:" in done.stdout and "checksum" in done.stdout, done.stdout + done.stderr
    grew_mib = int(done.stdout.strip().splitlines()[-1])
    assert grew_mib < 32, f"reading grew the process by {grew_mib} MiB"


def test_symlinked_data_files_are_refused(cli, small_copy, tmp_path):
    outside = tmp_path / "outside.safetensors"
    target = small_copy["merged"] / "weights" / "update_000001.safetensors"
    outside.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(outside)
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]), "symlink")


def test_a_symlinked_folder_inside_a_run_is_refused(cli, small_copy, tmp_path):
    grads = small_copy["merged"] / "grads"
    grads.rename(tmp_path / "grads-elsewhere")
    grads.symlink_to(tmp_path / "grads-elsewhere")
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]), "outside the run")


# -- nothing is accepted silently ----------------------------------------------------------------


def test_yaml_duplicate_keys_are_refused_and_1e_3_is_a_float(cli, tmp_path):
    config = tmp_path / "dup.yaml"
    config.write_text("updates: 2\nupdates: 3\n")
    one_line_error(cli("verify", "-c", config, "--out", tmp_path / "v"), "duplicate key 'updates'")
    config.write_text("optimizer: adam\nlr: 1e-3\nhidden: 16\nupdates: 2\nbatch_size: 8\n")
    result = cli("baseline", "-c", config, "--reference", "none", "--out", tmp_path / "b")
    assert result.code == 0, result.err
    assert manifest_of(tmp_path / "b")["config"]["lr"] == 1e-3


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_tolerances_must_be_finite_and_not_negative(cli, small_runs, tmp_path, value):
    result = cli("compare", small_runs["baseline"], small_runs["merged"], "--grad-rtol", value)
    one_line_error(result, "grad_rtol", "finite")
    config = tmp_path / "t.yaml"
    config.write_text(f"tolerances:\n  weight_rtol: {'.inf' if value == 'inf' else value}\n")
    one_line_error(cli("compare", small_runs["baseline"], small_runs["merged"], "-c", config))


def test_a_run_compared_with_itself_is_refused_and_a_copy_is_noted(cli, small_runs, tmp_path):
    base = small_runs["baseline"]
    one_line_error(cli("compare", base, base), "compared with itself")
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(base, copy)
    result = cli("compare", base, copy)
    assert result.code == 0 and "bit-identical" in result.out


def test_both_runs_diverging_is_said_plainly(cli, tmp_path):
    report = tmp_path / "r.json"
    result = cli("verify", *SMALL_ARGS, "--lr", "1e30", "--out", tmp_path / "v", "--json", report)
    assert result.code == 1
    data = json.loads(report.read_text())
    assert [d["code"] for d in data["diagnosis"]] == ["non-finite"]
    assert "both runs diverge" in data["diagnosis"][0]["message"]
    assert "inf times" not in result.out and "cosine inf" not in result.out


# -- kind to a newcomer --------------------------------------------------------------------------


def test_scripts_take_paths_relative_to_the_caller(tmp_path):
    """Run from another directory, relative paths are the caller's, not the checkout's."""
    runs = "c/runs/verify"
    first = subprocess.run(
        ["bash", str(ROOT / "run.sh"), *SMALL_ARGS, "--out", runs],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == 0, first.stderr
    second = subprocess.run(
        ["sh", str(ROOT / "run_grad.sh"), f"{runs}/baseline", "--out", "c/runs/m"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "c" / "runs" / "m" / "manifest.json").is_file()


def test_the_readme_says_how_to_call_gradalign_and_every_exit_code():
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin/gradalign" in readme and "source .venv/bin/activate" in readme
    table = readme[readme.index("## Exit codes") :]
    codes = {int(line.split("|")[1]) for line in table.splitlines()[4:] if line.startswith("| ")}
    assert codes == {0, 1, 2, 3, 130, 143}
    assert {cli_module.BAD_INPUT, cli_module.INTERNAL, cli_module.INTERRUPTED} <= codes
    assert cli_module.TERMINATED in codes


def test_help_lists_the_choices_and_the_fault_names(cli):
    result = cli("verify", "--help")
    assert result.code == 0
    text = " ".join(result.out.replace("│", " ").split())
    assert "sgd | adam | adamw" in text
    for name in ("no-loss-scale", "zero-grad-every-micro", "bf16-accum", "dropout-reseed"):
        assert name in text, name


def test_bare_gradalign_prints_help_and_version_and_h_work(cli):
    bare = cli()
    assert bare.code == 0 and "Usage" in bare.out and "error" not in bare.err
    assert cli("--version").out.strip().startswith("gradalign ")
    assert "Usage" in cli("compare", "-h").out


def test_the_table_never_cuts_a_number(tmp_path):
    old = ROOT / "fixtures" / "runs" / "v0.1.0"
    done = subprocess.run(
        [sys.executable, "-m", "gradalign", "compare", old / "baseline", old / "merged"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "60"},
    )
    assert done.returncode == 0
    assert "…" not in done.stdout


@pytest.mark.parametrize("width", [60, 80, 100, 132])
def test_a_narrow_table_leaves_out_columns_and_never_splits_a_number(width):
    """At 80 columns and less, numbers were folded over two to five lines ("2.31", "7703", "2")
    and FAIL became "FAI"/"L"; the headers read "upda"/"te". Columns now give way, named in a
    note, until every number stays on its line."""
    from rich.console import Console

    from gradalign.report.table import render

    old = ROOT / "fixtures" / "runs" / "v0.1.0"
    tight = {"noise_factor": 0.5, "noise_floor": 0.0}  # a failing comparison: FAIL in every row
    c = api.compare(old / "baseline", old / "merged", tolerances=tight)
    assert c.reference is not None and c.verdict == "fail"
    wide, narrow = (Console(file=io.StringIO(), width=w, color_system=None) for w in (300, width))
    render(c, wide)
    render(c, narrow)

    def body(console):  # the per-update table's rows, each a list of its cells
        lines = console.file.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
        end = next(i for i, line in enumerate(lines) if line.startswith("└"))
        return [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines[start + 1 : end]]

    full, shown = body(wide), body(narrow)
    assert len(shown) == len(full)  # one line per row: nothing folded
    for whole, row in zip(full, shown, strict=True):
        assert row[0] == whole[0] and row[-1] == whole[-1] == "FAIL"
        assert set(row) <= set(whole)  # every cell whole: a number cut short matches none
    text = " ".join(narrow.file.getvalue().split())
    if len(shown[0]) < len(full[0]):
        assert f"note: left out at this width ({width} columns):" in text
    else:
        assert "left out at this width" not in text


def test_a_long_compare_shows_progress_off_a_terminal(cli, small_runs, monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_FIRST", 0.0)
    monkeypatch.setattr(progress, "PLAIN_EVERY", 0.0)
    result = cli("compare", small_runs["baseline"], small_runs["merged"])
    assert result.code == 0
    assert "compare: 1/4" in result.err and "compare: 4/4" in result.err


def test_a_failed_report_leaves_no_temporary_file(tmp_path):
    from gradalign.errors import BadInput
    from gradalign.report.output import write_text_atomic

    (tmp_path / "d").mkdir()
    with pytest.raises(BadInput):
        write_text_atomic(tmp_path / "d", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_a_seed_torch_cannot_take_is_refused(cli, tmp_path, seed):
    one_line_error(cli("verify", "--seed", seed, "--out", tmp_path / "v"), "seed must be in")
    assert not (tmp_path / "v").exists()


def test_a_config_or_golden_file_that_is_a_device_is_refused_not_read_forever(cli, small_runs):
    """/dev/zero never ends: reading it as a config or a golden file hung."""
    base, merged = small_runs["baseline"], small_runs["merged"]
    one_line_error(cli("compare", base, merged, "-c", "/dev/zero"), "not a regular file")
    one_line_error(cli("golden", "check", "/dev/zero", base), "not a regular file")


SHAPELESS = {  # each once an internal error (exit 3)
    "grad states short": (
        "series.safetensors",
        lambda d: d.update({"update/grad_state": d["update/grad_state"][:1]}),
        "update/grad_state has shape",
    ),
    "lr of three dimensions": (
        "series.safetensors",
        lambda d: d.update({"update/lr": d["update/lr"].reshape(-1, 1, 1)}),
        "update/lr has shape",
    ),
    "an initial tensor the manifest does not list": (
        "weights/init.safetensors",
        lambda d: d.update({"extra/junk": np.zeros(3, np.float32)}),
        "junk",
    ),
}


@pytest.mark.parametrize("case", sorted(SHAPELESS))
def test_series_and_files_of_other_shapes_are_bad_input(cli, small_copy, case):
    relpath, edit, message = SHAPELESS[case]
    rewrite_tensor_file(small_copy["merged"], relpath, edit)
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]), message)


def test_a_manifest_number_of_5000_digits_is_bad_input(cli, small_copy):
    path = small_copy["merged"] / "manifest.json"
    path.write_text(
        path.read_text().replace('"updates": ', '"updates": ' + "9" * 5000 + ', "x": ', 1)
    )
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]), "manifest.json")


def test_a_log_loss_beyond_float_range_is_judged_not_crashed(cli, tmp_path):
    log = tmp_path / "huge.log"
    log.write_text("".join(f"{i}   [{'1e99999' if i == 0 else 0.5}]\n" for i in range(48)))
    result = cli("compare", log, ROOT / "fixtures" / "paddle" / "run_grad.log", "-k", "4")
    assert result.code in (1, 2) and "internal error" not in result.err, result.err


def test_api_misuse_raises_bad_input(small_runs, tmp_path):
    """The README promises BadInput for bad input to the Python API too, not TypeError."""
    from gradalign import api
    from gradalign.errors import BadInput

    base, merged = small_runs["baseline"], small_runs["merged"]
    calls = {
        "no baseline": lambda: api.compare(None, merged),
        "a number": lambda: api.compare(5, merged),
        "no merged": lambda: api.compare(base, None),
        "reference a number": lambda: api.compare(base, merged, reference=5),
        "tolerances a list": lambda: api.compare(base, merged, tolerances=[1, 2]),
        "tolerance overflow": lambda: api.compare(
            base, merged, tolerances={"weight_rtol": 10**400}
        ),
        "K a float": lambda: api.compare(base, merged, accum_steps=4.0),
        "config a number": lambda: api.verify(5, tmp_path / "v"),
        "out missing": lambda: api.verify({}, None),
    }
    for name, call in calls.items():
        with pytest.raises(BadInput):
            call()
            pytest.fail(f"{name}: no BadInput")
    assert api.compare(str(base).encode(), os.fsencode(merged)).verdict == "pass"  # bytes paths


def test_what_the_format_rules_out_is_refused_even_where_both_runs_declare_it(cli, small_copy):
    base, merged = small_copy["baseline"], small_copy["merged"]
    for run in (base, merged):
        with_manifest(run, lambda m: m["tensors"][0].update(dtype="nonsense"))
    one_line_error(cli("compare", base, merged), "tensors[0].dtype", "nonsense")


def test_a_micro_loss_of_integers_is_refused(cli, small_copy):
    rewrite_tensor_file(small_copy["merged"], "series.safetensors",
          lambda d: d.update({"micro/loss": d["micro/loss"].astype(np.int64)}))  # fmt: skip
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]), "micro/loss")
