"""Data parallel launches, each its own: `--nproc` checked before any work, a rank killed
mid-run (the earlier run kept whole), ranks that cannot start, the hand-written DDP and FSDP
loops of examples/ under torchrun on 2 ranks, and `verify --nproc 2` at the default size.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from gradalign.runs.reader import read_run_dir

from .conftest import one_line_error
from .test_distributed import dist  # noqa: F401 (its gloo check skips this module too)


def test_nproc_is_checked_before_any_work(cli, tmp_path):
    out = tmp_path / "v"
    result = cli("verify", "--nproc", "3", "-k", "2", "--batch-size", "32", "-o", out)
    one_line_error(result, "not divisible by nproc x accum_steps")
    one_line_error(cli("merged", "--fault", "dp-sampler", "-o", out), "needs data parallel")
    one_line_error(
        cli("merged", "--nproc", "2", "--fault", "dp-batchnorm", "-o", out), "needs a model"
    )
    assert not out.exists()


KILLER = """
import os, signal

import torch.distributed as dist
import torch.nn.functional as F

calls = 0


def loss_sum(outputs, targets):
    global calls
    calls += 1
    if dist.is_initialized() and dist.get_rank() == 1 and calls == 6:
        os.kill(os.getpid(), signal.SIGKILL)  # rank 1 dies in the middle of update 1
    return F.cross_entropy(outputs, targets, reduction="sum"), int(targets.shape[0])
"""


def test_killing_one_rank_leaves_the_earlier_run_and_nothing_else(cli, tmp_path):
    (tmp_path / "killer.py").write_text(KILLER)
    args = ["--hidden", "16", "--updates", "4", "--batch-size", "16", "-k", "2"]
    loss = ["--loss", f"{tmp_path / 'killer.py'}:loss_sum"]
    out = tmp_path / "runs" / "merged"
    assert cli("merged", *args, *loss, "-o", out).code == 0  # an earlier run, one process
    before = (out / "manifest.json").read_bytes()
    result = cli("merged", *args, *loss, "--nproc", "2", "-o", out)
    assert result.code == 2 and "Traceback" not in result.err, result.err
    last = result.err.strip().splitlines()[-1]  # after the progress lines, one error line
    assert last.startswith("error: rank 1 was killed by SIGKILL") and "no run was written" in last
    assert (out / "manifest.json").read_bytes() == before
    assert read_run_dir(out).world_size == 1  # the earlier run, whole and readable
    assert sorted(p.name for p in out.parent.iterdir()) == ["merged"]  # no partial, no area


def test_ranks_that_cannot_start_say_so_before_any_work(cli, tmp_path, monkeypatch):
    """Without gloo (faked here), --nproc is one line of bad input and nothing is trained."""
    import torch.distributed

    monkeypatch.setattr(torch.distributed, "is_gloo_available", lambda: False)
    out = tmp_path / "v"
    one_line_error(cli("verify", "--nproc", "2", "-o", out), "needs the gloo backend")
    assert not out.exists()


ROOT = Path(__file__).resolve().parent.parent
# the ranks import this checkout's gradalign, not whichever the environment installed
RANK_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _torchrun(script: str, *args: str | Path) -> subprocess.CompletedProcess:
    """`script` under torchrun on 2 ranks. Run once more where a rank was aborted (SIGABRT):
    the examples leave by `os._exit` after destroying the process group, as torch 2.13's gloo
    can abort the interpreter's teardown, yet one rank of the FSDP example still aborted once in
    five runs of the suite here (its next 10 launches passed; its stderr was not kept). An abort
    the example causes repeats, and fails. Its runs are rewritten whole."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(ROOT / "examples" / script), *map(str, args)]
    for _ in range(2):
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=RANK_ENV)
        if done.returncode == 0 or "SIGABRT" not in done.stderr:
            break
    return done


def _why(done: subprocess.CompletedProcess) -> str:
    """A failed launch, told: its ranks' own error lines first (the launcher's summary that ends
    stderr would hide them), then the ends of both streams."""
    said = [line for line in done.stderr.splitlines() if _RANK_ERROR.search(line)]
    return "\n".join([*said[:20], done.stdout[-1000:], done.stderr[-2000:]])


_RANK_ERROR = re.compile(r"terminate called|Fatal Python|Error|Abort|what\(\)", re.IGNORECASE)


def test_a_hand_written_ddp_loop_under_torchrun(cli, tmp_path):
    """examples/ddp_accumulation.py under torchrun: the clean loop passes; the same loop with
    DDP's sync flag set after the forward fails with replicas-diverged."""
    done = _torchrun("ddp_accumulation.py", tmp_path)
    assert done.returncode == 0, _why(done)
    manifest = json.loads((tmp_path / "merged" / "manifest.json").read_text())
    assert manifest["distributed"]["launcher"] == "torchrun"
    assert "distributed" not in json.loads((tmp_path / "baseline" / "manifest.json").read_text())
    clean = cli("compare", tmp_path / "baseline", tmp_path / "merged")
    assert clean.code == 0, clean.out
    report = tmp_path / "r.json"
    bad = cli(
        "compare", tmp_path / "baseline", tmp_path / "merged-sync-after-forward", "--json", report
    )
    assert bad.code == 1
    assert json.loads(report.read_text())["diagnosis"][0]["code"] == "replicas-diverged"


def test_a_hand_written_fsdp_loop_under_torchrun(cli, tmp_path):
    """examples/fsdp_accumulation.py under torchrun: parameters sharded by fully_shard (DTensors)
    are recorded whole, the gradient norms clip_grad_norm_ returns as DTensors too. Reduced once
    per window or at every micro-step, the loop passes, in float32 and with bfloat16 parameters
    in the forward (its baseline sharded alike on one rank); its loss not divided by K is named,
    and so is a gradient never reduce-scattered (sync off at every micro-step).
    A float32 baseline against the bfloat16 merged run is refused: other precisions."""
    for precision in ("fp32", "bf16"):
        flags = ["--bf16"] if precision == "bf16" else []
        done = _torchrun("fsdp_accumulation.py", tmp_path / precision, *flags)
        assert done.returncode == 0, _why(done)
        runs = tmp_path / precision
        merged = read_run_dir(runs / "merged")
        assert merged.world_size == 2 and merged.grad_norm_pre_clip is not None
        assert merged.compute_dtype == ("bfloat16" if precision == "bf16" else "float32")
        for clean in ("merged", "merged-sync-each"):
            passed = cli("compare", runs / "baseline", runs / clean)
            assert passed.code == 0, passed.out
        report = runs / "r.json"
        bad = cli("compare", runs / "baseline", runs / "merged-not-divided", "--json", report)
        assert bad.code == 1
        assert json.loads(report.read_text())["diagnosis"][0]["code"] == "loss-scale"
        # gradient sync off at every micro-step: .grad never set; was `cross-sample-loss`
        bad = cli("compare", runs / "baseline", runs / "merged-sync-never", "--json", report)
        first = json.loads(report.read_text())["diagnosis"][0]
        assert bad.code == 1 and first["code"] == "micro-batch-missing", first["message"]
        assert "set_requires_gradient_sync(False)" in first["message"]
    mixed = cli("compare", tmp_path / "fp32" / "baseline", tmp_path / "bf16" / "merged")
    assert mixed.code == 2 and "computes in float32, the merged run in bfloat16" in mixed.err


def test_verify_on_two_ranks_at_the_default_size(cli, tmp_path):
    """The issue's first promise: W=2 x K=2 against one process at B=128 and its float64 run."""
    report = tmp_path / "r.json"
    result = cli("verify", "--nproc", "2", "-k", "2", "-o", tmp_path / "v", "--json", report)
    assert result.code == 0, result.out
    text = " ".join(result.out.split())  # the header wraps where the temporary folder's name ends
    assert "(K=1, B=128) vs" in text and "(W=2 x K=2, B=128), 12 updates" in text
    data = json.loads(report.read_text())
    assert data["reference"].endswith("baseline-fp64") and data["accum_steps"] == 2
    assert data["merged_ranks"]["world_size"] == 2 and data["merged_ranks"]["replicas_agree"]
    assert data["merged_ranks"]["items_per_rank"][0] == [64.0, 64.0]
    base = json.loads((tmp_path / "v" / "baseline" / "manifest.json").read_text())
    assert base["config"]["batch_size"] == 128 and base["config"]["nproc"] == 1
