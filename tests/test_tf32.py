"""TF32: float32 math a GPU ran on tensor cores (cuDNN's convolutions by default from Ampere on)
rounds its inputs to float16's 10 mantissa bits. The Recorder lists where (`tf32_uses`), the
run computes in "tf32", and the judge accepts a float64 reference within that rounding and
applies float16's fixed tolerances without one. On the CPU the rounding is emulated
(bench/zoo_tf32.py): a float32 convolution's inputs, weights and incoming gradients rounded to
10 bits, as on the GPU, where a zoo batch (`scripts/gpu_check.sh ... zoo`, H200) refused the
reference of 11 of 25 wide convolutional runs (their gradients 1.1-1.6% from the float64
rerun's at update 0, more than the 1% a float32 run may stray)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import pytest
import torch
from torch import nn

import gradalign
import gradalign.record.device as device_module
from bench.zoo_tf32 import CONVOLUTIONS, tf32_forward
from gradalign.errors import BadInput
from gradalign.judge.compare import compare
from gradalign.judge.compatible import _tf32_hint
from gradalign.record.tf32 import tf32_uses
from gradalign.runs.reader import read_run_dir
from tests.conftest import ROOT, one_line_error
from tests.zoo_runs import _compare, zoo

CUDA = torch.device("cuda")


@pytest.fixture
def tf32_convolutions(monkeypatch):
    """float32 convolutions computed as TF32 tensor cores do (bench/zoo_tf32.py)."""
    for kind in CONVOLUTIONS:
        monkeypatch.setattr(kind, "_conv_forward", tf32_forward(kind._conv_forward))


@pytest.fixture
def listed(monkeypatch):
    """The Recorder lists cuDNN's TF32 for float32 runs, as on an Ampere GPU with a conv."""
    monkeypatch.setattr(
        device_module,
        "tf32_uses",
        lambda model, device, dtype: ["cudnn"] if dtype == torch.float32 else [],
    )


def _wide_conv_runs(root, declared: str | None = None, **merged):
    """bench/model_zoo.py's convolutional text model at width 4 (AdamW, K=8, 6 updates, seed
    144002): the emulated TF32 moves its gradients 1.96% from the float64 rerun's at update 0."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        length = {"updates": 6, "width": 4}
        both = {**length, "compute_dtype": declared}
        zoo.record(root / "ref", "convtext", "adamw-wd", 1, 144002, float64=True, **length)
        zoo.record(root / "base", "convtext", "adamw-wd", 1, 144002, reference="../ref", **both)
        zoo.record(root / "merged", "convtext", "adamw-wd", 8, 144002, **both, **merged)
    finally:
        torch.set_num_threads(threads)
    return root


def test_unlisted_tf32_refuses_the_reference(tmp_path, tf32_convolutions):
    """Without the Recorder's list the run is judged as float32, and the reference refused: the
    emulation shows the GPU's failure."""
    root = _wide_conv_runs(tmp_path)
    assert read_run_dir(root / "base").compute_dtype == "float32"
    with pytest.raises(BadInput, match="is not a rerun of the baseline's training"):
        _compare(root)


def test_listed_tf32_passes_clean_and_names_a_bug(tmp_path, tf32_convolutions, listed):
    """Listed, the run computes in tf32: the reference is accepted and the clean merged run
    passes, with the reference and with the fixed tolerances; a loss not divided by K from
    update 3 on still fails, named `loss-scale`."""
    root = _wide_conv_runs(tmp_path / "clean")
    base = read_run_dir(root / "base")
    assert base.environment["tf32"] == ["cudnn"] and base.compute_dtype == "tf32"
    assert read_run_dir(root / "ref").compute_dtype == "float64"
    c = _compare(root)
    assert c.verdict == "pass" and c.dtype == "tf32", [d.code for d in c.diagnosis]
    alone = compare(base, read_run_dir(root / "merged"))  # by the fixed tolerances
    assert alone.verdict == "pass" and alone.tolerances.grad_rtol == 5e-2
    bug = _wide_conv_runs(tmp_path / "bug", bug="no-loss-scale", bug_from=3)
    c = _compare(bug)
    assert c.verdict == "fail"
    assert [d.code for d in c.diagnosis if d.severity == "error"][:1] == ["loss-scale"]


def test_a_loop_may_declare_tf32(tmp_path, tf32_convolutions):
    """`Recorder(..., compute_dtype="tf32")`, for TF32 the Recorder cannot see (a functional
    convolution): the same as listed."""
    root = _wide_conv_runs(tmp_path, declared="tf32")
    assert read_run_dir(root / "base").compute_dtype == "tf32"
    assert _compare(root).verdict == "pass"


@pytest.fixture
def precisions():
    """torch's TF32 settings at their defaults, every level of the per-operator API put back
    after the test."""
    b = torch.backends
    levels = [b, b.cuda.matmul, b.cudnn, b.cudnn.conv, b.cudnn.rnn, b.mkldnn]
    levels += [b.mkldnn.matmul, b.mkldnn.conv]
    saved = [level.fp32_precision for level in levels]
    for level, value in zip(levels[:5], ["none", "none", "none", "tf32", "tf32"], strict=True):
        level.fp32_precision = value  # torch's defaults (a test before may have set others)
    yield b
    for level, value in zip(levels, saved, strict=True):
        level.fp32_precision = value


def test_tf32_uses_follows_the_device_the_settings_and_the_layers(monkeypatch, precisions):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    conv, linear = nn.Sequential(nn.Conv1d(2, 2, 3)), nn.Sequential(nn.Linear(2, 2))
    assert tf32_uses(conv, CUDA, torch.float32) == ["cudnn"]  # torch's defaults
    assert tf32_uses(nn.GRU(2, 2), CUDA, torch.float32) == ["cudnn"]
    assert tf32_uses(linear, CUDA, torch.float32) == []
    assert tf32_uses(conv, torch.device("cpu"), torch.float32) == []
    assert tf32_uses(conv, CUDA, torch.float64) == []
    torch.set_float32_matmul_precision("high")
    assert tf32_uses(linear, CUDA, torch.float32) == ["cublas"]
    torch.set_float32_matmul_precision("highest")
    assert tf32_uses(linear, CUDA, torch.float32) == []
    precisions.cuda.matmul.fp32_precision = "tf32"  # the per-operator API, beside the defaults
    precisions.cudnn.conv.fp32_precision = "ieee"
    assert tf32_uses(conv, CUDA, torch.float32) == ["cublas"]
    assert tf32_uses(nn.GRU(2, 2), CUDA, torch.float32) == ["cudnn", "cublas"]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    assert tf32_uses(conv, CUDA, torch.float32) == []  # before Ampere: no TF32


def test_the_recorder_reads_torchs_per_operator_settings(tmp_path, precisions):
    """A loop that set TF32 through torch's per-operator API: torch's legacy getters raise
    then (they did inside Recorder(...)); the manifest says what was set."""
    precisions.cuda.matmul.fp32_precision = "tf32"
    with pytest.raises(RuntimeError):
        _ = torch.backends.cuda.matmul.allow_tf32
    model = nn.Linear(2, 2)
    with gradalign.Recorder(tmp_path / "run", model, torch.optim.SGD(model.parameters())) as rec:
        model(torch.ones(1, 2)).sum().backward()
        rec.micro(torch.tensor(1.0))
        rec.update()
    env = read_run_dir(tmp_path / "run").environment
    assert env["matmul_allow_tf32"] is True and env["cudnn_allow_tf32"] is True


def test_a_refusal_on_cuda_names_tf32_where_the_run_does_not_list_it():
    env = {"device": "cuda:0", "dtype": "float32", "cudnn_allow_tf32": True}
    run = types.SimpleNamespace(environment=env)
    assert "cudnn_allow_tf32" in _tf32_hint(run) and 'fp32_precision = "ieee"' in _tf32_hint(run)
    for other in ({"tf32": ["cudnn"]}, {"cudnn_allow_tf32": False}, {"dtype": "float64"}):
        assert _tf32_hint(types.SimpleNamespace(environment={**env, **other})) == "", other


def test_a_tf32_list_of_another_type_is_bad_input(cli, small_copy):
    manifest_path = small_copy["baseline"] / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["environment"]["tf32"] = "cudnn"
    manifest_path.write_text(json.dumps(manifest))
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    one_line_error(result, "environment.tf32")


def test_the_gpu_check_script_runs_its_loop_on_the_cpu(monkeypatch, precisions, capsys):
    """scripts/gpu_tf32_check.py (scripts/gpu_check.sh on a GPU): on the CPU nothing is listed."""
    path = ROOT / "scripts" / "gpu_tf32_check.py"
    spec = importlib.util.spec_from_file_location("tf32_check", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(sys, "argv", ["gpu_tf32_check.py", "--device", "cpu"])
    assert script.main() == 0 and "as expected" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["gpu_tf32_check.py"])
    assert script.main() == 2  # the suite hides CUDA
