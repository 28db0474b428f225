"""Diagnoses and the noise floor, through the CLI and on runs altered in memory."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from gradalign.config import TrainConfig
from gradalign.judge.compare import compare
from gradalign.record.faults import FAULTS
from gradalign.record.loop import train
from gradalign.record.trainer import reference_path
from gradalign.runs.reader import read_run_dir

SMALL = ["--hidden", "32", "--updates", "4", "--batch-size", "32"]


@pytest.fixture(scope="session")
def sgd_runs(tmp_path_factory):
    """The default SGD training at a small size: baseline, its float64 reference, merged K=4."""
    root = tmp_path_factory.mktemp("sgd")
    config = TrainConfig(hidden=32, updates=4, batch_size=32)
    ref = train(config.replace(accum_steps=1, dtype="float64"), reference_path(root / "base"))
    base = train(config.replace(accum_steps=1), root / "base", reference=f"../{ref.name}")
    return {
        "config": config,
        "base": read_run_dir(base),
        "ref": read_run_dir(ref),
        "merged": read_run_dir(train(config, root / "merged")),
        "root": root,
    }


def errors(comparison) -> list[str]:
    return [d.code for d in comparison.diagnosis if d.severity == "error"]


@pytest.mark.parametrize(
    ("fault", "extra"),
    [
        ("no-loss-scale", []),
        ("step-every-micro", []),
        ("scheduler-every-micro", ["--scheduler", "linear"]),
        ("dropout-reseed", ["--model", "mlp-dropout"]),
    ],
)
def test_verify_with_a_fault_fails_with_its_code_in_json(cli, tmp_path, fault, extra):
    report = tmp_path / "r.json"
    result = cli("verify", *SMALL, *extra, "--fault", fault, "-o", tmp_path, "--json", report)
    assert result.code == 1, result.out + result.err
    data = json.loads(report.read_text())
    assert data["verdict"] == "fail"
    first = data["diagnosis"][0]
    assert set(first) >= {"code", "message", "evidence", "fix"}
    assert first["code"] == FAULTS[fault].code
    assert first["message"] and first["fix"] and first["evidence"]
    assert f"{first['code']}:" in result.out


def test_clean_verify_has_only_informational_diagnosis(cli, tmp_path):
    report = tmp_path / "r.json"
    result = cli("verify", *SMALL, "-o", tmp_path, "--json", report)
    assert result.code == 0, result.out + result.err
    data = json.loads(report.read_text())
    assert [d["severity"] for d in data["diagnosis"]] == ["info"]
    assert data["diagnosis"][0]["code"] == "within-noise"
    assert data["reference"].endswith("baseline-fp64")
    assert "x noise" in result.out and "within-noise" in result.out


def test_inapplicable_fault_is_refused_before_training(cli, tmp_path):
    result = cli("verify", *SMALL, "--fault", "clip-every-micro", "-o", tmp_path / "v")
    assert result.code == 2 and "needs clipping" in result.err
    assert not (tmp_path / "v").exists()
    assert cli("verify", *SMALL, "--fault", "nope", "-o", tmp_path / "v").code == 2


def test_the_fault_label_is_never_read_by_the_judge(cli, tmp_path):
    out = tmp_path / "v"
    assert cli("verify", *SMALL, "--fault", "zero-grad-every-micro", "-o", out).code == 1
    first = cli("compare", out / "baseline", out / "merged", "--json", tmp_path / "a.json")
    manifest = out / "merged" / "manifest.json"
    body = json.loads(manifest.read_text())
    assert body.pop("fault") == "zero-grad-every-micro"
    manifest.write_text(json.dumps(body))
    second = cli("compare", out / "baseline", out / "merged", "--json", tmp_path / "b.json")
    assert first.code == second.code == 1
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert a["diagnosis"] == b["diagnosis"] and a["diagnosis"][0]["code"] == "zero-grad-in-window"


def test_clean_runs_trigger_no_cause(sgd_runs):
    result = compare(sgd_runs["base"], sgd_runs["merged"], reference=sgd_runs["ref"])
    assert result.verdict == "pass" and errors(result) == []
    assert "1.0x" not in result.diagnosis[0].message  # a ratio, not a boilerplate
    plain = compare(sgd_runs["base"], sgd_runs["merged"])
    assert plain.verdict == "pass" and errors(plain) == []
    assert "no reference run" in plain.diagnosis[0].message


def test_a_pass_far_from_the_reference_names_the_tensor_and_what_it_is_allowed(sgd_runs):
    """The pass's summary may quote a ratio far above the table's "x noise" column (which shows
    each update's worst tensor by err/tol): it names the tensor behind it and its err/tol."""
    from gradalign.judge.diagnose import diagnose

    result = compare(sgd_runs["base"], sgd_runs["merged"], reference=sgd_runs["ref"])
    assert "update" not in result.diagnosis[0].message  # within the factor: nothing to point at
    last = result.results[-1]
    near = min(last.grads, key=lambda d: d.ratio)  # computed almost exactly by the baseline
    last.grads[last.grads.index(near)] = dataclasses.replace(near, noise=near.error / 250)
    message = diagnose(result)[0].message
    assert "at most 2.5e+02x as far" in message
    said = f"at {near.name} (grad) (update {last.update}), which stands at {near.ratio:.2g}x"
    assert said in message, message


def shifted(run, update_from: int, fraction: float, start):
    """The run with its weights moved by `fraction` of their displacement from update_from on."""

    def load(i):
        w = run.load_weights(i)
        if i < update_from:
            return w
        return {
            n: v + fraction * (v - start[n]) if v.dtype.kind == "f" else v for n, v in w.items()
        }

    return dataclasses.replace(run, load_weights=load)


def test_noise_floor_catches_what_the_fixed_tolerance_lets_pass(sgd_runs):
    """An SGD error of 3e-5 of the distance moved passes float32's weight_rtol of 1e-4, but the
    run's own noise is ~1e-6 of it: calibrated by the reference, the gate fails."""
    base, ref = sgd_runs["base"], sgd_runs["ref"]
    bad = shifted(sgd_runs["merged"], 2, 3e-5, base.init_weights())
    assert compare(base, bad).verdict == "pass"
    calibrated = compare(base, bad, reference=ref)
    assert calibrated.verdict == "fail"
    assert calibrated.first_divergence == {
        "update": 2,
        "parameter": "0.weight",
        "in": "optimizer update",
    }
    assert errors(calibrated) == ["unexplained"]  # no known signature: say so, do not guess
    unexplained = calibrated.diagnosis[0]
    assert "the merged run's may differ" in unexplained.message
    assert "compare REFERENCE MERGED64" in unexplained.fix  # the test that tells them apart
    worst = calibrated.results[2].weights[0]
    assert worst.error / worst.noise > 10


def _losses_scaled_from(run, update: int, factor: float):
    """The run with every micro-step loss from `update` on `factor` times as large."""
    loss = run.micro_loss.copy()
    loss[update * run.accum_steps :] *= factor
    return dataclasses.replace(run, micro_loss=loss)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize(("loss_from", "followed"), [(3, True), (2, True), (1, False)])
def test_losses_that_part_after_the_weights_keep_the_noise_hint(
    sgd_runs, reference, loss_from, followed
):
    """Weights apart from update 2 (1e-3 of their displacement: beyond the fixed tolerance and
    the run's noise), losses from `loss_from`: a loss parting at or after the weights follows
    them, and `unexplained` still says what noise the judge may not have measured (a kink,
    Adam's noise, a kernel chosen by shape) and how to tell (at once with them, from weights
    the runs shared: the forward chose otherwise); a loss parting before the weights is no such
    case, and the hint is left out."""
    base = sgd_runs["base"]
    bad = shifted(sgd_runs["merged"], 2, 1e-3, base.init_weights())
    c = compare(
        base,
        _losses_scaled_from(bad, loss_from, 1.01),
        reference=sgd_runs["ref"] if reference else None,
    )
    assert errors(c) == ["unexplained"]
    (unexplained,) = c.diagnosis
    assert "failed: losses, weights" in unexplained.message
    hint = "fixed tolerances, measured" if not reference else "the merged run's may differ"
    assert (hint in unexplained.message) is followed
    later = f"the losses part only from update {loss_from}" in unexplained.message
    at_once = f"the losses part at update {loss_from} with the gradients" in unexplained.message
    assert (later or at_once) is followed
    assert at_once is (loss_from == 2)  # with the weights, from weights the runs shared
    assert (unexplained.fix is not None and "float64" in unexplained.fix) is followed


def test_data_order_without_batch_digests_falls_back_to_update_0_loss(sgd_runs, tmp_path):
    config = sgd_runs["config"]
    merged = read_run_dir(train(config, tmp_path / "m", fault=FAULTS["data-order"]))
    base = dataclasses.replace(sgd_runs["base"], micro_data=None)
    result = compare(base, dataclasses.replace(merged, micro_data=None))
    assert {c.name: c.status for c in result.checks}["same samples per update"] == "not checked"
    assert errors(result) == ["data-order"]
    assert result.diagnosis[0].evidence["sample_digests"] == "not recorded"


def test_reference_must_be_the_same_training_and_more_precise(cli, sgd_runs, tmp_path):
    root = sgd_runs["root"]
    other = train(
        sgd_runs["config"].replace(accum_steps=1, dtype="float64", lr=0.05), tmp_path / "other"
    )
    result = cli("compare", root / "base", root / "merged", "--reference", other)
    assert result.code == 2 and "another training: lr" in result.err
    same = cli("compare", root / "base", root / "merged", "--reference", root / "base")
    assert same.code == 2 and "more precise" in same.err


def test_reference_none_and_a_missing_reference(cli, sgd_runs, tmp_path):
    root = sgd_runs["root"]
    plain = cli("compare", root / "base", root / "merged", "--reference", "none")
    assert plain.code == 0 and "x noise" not in plain.out
    base = shutil.copytree(root / "base", tmp_path / "base")  # its ../base-fp64 is not there
    result = cli("compare", base, root / "merged")
    assert result.code == 0
    assert "names a reference run" in result.out and "x noise" not in result.out


def test_batchnorm_needs_the_model_facts(sgd_runs, tmp_path):
    """The same numbers without BatchNorm in the model facts are not called batchnorm."""
    config = TrainConfig(model="cnn-bn", hidden=64, updates=2, batch_size=32)
    base = read_run_dir(train(config.replace(accum_steps=1), tmp_path / "b"))
    merged = read_run_dir(train(config, tmp_path / "m"))
    result = compare(base, merged)
    assert errors(result) == ["batchnorm"]
    tracked = result.diagnosis[0].evidence["num_batches_tracked_after_update_0"]
    assert tracked == {"merged": 4, "baseline": 1}
    hidden = compare(
        dataclasses.replace(base, model_facts={}), dataclasses.replace(merged, model_facts={})
    )
    assert "batchnorm" not in errors(hidden)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a diverged case's inf is no warning
def test_selftest_passes_and_prints_its_table(cli, tmp_path):
    report = tmp_path / "s.json"
    result = cli("selftest", "-o", tmp_path / "runs", "--json", report)
    assert result.code == 0, result.out
    data = json.loads(report.read_text())
    assert data["ok"] and len(data["cases"]) >= 20
    faults = {c["fault"] for c in data["cases"] if c["fault"]}
    assert faults == set(FAULTS)
    assert all(c["ok"] for c in data["cases"])
    clean = [c for c in data["cases"] if c["expected_verdict"] == "pass" and not c["skipped"]]
    assert all(c["verdict"] == "pass" and c["codes"] == [] for c in clean)
    assert "all cases as expected" in result.out
    assert not (tmp_path / "runs").exists()  # every case went as expected: no run is kept


def test_selftest_table_marks_a_wrong_case():
    from rich.console import Console

    from gradalign.selftest import Case, Outcome, render_selftest

    console = Console(record=True, width=120)
    wrong = Outcome(Case("sgd", "no-loss-scale"), "pass", [])
    render_selftest([wrong], console)
    text = console.export_text()
    assert not wrong.ok and "WRONG" in text and "1 wrong" in text


def test_selftest_case_that_cannot_be_judged_is_wrong_and_the_others_still_run(
    tmp_path, monkeypatch
):
    from rich.console import Console

    from gradalign import selftest
    from gradalign.errors import BadInput

    def judged(case, out, recorded):
        if case.setup == "adam":
            raise BadInput("reference is not a rerun")
        return real(case, out, recorded)

    real = selftest._run_case
    monkeypatch.setattr(selftest, "_run_case", judged)
    monkeypatch.setattr(selftest, "SETUPS", {**selftest.SETUPS, "sgd": {"updates": 2}})
    cases = [selftest.Case("adam"), selftest.Case("sgd")]
    outcomes = selftest.run_selftest(tmp_path, Console(quiet=True), cases)
    assert [o.verdict for o in outcomes] == ["error", "pass"]
    assert not outcomes[0].ok and "not a rerun" in outcomes[0].message and outcomes[1].ok


@pytest.mark.parametrize(("loss_norm", "codes"), [("items", []), ("mean", ["token-normalization"])])
def test_token_normalization_on_tiny_lm(tmp_path, loss_norm, codes):
    """Padded sequences give micro-batches unequal token counts: only `items` is right."""
    config = TrainConfig(model="tiny-lm", hidden=64, updates=3, batch_size=32, loss_norm=loss_norm)
    ref = read_run_dir(train(config.replace(accum_steps=1, dtype="float64"), tmp_path / "r"))
    base = read_run_dir(train(config.replace(accum_steps=1), tmp_path / "b"))
    merged = read_run_dir(train(config, tmp_path / "m"))
    result = compare(base, merged, reference=ref)
    assert errors(result) == codes
    assert result.verdict == ("fail" if codes else "pass")
    if codes:
        evidence = result.diagnosis[0].evidence
        assert len(set(evidence["items_per_micro_batch"])) > 1
        assert 0 < evidence["grad_rel_l2"] <= 2 * evidence["max_weight_error"]


@pytest.mark.parametrize(
    ("args", "dtype"), [(["--precision", "bf16"], "bfloat16"), (["--amp-level", "O1"], "float16")]
)
def test_mixed_precision_verify_passes_against_its_noise(cli, tmp_path, args, dtype):
    report = tmp_path / "r.json"
    result = cli("verify", *SMALL, *args, "-o", tmp_path / "v", "--json", report)
    assert result.code == 0, result.out + result.err
    data = json.loads(report.read_text())
    assert data["dtype"] == dtype and data["reference"] is not None


def test_fp16_scaler_bookkeeping_must_coincide(tmp_path):
    """The GradScaler's scale per window is recorded; windows that scaled (or skipped) otherwise
    than the baseline fail the optimizer-steps check."""
    config = TrainConfig(hidden=32, updates=3, batch_size=32, precision="fp16")
    base = read_run_dir(train(config.replace(accum_steps=1), tmp_path / "b"))
    merged = read_run_dir(train(config, tmp_path / "m"))
    assert merged.loss_scale is not None and merged.environment["compute_dtype"] == "float16"
    assert compare(base, merged).verdict == "pass"
    halved = merged.loss_scale.copy()
    halved[1] /= 2  # as if the merged run had met an overflow the baseline did not
    result = compare(base, dataclasses.replace(merged, loss_scale=halved))
    checks = {c.name: c for c in result.checks}
    assert checks["optimizer steps"].status == "fail"
    assert "loss scale" in checks["optimizer steps"].detail


@pytest.mark.parametrize("case", ["unexplained", "explained", "scaled"])
def test_a_baseline_strays_from_its_reference_as_far_as_its_gradient_noise_explains(sgd_runs, case):
    """Every element of a reference steps by δ along a gradient of one size. In the output bias
    the baseline steps 1.2·δ: 20% of the distance moved, far past the 1% a rerun may stray.
    "unexplained": the gradients agree, and the reference is refused. "explained": the bias's
    gradient is 1.2 times the reference's (noise 20% of it, below the noise-dominated line), a
    first-order step error explains the stray (judge/drift.py, `noise_steps`), and the reference
    is kept, as an AdamW MLP's output bias that strayed 2.4% on an Intel host now is. "scaled":
    every gradient is 1.2 times the reference's, as with a wrong loss scale, and the reference
    is refused at update 0 by its gradients."""
    from gradalign.errors import BadInput

    base, ref = sgd_runs["base"], sgd_runs["ref"]
    start = base.load_init_weights()
    pattern = {
        n: np.where(np.arange(v.size) % 3 == 0, -1.0, 1.0).reshape(v.shape)
        for n, v in start.items()
    }
    bias = "2.bias"

    def walk(scale, dtype):
        def load(i):
            steps = {n: (i + 1) * 1e-3 * pattern[n] for n in start}
            steps[bias] = steps[bias] * scale
            return {n: (start[n] + steps[n]).astype(dtype) for n in start}

        return load

    def gradient(scale, everywhere, dtype):
        scales = {n: scale if everywhere or n == bias else 1.0 for n in start}
        return lambda i: {n: (scales[n] * pattern[n]).astype(dtype) for n in start}

    reference = dataclasses.replace(
        ref,
        load_init_weights=lambda: {n: v.astype(np.float64) for n, v in start.items()},
        load_weights=walk(1.0, np.float64),
        load_grads=gradient(1.0, False, np.float64),
    )
    strayed = dataclasses.replace(
        base,
        load_weights=walk(1.0 if case == "scaled" else 1.2, np.float32),
        load_grads=gradient(1.0 if case == "unexplained" else 1.2, case == "scaled", np.float32),
    )
    if case == "explained":
        assert compare(strayed, sgd_runs["merged"], reference=reference).verdict in ("pass", "fail")
        return
    said = "its gradients are 0.2 of their size" if case == "scaled" else f"baseline's {bias}"
    with pytest.raises(
        BadInput, match=f"not a rerun of the baseline's training: at update 0.*{said}"
    ):
        compare(strayed, sgd_runs["merged"], reference=reference)


def test_reference_whose_weights_stray_is_refused(sgd_runs):
    """Same config and samples, but weights far from the baseline's: not a rerun, exit 2."""
    from gradalign.errors import BadInput

    ref = sgd_runs["ref"]

    def load(i):
        return {n: v * 1.5 if i == 2 else v for n, v in ref.load_weights(i).items()}

    with pytest.raises(BadInput, match="not a rerun of the baseline's training: at update 2"):
        compare(
            sgd_runs["base"],
            sgd_runs["merged"],
            reference=dataclasses.replace(ref, load_weights=load),
        )


@pytest.mark.parametrize(
    "ratio, said", [(1.00002, "1.00002"), (0.99998, "0.99998"), (1.0, "1"), (0.25, "0.25")]
)
def test_a_ratio_near_one_is_said_with_the_digits_that_tell_it_from_one(ratio, said):
    """loss-averaging said "the merged window losses are 1 times the baseline's" of losses
    that differed (the ratio at 4 digits)."""
    from gradalign.judge.signatures.common import times

    assert times(ratio) == said
