"""Bad arguments to any command: config files, options, devices and paths (empty, `-`, a folder
that cannot be created, an out dir that is no run, one report's path on another's). Each is one
line on stderr, exit 2, never a traceback."""

from __future__ import annotations

import pytest
import torch

from gradalign.config import TrainConfig

from .conftest import one_line_error


@pytest.mark.parametrize(
    ("yaml_text", "fragments"),
    [
        ("batch_size: 128\nlearning_rate: 0.1\n", ["unknown key 'learning_rate'"]),
        ("batch_size: many\n", ["batch_size must be int", "'many'"]),
        ("updates: 2.5\n", ["updates must be int"]),
        ("optimizer: lamb\n", ["optimizer must be one of", "lamb"]),
        ("batch_size: [1, 2\n", ["not valid YAML"]),
        ("- 1\n- 2\n", ["must be a mapping"]),
        ("tolerances: 3\n", ["tolerances must be a mapping"]),
        (
            "tolerances:\n  weight_rtol: -1\n",
            ["weight_rtol must be a finite number >= 0", "never below"],
        ),
        ('tolerances:\n  weight_rtol: "0.5"\n', ["weight_rtol must be", "written as text"]),
        ("tolerances:\n  weight_rtol: .inf\n", ["weight_rtol must be", "would pass any bug"]),
        ("tolerances:\n  speed: 1\n", ["unknown tolerance 'speed'"]),
        ("1: 2\nx: 3\n", ["unknown key"]),  # sorting int and str keys was exit 3
        ("seed: " + "9" * 5000 + "\n", ["not a config value", "4300 digits"]),  # was exit 3
        ("tolerances:\n  loss_atol: " + "9" * 5000 + "\n", ["not a config value"]),
    ],
    ids=repr,
)
def test_bad_config_files(cli, tmp_path, yaml_text, fragments):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    result = cli("verify", "-c", config, "--updates", "1", "--hidden", "8", "--out", tmp_path / "v")
    one_line_error(result, *fragments)


@pytest.mark.parametrize(
    ("yaml_text", "fragment"),
    [
        ("tolerance:\n  loss_atol: 1\n", "unknown key 'tolerance'"),  # was judged by the defaults
        ("1: 2\nx: 3\n", "unknown key"),
    ],
)
def test_a_compare_config_with_unknown_keys_is_refused(
    cli, small_runs, tmp_path, yaml_text, fragment
):
    """compare reads only the tolerances section, but a misspelt one must not pass silently."""
    config = tmp_path / "tol.yaml"
    config.write_text(yaml_text)
    one_line_error(
        cli("compare", small_runs["baseline"], small_runs["merged"], "-c", config), fragment
    )


def test_a_compare_config_may_hold_the_training_keys(cli, small_runs, tmp_path):
    """The same file serves verify and compare: its training keys are no unknown keys."""
    config = tmp_path / "full.yaml"
    config.write_text("updates: 4\nhidden: 32\ntolerances:\n  loss_atol: 0.1\n")
    assert cli("compare", small_runs["baseline"], small_runs["merged"], "-c", config).code == 0


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--batch-size", "10", "-k", "4"], ["batch_size 10 is not divisible by accum_steps 4"]),
        (["-k", "0"], ["accum_steps (K) must be at least 1"]),
        (["-k", "-2"], ["accum_steps (K) must be at least 1"]),
        (["--updates", "0"], ["updates must be at least 1"]),
        (["--lr", "-1"], ["lr must be positive"]),
        # torch refused to convert these mid-step: exit 3, "internal error"
        (["--lr", "1e39"], ["lr 1e+39 is beyond the largest float32"]),
        (["--weight-decay", "1e308"], ["weight_decay 1e+308 is beyond the largest float32"]),
        (["--amp-level", "O3", "--lr", "1e5"], ["lr 100000 is beyond the largest float16"]),
        # O3's float16 weights replaced the dtype without a word: recorded as float16
        (["--amp-level", "O3", "--dtype", "float64"], ["amp_level O3 sets the weights' dtype"]),
        (["--optimizer", "lamb"], ["optimizer must be one of"]),
        (["--device", "cuda:3"], ["device must be one of", "CUDA_VISIBLE_DEVICES=3"]),
        (["--device", "mps"], ["device must be one of cpu, cuda, auto; got 'mps'"]),
        (["--batch-size", "lots"], ["--batch-size", "valid int"]),  # "int" or "integer"
        (["--no-such-option"], ["--no-such-option"]),
        (["-c", "missing.yaml"], ["missing.yaml", "no such config file"]),
    ],
)
def test_bad_options(cli, tmp_path, args, fragments):
    one_line_error(cli("verify", "--out", tmp_path / "v", *args), *fragments)
    assert not (tmp_path / "v").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu(cli, tmp_path):
    one_line_error(cli("baseline", "--device", "cuda", "--out", tmp_path / "b"), "no CUDA device")
    one_line_error(cli("selftest", "--device", "cuda", "--out", tmp_path / "s"), "no CUDA device")
    assert not (tmp_path / "s").exists()


def test_selftest_device_must_be_known(cli, tmp_path):
    one_line_error(cli("selftest", "--device", "tpu", "--out", tmp_path / "s"), "device must be")


def test_selftest_into_a_folder_it_cannot_create_is_refused_before_any_case(cli, tmp_path):
    """Every case printed its own error, then the command ended in exit 3 (internal error)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    one_line_error(cli("selftest", "--out", blocker / "s"), "is a file, not a directory")


def test_out_dir_that_is_not_a_run_is_never_overwritten(cli, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    one_line_error(cli("baseline", "--updates", "1", "--out", precious), "refusing to overwrite")
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_train_config_rejects_out_of_range_values():
    from gradalign.errors import BadInput

    with pytest.raises(BadInput, match="momentum must not be negative"):
        TrainConfig().replace(momentum=-0.5)


TINY = ["--updates", "1", "--hidden", "8", "--batch-size", "8"]


@pytest.mark.parametrize(
    "args",
    [
        ["baseline", "-o", "", *TINY],
        ["baseline", "-c", "", *TINY],
        ["merged", "-k", "2", "-o", "", *TINY],
        ["merged", "--against", "", "-o", "m"],
        ["verify", "-k", "2", "-o", "", *TINY],
        ["compare", "", "MERGED"],
        ["compare", "BASE", ""],
        ["compare", "BASE", "MERGED", "--reference", ""],
        ["compare", "BASE", "MERGED", "-c", ""],
        *(["compare", "BASE", "MERGED", f"--{r}", ""] for r in ("json", "junit", "html")),
        *(["compare", "BASE", "MERGED", f"--{r}", ""] for r in ("markdown", "plot")),
        ["golden", "write", ""],
        ["golden", "write", "BASE", "-o", ""],
        ["golden", "write", "BASE", "--reference", ""],
        ["golden", "check", "", "MERGED"],
        ["golden", "check", "BASE", ""],
        ["selftest", "-o", "", "--record", "bogus"],  # --record bogus: never a whole selftest
        ["selftest", "--json", "", "--record", "bogus"],
    ],
    ids=" ".join,
)
def test_an_empty_path_is_refused_never_the_current_directory(
    cli, tmp_path, monkeypatch, small_runs, args
):
    """typer turns "" into Path("."): `-o ""` recorded into the current directory, `compare ""`
    read it. Every path option and argument refuses "" instead, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    named = {"BASE": str(small_runs["baseline"]), "MERGED": str(small_runs["merged"])}
    one_line_error(cli(*(named.get(a, a) for a in args)), "an empty path")
    assert not list(tmp_path.iterdir())


def test_every_path_parameter_refuses_an_empty_path():
    """Any parameter typer turns into a path, in any command (a new one too), refuses ""."""
    from pathlib import PurePath

    import typer

    from gradalign.cli import app
    from gradalign.cli_options import _names_paths, refuse_empty_paths

    pending, checked = [refuse_empty_paths(app)], []
    while pending:
        command = pending.pop()
        pending.extend(getattr(command, "commands", {}).values())
        ctx = command.make_context(command.name, [], resilient_parsing=True)
        for param in command.params:
            many = param.nargs != 1 or getattr(param, "multiple", False)
            try:
                made = param.process_value(ctx, ("x",) if many else "x")
            except typer.BadParameter:
                continue  # a number, a flag: "x" is not one
            converted = any(isinstance(v, PurePath) for v in (made if many else [made]))
            if converted or _names_paths(param):  # typer < 0.29 converts after process_value
                with pytest.raises(typer.BadParameter, match="an empty path"):
                    param.process_value(ctx, ("",) if many else "")
                checked.append(f"{command.name} {param.name}")
    assert len(checked) >= 20 and "compare merged" in checked, checked


@pytest.mark.parametrize(
    "args",
    [
        *(["compare", "BASE", "MERGED", f"--{r}", "-"] for r in ("json", "junit", "html")),
        *(["compare", "BASE", "MERGED", f"--{r}", "-"] for r in ("markdown", "plot")),
        ["compare", "-", "MERGED"],
        ["baseline", "-o", "-", *TINY],
        ["golden", "write", "BASE", "-o", "-"],
        ["selftest", "--json", "-", "--record", "bogus"],
    ],
    ids=" ".join,
)
def test_a_dash_for_a_path_is_refused_never_a_file_named_dash(
    cli, tmp_path, monkeypatch, small_runs, args
):
    """`--json -` wrote a file named "-" (and `--plot -`, `golden write -o -` a directory) where
    a user or a CI script expected standard output; exit 0 and a stray file."""
    monkeypatch.chdir(tmp_path)
    named = {"BASE": str(small_runs["baseline"]), "MERGED": str(small_runs["merged"])}
    one_line_error(cli(*(named.get(a, a) for a in args)), "'-'", "/dev/stdout")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("report", ["--json", "--junit", "--markdown", "--html"])
def test_a_report_path_ending_in_a_slash_is_refused(cli, tmp_path, monkeypatch, small_runs, report):
    """`--json out/` wrote a file named `out`, where the path names a directory (a later `--plot
    out/` was then refused as a file); `--plot out/` is a directory, as before."""
    monkeypatch.chdir(tmp_path)
    one_line_error(cli("compare", *small_runs.values(), report, "out/"), "ending in '/'")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("other", ["--json", "--html"])
def test_a_plot_folder_on_another_reports_path_is_refused(cli, tmp_path, small_runs, other):
    """`--json X --plot X`: X would be a file and a folder; it was an internal error (exit 3)
    that left temporary files behind."""
    pytest.importorskip("matplotlib")
    same = tmp_path / "same.out"
    result = cli("compare", *small_runs.values(), other, same, "--plot", same)
    one_line_error(result, "same.out", "separate paths")
    assert not list(tmp_path.iterdir())
