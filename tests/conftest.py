"""Shared fixtures: small recorded runs, built once per session, and a CLI runner."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

# The suite checks the CPU paths, the same on a GPU machine as on CI (scripts/gpu_check.sh runs
# the CUDA ones): CUDA is hidden before anything initializes it, here and in every process the
# tests launch (examples pick nccl where CUDA is present; torch's PowerSGD hook synchronizes CUDA
# whenever it is available, also for gloo on the CPU). Reports print at gradalign's own width for
# output that is not a terminal, whatever COLUMNS the caller's shell exported.
# GRADALIGN_TEST_CUDA=1 leaves CUDA visible, for the device tests that gpu_check.sh selects
# (parametrized by `DEVICES` in tests/devices.py; skipped where CUDA is absent).
if os.environ.get("GRADALIGN_TEST_CUDA") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.pop("COLUMNS", None)

from gradalign.cli import main
from gradalign.config import TrainConfig
from gradalign.record.loop import train
from gradalign.runs.portable import write_run

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SMALL = TrainConfig(hidden=32, updates=4, batch_size=16, accum_steps=4)


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self, path: Path) -> dict:
        return json.loads(path.read_text())


def write_w_run(path: Path, k: int, init, weights: list, grads: list, **options) -> Path:
    """A run of one tensor `w` written with numpy (the run format): its initial weights, and
    per update its weights and gradient; each micro-batch's loss 1 / (update + 1)."""
    return write_run(
        path,
        accum_steps=k,
        micro_losses=[1.0 / (u + 1) for u in range(len(weights)) for _ in range(k)],
        init_weights={"w": init},
        update_weights=[{"w": w} for w in weights],
        grads=[{"w": g} for g in grads],
        **options,
    )


def rewrite_tensor_file(run: Path, relpath: str, edit, manifest: dict | None = None) -> None:
    """Change one tensor file of a run (`edit` takes its {name: array}) and list its new
    checksum: damage only the checks after the checksums see. Into `manifest` where the caller
    edits the manifest too (and writes it), else into the run's own."""
    from gradalign.runs import tensors
    from gradalign.runs.checksums import declared, of_file

    own = manifest is None
    manifest = json.loads((run / "manifest.json").read_text()) if own else manifest
    data = tensors.read(run / relpath, relpath)
    edit(data)
    (run / relpath).write_bytes(tensors.encode(data))
    manifest["files"][relpath] = of_file(run / relpath, declared(manifest))
    if own:
        (run / "manifest.json").write_text(json.dumps(manifest))


def one_line_error(result: CliResult, *fragments: str, code: int = 2) -> None:
    """Bad input: exit 2 (or `code`), one line on stderr starting "error: ", no traceback."""
    assert result.code == code, (result.code, result.out, result.err)
    err = result.err.strip()
    assert err.startswith("error: "), err
    assert "\n" not in err, err
    assert "Traceback" not in result.err + result.out
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def write_log(tmp_path: Path, name: str, lines: list[str]) -> Path:
    """A log file of `lines` in tmp_path."""
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def still_runs(folder: Path, weights: dict, grads: bool = False) -> list[Path]:
    """A baseline (K=1) and a merged run (K=2) of 3 updates written by the numpy reference
    writer, whose weights never move and whose loss is 2.0 throughout; with `grads`, the
    gradient of `w` recorded as its weights."""
    import numpy as np

    from gradalign.runs.portable import write_run

    return [
        write_run(
            folder / f"k{k}",
            accum_steps=k,
            micro_losses=np.full(3 * k, 2.0),
            init_weights=weights,
            update_weights=[weights] * 3,
            grads=[{"w": weights["w"]}] * 3 if grads else None,
        )
        for k in (1, 2)
    ]


def refused_pair(cli, tmp_path: Path, lines: list[str], *fragments: str) -> None:
    """`compare` of two copies of a log is one line saying `fragments`."""
    base, merged = write_log(tmp_path, "base.log", lines), write_log(tmp_path, "merged.log", lines)
    one_line_error(cli("compare", str(base), str(merged)), *fragments)


@pytest.fixture
def cli(capsys):
    """Run `gradalign ARGS` in-process; returns exit code, stdout and stderr."""

    def run(*args: str | Path) -> CliResult:
        with pytest.raises(SystemExit) as exit_info:
            main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(int(exit_info.value.code or 0), captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def small_runs(tmp_path_factory) -> dict[str, Path]:
    """A small baseline and its merged run (K=4), recorded once; copy before altering."""
    root = tmp_path_factory.mktemp("small")
    return {
        "baseline": train(SMALL.replace(accum_steps=1), root / "baseline"),
        "merged": train(SMALL, root / "merged"),
    }


@pytest.fixture
def small_copy(small_runs, tmp_path) -> dict[str, Path]:
    """Private copies of the small runs, free to damage."""
    return {name: Path(shutil.copytree(path, tmp_path / name)) for name, path in small_runs.items()}


@pytest.fixture(scope="session")
def small(tmp_path_factory) -> dict[str, Path]:
    """The golden tests' runs (tests/test_golden_*.py): a small baseline with its float64
    reference, merged runs (clean and with bugs) and the baseline's golden file, recorded once."""
    from gradalign import api

    root = tmp_path_factory.mktemp("golden")
    api.record_baseline(SMALL, root / "baseline")
    runs = {"baseline": root / "baseline", "root": root}
    runs["merged"] = api.record_merged(SMALL, root / "merged")
    for fault in ("no-loss-scale", "step-every-micro", "data-order"):
        runs[fault] = api.record_merged(SMALL, root / fault, fault=fault)
    runs["golden"] = api.golden_write(root / "baseline", root / "golden")
    return runs
