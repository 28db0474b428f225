"""Bad runs and logs given to `compare`: missing, damaged, misstated by their manifest, of
other models, lengths or initial weights, read through a pipe or a link. Each is one line on
stderr, exit 2, never a traceback. A NaN loss is a failure (exit 1)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from gradalign import Recorder
from gradalign.record.loop import train

from .conftest import SMALL, one_line_error, rewrite_tensor_file


def test_missing_run(cli, tmp_path, small_runs):
    one_line_error(cli("compare", small_runs["baseline"], tmp_path / "nope"), "nope", "no such")


def test_directory_that_is_not_a_run(cli, tmp_path, small_runs):
    (tmp_path / "empty").mkdir()
    one_line_error(cli("compare", tmp_path / "empty", small_runs["merged"]), "not a gradalign run")


def test_a_runs_manifest_given_for_the_run_is_named_so(cli, small_runs):
    """It was read as a log: "no step line in its first MiB holds a step number and a loss"."""
    manifest = small_runs["baseline"] / "manifest.json"
    one_line_error(cli("compare", manifest, small_runs["merged"]), "the manifest of the run")


def test_file_that_is_neither_run_nor_log(cli, tmp_path, small_runs):
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\n")
    one_line_error(cli("compare", small_runs["baseline"], junk), "junk.txt", "neither")


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_snapshot_fails_its_checksum(cli, small_copy, damage):
    snapshot = small_copy["merged"] / "weights" / "update_000002.safetensors"
    data = bytearray(snapshot.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[-5] ^= 0x40
    snapshot.write_bytes(bytes(data))
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    # a tensor's fingerprint fails its checksum; a file cut short is no readable tensor file
    one_line_error(result, "update_000002.safetensors", "truncated or altered")


def test_missing_data_file(cli, small_copy):
    (small_copy["merged"] / "grads" / "update_000001.safetensors").unlink()
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]), "missing")


def test_a_manifest_that_is_a_pipe_is_refused_not_waited_on(cli, small_copy, tmp_path):
    """A FIFO named manifest.json: the read waited forever (`compare` hung)."""
    import os

    manifest = small_copy["merged"] / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    one_line_error(result, "manifest.json is not a regular file")
    os.mkfifo(tmp_path / "g.json")
    result = cli("golden", "write", small_copy["baseline"], "--out", tmp_path / "g.json")
    one_line_error(result, "g.json is not a regular file")
    # a reference found through the baseline's manifest: the check of what it is read it too
    reference = small_copy["baseline"].with_name("baseline-fp64")
    shutil.copytree(small_copy["baseline"], reference)
    (reference / "manifest.json").unlink()
    os.mkfifo(reference / "manifest.json")
    result = cli("compare", small_copy["baseline"], small_copy["merged"], "--reference", reference)
    one_line_error(result, "manifest.json is not a regular file")
    from gradalign.runs.layout import is_run_dir

    assert not is_run_dir(reference)


@pytest.mark.parametrize(
    ("line", "codes"),
    [
        # int() refuses over 4300 digits: exit 3; an unreadable step then let the log pass
        ('{"step": ' + "9" * 5000 + ', "loss": 0.5}', {2}),
        ('{"step": 0, "loss": 0.5}\n{"step": ' + "9" * 10000 + ', "loss": 0.5}', {2}),
        ('{"step": 0, "loss": 0.5, "pad": "' + "a" * 140000 + '"}', {0, 1, 2}),  # csv's limit
    ],
    ids=["a 5000-digit first step", "a 10000-digit step", "a 140 kB field"],
)
def test_log_lines_past_pythons_limits_are_no_internal_error(cli, tmp_path, line, codes):
    base, merged = tmp_path / "b.log", tmp_path / "m.log"
    base.write_text("step 0 loss 0.5\nstep 1 loss 0.5\n")
    merged.write_text(line + '\n{"step": 1, "loss": 0.5}\n')
    result = cli("compare", base, merged, "-k", "1")
    assert result.code in codes and "internal error" not in result.err, result.err
    if result.code == 2:
        one_line_error(result)


def test_corrupt_manifest(cli, small_copy):
    (small_copy["merged"] / "manifest.json").write_text("{not json")
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]), "manifest.json")


def _edit_manifest(run, edit) -> None:
    manifest = json.loads((run / "manifest.json").read_text())
    edit(manifest)
    (run / "manifest.json").write_text(json.dumps(manifest))


def _declare_float64(manifest: dict) -> None:
    manifest["tensors"][0]["dtype"] = "float64"


def _misspell_integrity(manifest: dict) -> None:
    manifest["integrity"] = "fingerprint"


def _call_a_param_a_buffer(manifest: dict) -> None:
    manifest["tensors"][1]["kind"] = "buffer"


def _escape_in_a_name(manifest: dict) -> None:
    manifest["tensors"][0]["name"] = "fc\x1b[2J1.weight"  # clears the terminal it is shown on


def _escape_in_the_reference(manifest: dict) -> None:
    manifest["reference"] = "../x\x00\x1b[31mRED\x07"  # printed in a note and the reports


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (_declare_float64, ("stored as F32", "declares it float64")),
        (_misspell_integrity, ("'integrity'", "'fingerprints' or absent", "'fingerprint'")),
        (_call_a_param_a_buffer, ("different models: tensor 1", "(a buffer) in the merged")),
        (_escape_in_a_name, ("tensors[0].name", "control characters", "\\x1b[2J")),
        (_escape_in_the_reference, ("'reference'", "control characters", "\\x1b[31m")),
    ],
    ids=[
        "float32 data declared float64",
        "an unknown integrity",
        "a param that is a buffer",
        "an escape sequence in a name",
        "an escape sequence in the reference",
    ],
)
def test_a_manifest_that_misstates_its_run_is_refused(cli, small_copy, edit, said):
    """Each was judged: float32 data declared float64 to float64's tolerances, an integrity
    spelled wrong by checksums instead, and a parameter listed as a buffer in one run only
    against the other's parameter, as if the two were one model."""
    _edit_manifest(small_copy["merged"], edit)
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]), *said)


def test_runs_of_different_models(cli, tmp_path, small_runs):
    other = train(SMALL.replace(hidden=8), tmp_path / "other")
    result = cli("compare", small_runs["baseline"], other)
    one_line_error(result, "different models: tensor 0 is ", "in the baseline and", "[8,")


def test_runs_of_different_models_and_lengths_are_told_different_models(cli, tmp_path, small_runs):
    """The model is told first: a run of another model that also ran for fewer updates (a run
    directory mistaken for another) was told how its data ended ("runs of different
    lengths ... the merged run stopped early?")."""
    other = train(SMALL.replace(hidden=8, updates=3), tmp_path / "other")
    result = cli("compare", small_runs["baseline"], other)
    one_line_error(result, "different models: tensor 0 is ", "in the baseline and", "[8,")
    assert "lengths" not in result.err


def test_runs_of_different_lengths(cli, tmp_path, small_runs):
    other = train(SMALL.replace(updates=3), tmp_path / "short")
    one_line_error(
        cli("compare", small_runs["baseline"], other),
        "different lengths",
        "4",
        "3",
        "the merged run stopped early? its run ended after update 2; both hold updates 0 to 2",
    )
    result = cli("compare", small_runs["baseline"], other)
    assert "cut the longer log" not in result.err  # two run directories: no log to cut
    longer = train(SMALL.replace(updates=SMALL.updates * SMALL.accum_steps), tmp_path / "long")
    one_line_error(  # max_steps counted in micro-steps: K times as many updates
        cli("compare", small_runs["baseline"], longer),
        f"the merged run holds K={SMALL.accum_steps} times the baseline's updates",
        "max_steps=N*K",
    )


def test_runs_from_different_initial_weights(cli, tmp_path, small_runs):
    other = train(SMALL.replace(seed=1), tmp_path / "seed1")
    one_line_error(cli("compare", small_runs["baseline"], other), "initial weights differ")


def test_accum_steps_that_contradict_the_record(cli, small_runs):
    result = cli("compare", small_runs["baseline"], small_runs["merged"], "--accum-steps", "2")
    one_line_error(result, "K=4", "--accum-steps 2")


def test_a_merged_run_given_as_the_baseline_names_the_baseline_flag(cli, tmp_path, small_runs):
    """A K=4 run as BASE (two merged runs compared, e.g. one card x K=4 against W ranks x K/W):
    the user gave no K, so the error names the flag whose default says K=1, and how to go on."""
    other = train(SMALL.replace(accum_steps=2), tmp_path / "k2")
    result = cli("compare", small_runs["merged"], other)
    one_line_error(result, "baseline was recorded with K=4", "--baseline-accum-steps 4")
    assert "was given" not in result.err
    assert cli("compare", small_runs["merged"], other, "--baseline-accum-steps", "4").code == 0


def test_runs_given_the_other_way_round_are_told_the_order(cli, small_runs):
    result = cli("compare", small_runs["merged"], small_runs["baseline"])
    one_line_error(result, "baseline was recorded with K=4", "the baseline comes first")


def test_a_log_given_as_a_pipe_is_refused_as_one_without_waiting_for_a_writer(cli, tmp_path):
    """`compare <(cat a.log) <(cat b.log)`: the log was read twice from a pipe and refused as
    holding no step line; a FIFO without a writer blocked forever."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    one_line_error(cli("compare", fifo, fifo.with_name("other.log")), "a pipe or device")


def test_nan_loss_fails_never_passes(cli, tmp_path, small_runs):
    """A run whose loss went NaN is a failed alignment (exit 1), not bad input."""
    from gradalign.record.trainer import setup

    t = setup(SMALL)
    k, size = SMALL.accum_steps, SMALL.micro_batch_size
    with Recorder(tmp_path / "nan", t.model, t.optimizer, accum_steps=k) as rec:
        for update in range(SMALL.updates):
            for micro in range(k):
                x, y = t.data.micro_batch(update * k + micro, size)
                loss = torch.nn.functional.cross_entropy(t.model(x), y)
                if update == 2 and micro == 1:
                    loss = loss * float("nan")
                (loss / k).backward()
                rec.micro(loss)
            t.optimizer.step()
            rec.update()
            t.optimizer.zero_grad()
    report = tmp_path / "r.json"
    result = cli("compare", small_runs["baseline"], tmp_path / "nan", "--json", report)
    assert result.code == 1, result.err
    data = json.loads(report.read_text())
    assert data["verdict"] == "fail"
    assert data["first_divergence"]["update"] == 2
    assert data["loss"]["max_abs_diff"] is None  # NaN is reported as null, never as a number
    finite = next(c for c in data["checks"] if c["name"] == "finite losses")
    assert finite["status"] == "fail" and "micro-step 9" in finite["detail"]


def test_real_process_prints_no_traceback(tmp_path):
    """The installed entry point, not just main(): one line and exit 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "gradalign", "compare", str(tmp_path / "a"), str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ")


def test_a_data_file_that_is_a_directory_is_named_so_not_missing(cli, small_copy):
    grads = small_copy["merged"] / "grads" / "update_000001.safetensors"
    grads.unlink()
    grads.mkdir()
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    one_line_error(result, "not regular files", "update_000001")


def test_a_baseline_reached_through_a_link_keeps_its_reference(cli, tmp_path):
    """`..` in the manifest's reference was resolved beside the link: the reference was
    'missing', and a bug the reference catches passed with a note."""
    real = tmp_path / "data"
    base = train(SMALL.replace(accum_steps=1), real / "base", reference="../base-fp64")
    train(SMALL.replace(accum_steps=1, dtype="float64"), real / "base-fp64")
    merged = train(SMALL, real / "merged")
    links = tmp_path / "links"
    links.mkdir()
    (links / "base").symlink_to(base)
    direct = cli("compare", base, merged, "--json", tmp_path / "direct.json")
    linked = cli("compare", links / "base", merged, "--json", tmp_path / "linked.json")
    assert direct.code == linked.code == 0, linked.out
    direct_json = json.loads((tmp_path / "direct.json").read_text())
    linked_json = json.loads((tmp_path / "linked.json").read_text())
    assert direct_json["reference"] and linked_json["reference"] == direct_json["reference"]


@pytest.mark.parametrize(("value", "refused"), [(3, True), ("3", False), (True, False)])
def test_a_run_resumed_at_another_update_is_refused(cli, small_copy, value, refused):
    """A config's `resumed_at_update` (a Trainer resumed from a checkpoint) that differs from
    the baseline's is refused; one that is no count (a user's own config key) is ignored,
    never an internal error."""
    _edit_manifest(small_copy["merged"], lambda m: m["config"].update(resumed_at_update=value))
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    if refused:
        one_line_error(result, "began at other updates", "the merged at update 3")
    else:
        assert result.code == 0, result.err


@pytest.mark.parametrize("key", ["update/state", "micro/state", "micro/data"])
def test_a_fingerprint_series_of_another_dtype_is_refused(cli, small_copy, key):
    """update/state written as I32 (the format says I64) was read, and a correct run failed
    `weights-changed-in-window`; F64 digests compared as floats. Refused, naming the series."""
    import numpy as np

    def narrowed(series: dict) -> None:
        assert key in series
        series[key] = series[key].astype(np.int32 if key != "micro/data" else np.float64)

    run = small_copy["merged"]
    rewrite_tensor_file(run, "series.safetensors", narrowed)
    result = cli("compare", small_copy["baseline"], run)
    one_line_error(result, key, "I64")


def test_a_log_against_a_run_directory_is_told_so(cli, small_runs):
    """A run directory given beside training logs was refused as "runs of different models:
    tensor 0 is fc1.weight ... in the baseline and fc2.bias in the merged", the one value the
    logs printed: a log holds what it printed, said so, either way round."""
    from .conftest import FIXTURES

    log = FIXTURES / "paddle" / "p3_run_grad.log"
    for base, merged, which in (
        (small_runs["baseline"], log, "the merged run is read from a training log"),
        (log, small_runs["merged"], "the baseline is read from a training log"),
    ):
        result = cli("compare", base, merged, "-k", "4")
        one_line_error(result, which, "compare logs with logs")
