"""Golden files that cannot be trusted are refused, one line and exit 2, never a crash or a
pass: NaN/Inf in it or in the run it would be written from, hand edits and merges gone wrong,
wrong bookkeeping fields, numbers no one tensor could have, another sketch size, numbers that
would overflow the judge."""

from __future__ import annotations

import json

import pytest

from gradalign import api
from gradalign.errors import BadInput

from .conftest import one_line_error


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_in_a_golden_are_refused(cli, small, tmp_path, bad):
    data = json.loads(small["golden"].read_text())
    noise = data["per_update"][1]["weights"]["0.weight"]["noise"]
    text = small["golden"].read_text().replace(repr(noise), bad, 1)
    assert bad in text
    broken = tmp_path / "broken.json"
    broken.write_text(text)
    result = cli("golden", "check", broken, small["merged"])
    assert result.code == 2 and "finite" in result.err, result.err


def test_a_golden_of_a_diverged_run_is_refused(tmp_path):
    import torch

    import gradalign

    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradalign.Recorder(tmp_path / "nan", model, opt) as rec:
        (model(torch.ones(2, 3)).sum() * float("nan")).backward()
        rec.micro(torch.tensor(float("nan")))
        opt.step()
        rec.update()
    with pytest.raises(BadInput, match="finite"):
        api.golden_write(tmp_path / "nan", tmp_path / "g.json")
    assert not (tmp_path / "g.json").exists()


def _mutations() -> dict:
    """Hand edits and merges gone wrong: each must be one line and exit 2, never a crash."""

    def set_path(data: dict, path: list, value) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value

    cases = {
        "no tensors": (["tensors"], []),
        "shape missing": (["tensors", 0, "shape"], None),
        "lr a string": (["series", "lr"], ["0.1"] * 4),
        "loss too short": (["series", "window_loss"], [1.0]),
        "unknown series": (["series", "surprise"], [1, 2, 3, 4]),
        "samples not hex": (["series", "window_samples"], ["zz"] * 4),
        "fingerprints": (["init_fingerprints"], ["0"]),
        "sketch length": (["per_update", 0, "weights", "0.weight", "sketch"], [1.0]),
        "no norm": (["per_update", 1, "grads", "0.bias", "norm"], "big"),
        "no noise": (["per_update", 2, "weights", "0.bias", "noise"], None),
        "updates zero": (["updates"], 0),
        "world size": (["environment", "world_size"], "x" * 10_000),
        "huge key": (["environment_key"], "k" * 100_000),
        "per_update": (["per_update"], {}),
        "source null": (["source"], None),
        "source a string": (["source"], "x"),
        "reference dtype unknown": (["reference_dtype"], "float128"),
        # these three were exit 3 ("internal error") or passed: a golden is data from a repository
        "a dtype of a list": (["tensors", 0, "dtype"], [[1]]),
        "a noise beyond int64": (["per_update", 0, "weights", "0.bias", "noise"], 2**70),
        "a negative norm": (["per_update", 1, "grads", "0.bias", "norm"], -1.0),
        # a weight's drift widens its noise: none below 0, none past the judge's sums
        "a negative drift": (["per_update", 1, "weights", "0.bias", "drift"], -1.0),
        "a drift a string": (["per_update", 1, "weights", "0.bias", "explained"], "1"),
        "a drift past 1e300": (["per_update", 1, "weights", "0.weight", "drift"], 1e308),
        # accepted where a run manifest refuses them: true equals 1, the key reads str() of these
        "version true": (["format_version"], True),
        "dtype an object": (["environment", "dtype"], {}),
        "device a list": (["environment", "device"], []),
        # read as int64 and judged "identical": 1.9 steps became 1
        "steps not whole": (["series", "optimizer_steps"], [1.9, 1, 1, 1]),
        "steps negative": (["series", "optimizer_steps"], [-1, 1, 1, 1]),
        # a clip's bookkeeping: whole counts, thresholds from 0 or null
        "clip calls negative": (["series", "clip_calls"], [1, -1, 1, 1]),
        "clip calls not whole": (["series", "clip_calls"], [1, 1.5, 1, 1]),
        "max_norm a string": (["series", "clip_max_norm"], ["1", None, 1.0, 1.0]),
        "clip_value negative": (["series", "clip_value"], [-0.5, None, 0.5, 0.5]),
        "thresholds too short": (["series", "clip_max_norm"], [1.0]),
    }
    return {
        name: (lambda d, p=path, v=value: set_path(d, p, v))
        for name, (path, value) in cases.items()
    }


@pytest.mark.parametrize("mutation", sorted(_mutations()))
def test_a_malformed_golden_is_one_line_and_exit_2(cli, small, tmp_path, mutation):
    data = json.loads(small["golden"].read_text())
    _mutations()[mutation](data)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    result = cli("golden", "check", broken, small["merged"])
    assert result.code == 2, (result.code, result.err)
    assert result.err.startswith("error: ") and result.err.count("\n") == 1
    assert "Traceback" not in result.err and len(result.err) < 600


def test_a_golden_without_a_format_version_says_so(cli, small, tmp_path):
    data = json.loads(small["golden"].read_text())
    del data["format_version"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    result = cli("golden", "check", broken, small["merged"])
    assert result.code == 2 and "the golden file names no format_version" in result.err


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (["recorded_accum_steps"], None),
        (["recorded_accum_steps"], 0),
        (["recorded_accum_steps"], "4"),
        (["per_update", 2, "update"], 7),
        (["per_update", 2, "update"], None),
        (["per_update", 1, "update"], True),  # True == 1, yet not an update's index
    ],
    ids=repr,
)
def test_a_golden_with_wrong_bookkeeping_fields_is_refused(cli, small, tmp_path, path, value):
    """`recorded_accum_steps` (K of the run it was written from) and `per_update[i].update` (i)
    are always written so; a golden that says otherwise was edited or merged wrong: one line,
    exit 2, naming the field."""
    data = json.loads(small["golden"].read_text())
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    field = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")
    result = cli("golden", "check", broken, small["merged"])
    one_line_error(result, f"golden field '{field}'")


def _scaled(data: dict, path: list, factor: float | None, value: float | None = None) -> None:
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value if factor is None else target[path[-1]] * factor


@pytest.mark.parametrize(
    ("path", "factor", "value", "field"),
    [
        # a norm is judged only without a reference; with one it must still be one the
        # tensor could have (once 1e21 and 0 passed `golden check` unseen)
        (["per_update", 0, "grads", "0.weight", "norm"], None, 1e21, "norm"),
        (["per_update", 0, "grads", "0.weight", "norm"], None, 0.0, "norm"),
        (["per_update", 1, "weights", "0.weight", "reference", "norm"], 1.001, None, "norm"),
        (["per_update", 1, "weights", "2.bias", "reference", "norm"], None, 0.0, "norm"),
        # the noise widens every allowed bound: more than the build accepts is refused
        (["per_update", 2, "weights", "2.bias", "noise"], 1e6, None, "noise"),
        (["per_update", 0, "grads", "2.weight", "noise"], 1e6, None, "noise"),
    ],
    ids=repr,
)
def test_a_golden_whose_numbers_cannot_be_one_tensor_is_refused(
    cli, small, tmp_path, path, factor, value, field
):
    data = json.loads(small["golden"].read_text())
    _scaled(data, path, factor, value)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    result = cli("golden", "check", broken, small["merged"])
    one_line_error(result, str(broken), field, "golden write")


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda losses: [-1.0] * len(losses), "series.window_loss"),  # as a probe edited it
        (lambda losses: [losses[0] + 5, *losses[1:]], "series.window_loss"),
        (lambda losses: [-1.0 for _ in losses], "series.window_items"),
    ],
    ids=["every loss -1", "one loss 5 higher", "items below 0"],
)
def test_a_golden_whose_series_were_edited_is_refused(cli, small, tmp_path, edit, field):
    """The baseline's loss noise against its reference widens the losses' allowed error: a
    golden whose window losses were edited (every one -1, or one 5 higher) passed a merged run
    with a loss K times too large; negative item counts passed too."""
    data = json.loads(small["golden"].read_text())
    series = data["series"]
    assert "reference_window_loss" in series
    key = field.removeprefix("series.")
    series[key] = edit(series.get(key, series["window_loss"]))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    one_line_error(cli("golden", "check", broken, small["merged"]), f"golden field '{field}'")


def test_a_golden_of_another_sketch_size_is_refused(cli, small, tmp_path):
    """The judge projects the run onto SKETCH_SIZE directions: a golden that keeps another
    number (its sketches cut to match) was an internal error, a matmul of mismatched sizes."""
    data = json.loads(small["golden"].read_text())
    data["sketch_size"] = 1

    def cut(item: dict) -> None:
        item["sketch"] = item["sketch"][:1]
        if "reference" in item:
            cut(item["reference"])

    for entry in data["per_update"]:
        for kind in ("weights", "grads"):
            for item in entry[kind].values():
                cut(item)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    result = cli("golden", "check", broken, small["no-loss-scale"])
    one_line_error(result, "golden field 'sketch_size' must be 8")


def test_a_golden_whose_numbers_overflow_the_judge_is_refused(cli, small, tmp_path):
    """A norm, its reference's and the noise all 1.7e308 were consistent (their sums overflowed
    to inf, and so did every slack), and noise_factor x noise was inf: that tensor's check could
    not fail (a clean run passed; this bug is still caught by its losses). Summaries are bounded
    by 1e300, so that the judge's arithmetic stays finite."""
    data = json.loads(small["golden"].read_text())
    item = data["per_update"][1]["weights"]["0.weight"]
    item["norm"] = item["reference"]["norm"] = item["noise"] = 1.7e308
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    result = cli("golden", "check", broken, small["no-loss-scale"])
    one_line_error(result, "per_update[1].weights", "from 0 to 1e+300")


@pytest.mark.parametrize("version", [1, 2])
def test_goldens_of_format_versions_1_and_2_are_read(cli, small, tmp_path, version):
    """Version 2 added a weight's drift and the clips' series; a version 1 file (the fixture,
    fixtures/golden/, among them) is read as it was. Version 3 is refused in one line."""
    data = json.loads(small["golden"].read_text())
    assert data["format_version"] == 2
    data["format_version"] = version
    for entry in data["per_update"] if version == 1 else []:
        for item in entry["weights"].values():
            item.pop("drift", None)
            item.pop("explained", None)
    older = tmp_path / "g.json"
    older.write_text(json.dumps(data))
    assert cli("golden", "check", older, small["merged"]).code == 0
    data["format_version"] = 3
    older.write_text(json.dumps(data))
    one_line_error(cli("golden", "check", older, small["merged"]), "this gradalign reads 1 and 2")


@pytest.mark.parametrize(
    "text, said",
    [
        ('{"format": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"format": 1' + "0" * 100_000 + "}", "a number of thousands of digits"),
    ],
    ids=["deep", "long-number"],
)
def test_a_golden_too_deep_or_too_long_to_read_is_named(cli, small, tmp_path, text, said):
    """Refused before without the file's name ("input nested too deeply to read") or with
    Python's advice to call sys.set_int_max_str_digits()."""
    broken = tmp_path / "broken.json"
    broken.write_text(text)
    result = cli("golden", "check", broken, small["merged"])
    one_line_error(result, "broken.json: not a valid golden file", said)
    assert "set_int_max_str_digits" not in result.err
