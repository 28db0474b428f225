"""Golden files: a small JSON file stands in for the baseline run directory in CI. It is written
per environment and deterministically; `golden check` passes what compare passes, fails a known
bug with its code, says what it cannot check, proposes a candidate on failure and `--update`
accepts it (one update at a time, never a float64 run beside float32 goldens); the committed
default golden holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gradalign import api
from gradalign.api_golden import golden_config
from gradalign.config import TrainConfig
from gradalign.judge.compare import compare
from gradalign.runs import golden as fmt
from gradalign.runs.reader import read_run_dir

from .conftest import FIXTURES, SMALL, one_line_error

DEFAULT_GOLDEN = FIXTURES / "golden"


def _key(run: Path) -> str:
    return fmt.environment_key(read_run_dir(run).environment)


def test_a_golden_is_written_per_environment_and_deterministically(small, tmp_path):
    golden = small["golden"]
    assert golden.name == f"{_key(small['baseline'])}.json"
    again = api.golden_write(small["baseline"], tmp_path / "g.json")
    assert again.read_bytes() == golden.read_bytes()
    data = json.loads(golden.read_text())
    assert data["environment_key"].startswith("cpu-float32-ws1-torch")
    assert data["reference_dtype"] == "float64"
    first = data["per_update"][0]["weights"]["0.weight"]
    kept = {"norm", "moved", "sketch", "reference", "noise"}  # and a drift where not 0
    assert kept <= set(first) <= kept | {"drift", "explained"}
    assert len(first["sketch"]) == 8 and first["noise"] > 0


def test_a_goldens_bytes_do_not_depend_on_how_its_run_was_named(small, tmp_path, monkeypatch):
    """The run and reference paths were kept as typed: `baseline`, its absolute path or
    `sub/../baseline` gave golden files of other bytes, and a committed golden carried the
    machine's folders."""
    monkeypatch.chdir(small["root"])
    named = [
        api.golden_write(run, tmp_path / f"g{i}.json")
        for i, run in enumerate(("baseline", small["baseline"], "merged/../baseline"))
    ]
    assert len({g.read_bytes() for g in named}) == 1
    source = json.loads(named[0].read_text())["source"]
    assert source == {"run": "baseline", "reference": "baseline-fp64"}


def test_a_goldens_bytes_do_not_depend_on_the_blas_threads(small, tmp_path):
    """np.linalg.norm's dot is split over the BLAS threads above 10,000 elements, and the sums
    came out otherwise: a golden regenerated on another machine differed in its last digits."""
    import os
    import subprocess
    import sys

    written = []
    for threads in ("1", "2"):
        out = tmp_path / f"g{threads}.json"
        env = {**os.environ, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
        command = [sys.executable, "-m", "gradalign", "golden", "write", small["baseline"]]
        done = subprocess.run([*command, "--out", out], env=env, capture_output=True)
        assert done.returncode == 0, done.stderr
        written.append(out.read_bytes())
    assert written[0] == written[1]


def test_golden_check_judges_like_compare_from_below(small):
    """The losses are judged exactly as compare judges them; a tensor's error is a lower bound on
    compare's, against the same allowed bound but for the excess a noise-dominated element's
    drift admitted, carried to every tensor of the later updates alike (judge/noise.py,
    `carry_admitted_excess`): the golden keeps each weight's drift, but measures the excess
    from its lower bound of the merged weights' distance, so it carries as much or less (on
    some machines' rounding compare carried 1.0019 times the noise from update 3 of this run
    and a golden without the drift none; on others neither carries)."""
    outcome = api.golden_check(small["golden"], small["merged"])
    full = api.compare(small["baseline"], small["merged"])
    g, c = outcome.comparison, full
    factor = c.tolerances.noise_factor
    assert g.verdict == c.verdict == "pass"
    for rg, rc in zip(g.results, c.results, strict=True):
        assert (rg.loss_error, rg.loss_allowed) == (rc.loss_error, rc.loss_allowed)
        carried = []
        for dg, dc in zip(rg.weights + rg.grads, rc.weights + rc.grads, strict=True):
            assert dg.name == dc.name
            assert dg.error <= dc.error * (1 + 1e-9) + 1e-15
            assert dg.allowed <= dc.allowed * (1 + 1e-8)  # the golden is never the looser
            carried.append((dc.allowed - dg.allowed) / (factor * dc.noise))
        assert max(carried) - min(carried) <= 1e-6  # one carried excess c - c' for all
        assert min(carried) >= -1e-6 and max(carried) <= factor**2 - 1
    statuses = {k.name: k.status for k in g.checks}
    assert statuses["weights, element by element"] == "not checked"
    assert statuses["gradients, element by element"] == "not checked"
    assert statuses["weights (norms and projections)"] == "pass"
    assert statuses["initial weights"] == "pass"
    assert any("lower bounds" in note for note in g.notes)


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("no-loss-scale", "loss-scale"),
        ("step-every-micro", "step-in-window"),
        ("data-order", "data-order"),
    ],
)
def test_golden_check_names_the_bug(small, fault, code):
    comparison = api.golden_check(small["golden"], small[fault]).comparison
    assert comparison.verdict == "fail"
    assert comparison.diagnosis[0].code == code, [(d.code, d.message) for d in comparison.diagnosis]


def test_a_failing_check_proposes_a_candidate_and_update_accepts_it(cli, small, tmp_path):
    golden = Path(shutil.copy(small["golden"], tmp_path / "g.json"))
    report = tmp_path / "reports" / "r.json"
    report.parent.mkdir()
    bug = small["no-loss-scale"]
    result = cli("golden", "check", golden, bug, "--json", report)
    assert result.code == 1
    accept = f"gradalign golden check {golden} {bug} --update"
    assert accept in " ".join(result.out.split())
    candidate = report.parent / "g.candidate.json"
    assert fmt.load(candidate)["source"]["run"] == bug.name
    assert any(accept in note for note in json.loads(report.read_text())["notes"])
    # the merged run names no float64 reference: the golden would lose its noise floor
    assert "loses its noise floor" in " ".join(result.out.split())
    before = golden.read_bytes()
    result = cli("golden", "check", golden, bug, "--update")
    said = " ".join(result.out.split())
    assert result.code == 0 and "loses its noise floor" in said
    assert "though it failed against the golden it replaced with loss-scale named" in said
    assert golden.read_bytes() != before
    assert fmt.load(golden)["source"]["run"] == bug.name
    assert cli("golden", "check", golden, bug).code == 0  # the accepted run passes itself
    result = cli("golden", "check", golden, small["baseline"], "--update")  # with its reference
    assert result.code == 0 and "noise floor" not in result.out
    assert "though it failed" not in " ".join(result.out.split())  # unexplained: none named


def test_a_candidate_stays_out_of_dev_and_a_passing_check_removes_a_stale_one(cli, small, tmp_path):
    """`--json /dev/stdout`: the candidate went beside the first report, into /dev. A later
    passing check left an earlier failing check's candidate beside its fresh reports, where
    copying it over the golden (as that check's note said) would accept the failing run."""
    golden = Path(shutil.copy(small["golden"], tmp_path / "g.json"))
    runs = tmp_path / "runs"
    bug = Path(shutil.copytree(small["no-loss-scale"], runs / "bug"))
    clean = Path(shutil.copytree(small["merged"], runs / "clean"))
    result = cli("golden", "check", golden, bug, "--json", "/dev/stdout")
    assert result.code == 1, result.err
    candidate = runs / "g.candidate.json"
    assert fmt.load(candidate)["source"]["run"] == bug.name
    assert not Path("/dev/g.candidate.json").exists()
    result = cli("golden", "check", golden, clean)
    assert result.code == 0 and not candidate.exists()
    assert f"removed the candidate golden {candidate}" in " ".join(result.out.split())


def test_a_candidate_that_cannot_be_written_is_skipped_with_a_note(tmp_path):
    """A read-only workspace: the candidate was checked before judging, and a passing check
    exited 2 ("cannot write"); now it goes without one."""
    from gradalign.api_golden import _writable

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    found, why = _writable(blocked / "g.candidate.json", [])
    assert found is None and str(blocked) in why
    assert _writable(tmp_path / "g.candidate.json", []) == (tmp_path / "g.candidate.json", "")
    report = tmp_path / "g.candidate.json"  # a report named as the candidate would be: kept
    assert _writable(report, [], [report])[0] is None


def test_update_of_the_first_golden_says_no_report_was_written(cli, small, tmp_path):
    """With no golden for the run's environment, `--update` accepted the run and skipped the
    reports asked for without a word: a CI job then missed its JUnit file."""
    junit = tmp_path / "reports" / "x.xml"
    fresh = tmp_path / "fresh"
    result = cli("golden", "check", fresh, small["baseline"], "--update", "--junit", junit)
    assert result.code == 0, result.err
    said = " ".join(result.out.split())
    assert f"note: no report written ({junit})" in said and "no golden for this environment" in said
    assert not junit.exists()


def test_update_of_the_first_golden_removes_earlier_reports(cli, small, tmp_path):
    """The reports of an earlier job at the paths asked for stayed, a JUnit file of failures
    and a JSON verdict "fail" beside an exit 0: they are removed, and the note says so; an empty
    file there (one a report may take) stays."""
    junit, json_path, other = (tmp_path / name for name in ("x.xml", "r.json", "empty.md"))
    failed = cli("golden", "check", small["golden"], small["no-loss-scale"], "--junit", junit)
    assert failed.code == 1 and junit.exists()
    cli("golden", "check", small["golden"], small["no-loss-scale"], "--json", json_path)
    other.write_text("")
    fresh = tmp_path / "fresh"
    asked = ("--junit", junit, "--json", json_path, "--markdown", other)
    result = cli("golden", "check", fresh, small["baseline"], "--update", *asked)
    assert result.code == 0, result.err
    said = " ".join(result.out.split())
    assert "removed the earlier reports there (2)" in said, said
    assert not junit.exists() and not json_path.exists() and other.exists()


def test_the_committed_default_golden(cli, tmp_path):
    """fixtures/golden holds the built-in default's golden (fixtures/golden/README.md): under
    100 kB; the default merged run passes it, a missing loss scale fails with loss-scale. On
    another environment the golden is refused, never passed."""
    files = sorted(DEFAULT_GOLDEN.glob("*.json"))
    assert files and all(f.stat().st_size < 100_000 for f in files)
    clean = api.record_merged(TrainConfig(), tmp_path / "merged")
    key = _key(clean)
    result = cli("golden", "check", DEFAULT_GOLDEN, clean)
    if key not in {fmt.load(f)["environment_key"] for f in files}:
        assert result.code == 2 and "no golden for this environment" in result.err
        return
    assert result.code == 0, result.out + result.err
    bug = api.record_merged(TrainConfig(), tmp_path / "bug", fault="no-loss-scale")
    report = tmp_path / "r.json"
    result = cli("golden", "check", DEFAULT_GOLDEN, bug, "--json", report)
    assert result.code == 1
    assert json.loads(report.read_text())["diagnosis"][0]["code"] == "loss-scale"


def test_compare_still_judges_a_golden_run_pair_directly(small):
    """The golden's runs are ordinary `Run`s to the judge (no tensors)."""
    base, ref = fmt.as_runs(fmt.load(small["golden"]), "g")
    result = compare(base, read_run_dir(small["merged"]), reference=ref)
    assert result.verdict == "pass"  # losses and bookkeeping only; tensors not recorded
    assert {k.name: k.status for k in result.checks}["gradients (norms and projections)"] == (
        "not checked"
    )


def test_update_refuses_a_float64_run_beside_float32_goldens(cli, small, tmp_path):
    """A float64 run (a baseline's -fp64 reference) has its own environment key: `--update` wrote
    it as a new golden beside the float32 one, not over it, and the directory then recorded two
    experiments (`merged --against DIR` refused it). Refused, naming what to pass instead; in a
    directory of its own a float64 golden is still accepted."""
    folder = tmp_path / "goldens"
    folder.mkdir()
    golden = Path(shutil.copy(small["golden"], folder / small["golden"].name))
    reference = small["baseline"].with_name("baseline-fp64")
    for target in (folder, golden):
        result = cli("golden", "check", target, reference, "--update")
        one_line_error(result, "dtype 'float64' (goldens 'float32')", "pass the baseline itself")
        assert list(folder.iterdir()) == [golden]
    apart = tmp_path / "float64"
    apart.mkdir()
    assert cli("golden", "check", apart, reference, "--update").code == 0
    assert fmt.load(apart / f"{_key(reference)}.json")["reference_dtype"] is None


def test_goldens_of_two_precisions_share_a_folder(cli, small, tmp_path):
    """A folder may hold one golden per environment, and the compute precision is part of the
    environment: `golden write` and `golden check` accepted a bfloat16 golden beside the float32
    one, but `merged --against DIR` then refused the folder ("different experiments"), and the
    guard of `--update` against a float64 run (or another experiment) let it through."""
    folder = tmp_path / "goldens"
    shutil.copytree(small["golden"].parent, folder)
    bf16 = api.record_baseline(SMALL.replace(accum_steps=1, precision="bf16"), tmp_path / "b16")
    assert cli("golden", "write", bf16, "--out", folder).code == 0
    assert len(list(folder.glob("*.json"))) == 2
    assert "precision" not in golden_config(folder)  # left to the command line
    result = cli("merged", "--against", folder, "-k", "4", "--out", tmp_path / "m")
    assert result.code == 0, result.err
    assert read_run_dir(tmp_path / "m").config["precision"] == "fp32"
    reference = small["baseline"].with_name("baseline-fp64")
    result = cli("golden", "check", folder, reference, "--update")
    one_line_error(result, "dtype 'float64' (goldens 'float32')", "pass the baseline itself")
    assert len(list(folder.glob("*.json"))) == 2
    # another experiment may not replace one environment's golden and leave the other's; a
    # file named by the user is theirs to place
    other = api.record_baseline(
        SMALL.replace(accum_steps=1, lr=0.05), tmp_path / "lr", reference="none"
    )
    before = {p.name: p.read_bytes() for p in folder.glob("*.json")}
    one_line_error(cli("golden", "write", other, "--out", folder), "lr 0.05 (goldens ")
    one_line_error(cli("golden", "check", folder, other, "--update"), "lr 0.05 (goldens ")
    assert {p.name: p.read_bytes() for p in folder.glob("*.json")} == before
    assert cli("golden", "write", other, "--out", folder / "lr.json").code == 0


def test_updates_of_one_golden_wait_for_each_other(small, tmp_path):
    """Two `golden check --update` jobs on one golden both read it, judged, and wrote: each
    said "accepted", and the first's acceptance was lost unjudged. An update now holds the
    golden's lock from reading to writing; a second waits, then judges the first's golden."""
    import subprocess
    import sys

    from gradalign.runs.locks import RunLock

    golden = Path(shutil.copy(small["golden"], tmp_path / "g.json"))
    command = [sys.executable, "-m", "gradalign", "golden", "check", str(golden)]
    with RunLock(golden.absolute()):  # another job's update, under way
        job = subprocess.Popen([*command, str(small["merged"]), "--update"], cwd=tmp_path)
        with pytest.raises(subprocess.TimeoutExpired):
            job.wait(timeout=5)
        assert fmt.load(golden)["source"]["run"] == small["baseline"].name
    assert job.wait(timeout=120) == 0
    assert fmt.load(golden)["source"]["run"] == small["merged"].name


def test_a_run_that_diverged_fails_its_golden_check_with_every_report(cli, small, tmp_path):
    """A merged run whose loss went NaN failed `compare` (exit 1, `non-finite`), yet `golden
    check` answered bad input (exit 2, "a golden must hold finite numbers"), writing no report:
    the candidate golden it proposes cannot be written, and the check's verdict stands."""
    diverged = api.record_merged(SMALL.replace(lr=1e30), tmp_path / "diverged")
    golden = Path(shutil.copy(small["golden"], tmp_path / "g.json"))
    reports = tmp_path / "reports"
    result = cli(
        "golden",
        "check",
        golden,
        diverged,
        "--json",
        reports / "r.json",
        "--junit",
        reports / "r.xml",
    )
    assert result.code == 1, result.err
    data = json.loads((reports / "r.json").read_text())
    assert any(note.startswith("no candidate golden written") for note in data["notes"])
    assert (reports / "r.xml").read_text().startswith("<?xml")
    assert not (reports / "g.candidate.json").exists()


def test_a_golden_keeps_the_optimizer_settings_its_check_names(small, tmp_path):
    """A golden keeps the optimizer's settings as the manifest has them: a merged run given
    another momentum fails `optimizer-settings` as `compare` names it (without them the golden
    check could only say `unexplained`), and the config note shows a setting left to its
    default as unset, not as None."""
    other = SMALL.replace(accum_steps=4, momentum=0.9)
    run = api.record_merged(other, tmp_path / "momentum")
    kept = fmt.load(small["golden"])["optimizer"]
    assert kept == read_run_dir(small["baseline"]).optimizer_settings
    comparison = api.golden_check(small["golden"], run).comparison
    direct = api.compare(small["baseline"], run)
    assert comparison.verdict == direct.verdict == "fail"
    assert comparison.diagnosis[0].code == direct.diagnosis[0].code == "optimizer-settings"
    assert "momentum 0.0 in the baseline, 0.9 in the merged run" in comparison.diagnosis[0].message
    assert "the run's config differs from the golden's: momentum 0.9 (golden: 0.0)" in " ".join(
        comparison.notes
    )
    assert SMALL.lr is None
    lr_run = api.record_merged(SMALL.replace(accum_steps=4, lr=0.2), tmp_path / "lr")
    notes = " ".join(api.golden_check(small["golden"], lr_run).comparison.notes)
    assert "lr 0.2 (golden: unset)" in notes, notes


def test_a_golden_with_malformed_optimizer_settings_is_refused(cli, small, tmp_path):
    data = json.loads(Path(small["golden"]).read_text())
    data["optimizer"]["tensor_groups"] = data["optimizer"]["tensor_groups"][:-1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    result = cli("golden", "check", bad, small["merged"])
    one_line_error(result, "golden field 'optimizer.tensor_groups' must hold one group index")


def test_a_run_directory_is_named_where_a_golden_is_expected(cli, small, tmp_path):
    """`golden write b --out b` and `golden check b m` with the run b: the run's manifest.json
    was read as a golden candidate ('b: holds no golden file'; 'record one here', in a run)."""
    base, merged = small["baseline"], small["merged"]
    for args in (
        ("write", base, "--out", base),
        ("check", base, merged),
        ("check", base, merged, "--update"),
    ):
        one_line_error(cli("golden", *args), f"{base}: a run directory, not a golden file")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    refused = cli("golden", "check", broken, merged)
    one_line_error(refused, "not a valid golden file")
    assert "NaN" not in refused.err  # said only where the file holds one
    broken.write_text('{"format": NaN}')
    one_line_error(cli("golden", "check", broken, merged), "NaN and Inf are refused")
    assert "whatever the verdict" in cli("golden", "check", "--help").out


@pytest.fixture(scope="module")
def clipped(tmp_path_factory) -> dict[float, dict[str, Path]]:
    """Per clip_norm (one that never engages, one that engages), the golden of a clipped
    baseline and the merged runs: clean and with each clip fault."""
    found = {}
    for clip in (1e6, 0.05):
        root = tmp_path_factory.mktemp(f"clip-{clip:g}")
        config = SMALL.replace(clip_norm=clip)
        api.record_baseline(config, root / "baseline")
        runs = {"golden": api.golden_write(root / "baseline", root / "golden")}
        runs["clean"] = api.record_merged(config, root / "clean")
        for fault in ("clip-every-micro", "clip-norm-over-k"):
            runs[fault] = api.record_merged(config, root / fault, fault=fault)
        found[clip] = runs
    return found


@pytest.mark.parametrize("clip", [1e6, 0.05], ids=["never-engages", "engages"])
@pytest.mark.parametrize(
    ("fault", "code"),
    [("clip-every-micro", "clip-per-micro"), ("clip-norm-over-k", "clip-threshold")],
)
def test_a_golden_keeps_the_clips_and_names_their_bugs(clipped, clip, fault, code):
    """The golden keeps the baseline's clip calls and thresholds per update: a merged run that
    clips each partial sum, or at max_norm / K, is named as compare names it, also where no clip
    engaged (the golden passed those: the norms it keeps agreed)."""
    runs = clipped[clip]
    assert api.golden_check(runs["golden"], runs["clean"]).comparison.verdict == "pass"
    c = api.golden_check(runs["golden"], runs[fault]).comparison
    assert c.verdict == "fail"
    assert c.diagnosis[0].code == code, [(d.code, d.message[:80]) for d in c.diagnosis]
    series = json.loads(runs["golden"].read_text())["series"]
    assert series["clip_calls"] == [1] * SMALL.updates
    assert series["clip_max_norm"] == [clip] * SMALL.updates


def test_a_sketched_baseline_is_refused_as_a_golden(cli, tmp_path):
    """A baseline recorded with --record sketch was written as a golden (exit 0) whose updates
    between the snapshots held no tensor, which every check of it then refused ("must
    summarize every tensor"): refused when written instead."""
    from gradalign import api

    base = api.record_baseline(SMALL.replace(record="sketch"), tmp_path / "base")
    out = tmp_path / "g.json"
    one_line_error(cli("golden", "write", base, "--out", out), "--record sketch", "full snapshots")
    assert not out.exists()


def test_a_golden_with_merge_conflict_markers_says_so(cli, small, tmp_path):
    """A golden file left mid-merge was "not a valid golden file (Expecting property name
    enclosed in double quotes: line 113 column 1)", the markers unnamed."""
    lines = small["golden"].read_text().splitlines(keepends=True)
    middle = len(lines) // 2
    conflicted = tmp_path / "g.json"
    conflicted.write_text(
        "".join(lines[:middle])
        + "<<<<<<< HEAD\n"
        + lines[middle]
        + "=======\n"
        + lines[middle]
        + ">>>>>>> other-branch\n"
        + "".join(lines[middle + 1 :])
    )
    result = cli("golden", "check", conflicted, small["merged"])
    one_line_error(result, "not a valid golden file", "conflict markers", "golden write")


def test_a_merged_run_of_another_batch_is_batch_size_against_a_golden_too(small, tmp_path):
    """A merged run at twice the batch: `compare` named `batch-size`, its golden check
    `data-order` (whose fix, the same sampler and seed, cures nothing): the golden keeps each
    batch's rows (`series.window_rows`)."""
    from gradalign import api

    doubled = api.record_merged(SMALL.replace(batch_size=32), tmp_path / "m32")
    assert json.loads(small["golden"].read_text())["series"]["window_rows"] == [16] * 4
    c = api.golden_check(small["golden"], doubled).comparison
    assert c.verdict == "fail" and c.diagnosis[0].code == "batch-size", c.diagnosis
    assert compare(read_run_dir(small["baseline"]), read_run_dir(doubled)).diagnosis[0].code == (
        "batch-size"
    )


def test_update_beside_another_environments_golden_says_the_file_stays(cli, small, tmp_path):
    """`golden check ci/mlp.json RUN --update`, ci/mlp.json another environment's golden: the
    run's golden is written beside it as ci/<key>.json with exit 0, and a gate naming
    ci/mlp.json still found none for this environment, without a word of it."""
    folder = tmp_path / "ci"
    folder.mkdir()
    other = json.loads(small["golden"].read_text())
    other["environment"]["torch"] = "0.0.1"  # a colleague's torch
    other["environment_key"] = fmt.environment_key(other["environment"])
    named = folder / "mlp.json"
    named.write_text(fmt.dumps(other))
    result = cli("golden", "check", named, small["baseline"], "--update")
    assert result.code == 0, result.err
    said = " ".join(result.out.split())
    assert f"wrote {folder / (_key(small['baseline']) + '.json')}" in said, said
    assert f"{named} holds another environment's golden and stays as it is" in said, said
    assert f"name the folder {folder} instead" in said
    assert cli("golden", "check", folder, small["merged"]).code == 0
