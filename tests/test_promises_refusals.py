"""What gradalign promises about bad input: nothing crashes, nothing is accepted silently.

Each test is a defect once reproduced by hand, kept as a promise:
- bad input is one line on stderr and exit 2; anything unexpected is one line and exit 3 (never
  exit 1, which means "not aligned": a crash must never look like a verdict);
- what cannot be judged is refused or said, never passed.
Reads that stay bounded: tests/test_promises_bounded_reads.py; the commands kind to a newcomer:
tests/test_promises_newcomer.py.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from gradalign import cli as cli_module
from gradalign import cli_render
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
    monkeypatch.setattr(cli_render, "debug", {"on": False})
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
    assert last.startswith("error: ") and "cannot write" in last and os.strerror(code) in last
    assert not (tmp_path / "v").exists()


def test_an_unwritable_output_is_refused_before_training(cli, tmp_path):
    target = Path("/sys/gradalign-test") if Path("/sys").is_dir() else tmp_path / "ro" / "v"
    if target.parent == tmp_path / "ro":
        (tmp_path / "ro").mkdir(mode=0o555)
    one_line_error(cli("verify", "--out", target), "cannot write")


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="no /proc here")
def test_a_report_in_a_folder_that_takes_no_files_says_so_not_that_it_is_missing(cli, small_runs):
    # /proc exists, yet creating a file in it answers ENOENT: not a "no such file" message
    result = cli("compare", small_runs["baseline"], small_runs["merged"], "--json", "/proc/version")
    one_line_error(result, "cannot write in /proc", "takes no new files")
    assert "No such file" not in result.err


def test_an_output_under_a_regular_file_is_refused(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    one_line_error(cli("verify", "--out", tmp_path / "afile" / "v"), "is a file")


def test_an_output_the_recorder_refuses_is_bad_input_not_an_internal_error(
    cli, tmp_path, monkeypatch
):
    """The built-in trainer's Recorder turns a refused output into a RecorderError (its API's
    word for misuse); the CLI said it as an internal error, exit 3 (a link's `..` once reached
    it). The built-in loop calls the Recorder rightly: its output is the input refused."""
    from gradalign.errors import BadInput
    from gradalign.record import recorder

    def refused(out_dir):
        raise BadInput(f"{out_dir}: cannot write in {out_dir} (it takes no new files)")

    monkeypatch.setattr(recorder, "RunWriter", refused)
    result = cli("baseline", *SMALL_ARGS, "--out", tmp_path / "b")
    assert result.code == 2 and "Traceback" not in result.err, (result.code, result.err)
    last = result.err.strip().splitlines()[-1]  # after the settings the run would train with
    assert last.startswith("error: ") and "takes no new files" in last, result.err


def test_an_output_inside_a_recorded_run_is_refused(cli, small_copy, monkeypatch):
    """`baseline -o b/sub` wrote a run inside the run b, which replacing b would delete; and
    `verify -o b` its three runs there. Both are refused before work; `b/../c` is not inside."""
    base = small_copy["baseline"]
    before = sorted(p.name for p in base.iterdir())
    monkeypatch.chdir(base.parent)
    one_line_error(cli("baseline", "--out", "baseline/sub/x"), "inside the run baseline")
    one_line_error(cli("verify", "--out", base), f"inside the run {base}")
    (base.parent / "link").symlink_to(base / "weights")  # inside through a link, and link/..
    one_line_error(cli("baseline", "--out", "link/new"), "inside the run baseline")
    one_line_error(cli("baseline", "--out", "link/../x"), "inside the run baseline")
    assert sorted(p.name for p in base.iterdir()) == before
    assert sorted(p.name for p in (base / "weights").iterdir() if not p.is_file()) == []
    from gradalign.runs.writer import ensure_writable

    assert ensure_writable("baseline/../elsewhere") == Path("baseline/../elsewhere")


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
    # `bf16` was taken for no compute dtype at all: the run judged to float32's tolerances
    "an unknown compute dtype": lambda m: m["environment"].update(compute_dtype="bf16"),
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


@pytest.mark.parametrize(
    ("version", "said"),
    [
        (None, "names no format_version"),
        (2, "gives format_version 2"),
        ("1", "gives format_version '1'"),
    ],
)
def test_a_manifest_says_which_format_version_it_gives(cli, small_copy, version, said):
    """A missing version is said to be missing (it read 'format version None')."""
    if version is None:
        with_manifest(small_copy["baseline"], lambda m: m.pop("format_version"))
    else:
        with_manifest(small_copy["baseline"], lambda m: m.update(format_version=version))
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    one_line_error(result, f"manifest.json {said}; this gradalign reads 1")


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
