"""bench/model_zoo.py as a gate (scripts/gpu_check.sh's zoo part): `--strict` exits 1 on a
false alarm, on a bug not named first, and where no run was made; `--seconds` starts no run
after its time; `--device cuda` without CUDA is refused."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.zoo_runs import one_thread, zoo


def _zoo(monkeypatch, *args: str) -> int:
    """The bench's main on these arguments (it sets one torch thread: restored after)."""
    monkeypatch.setattr(sys, "argv", ["model_zoo.py", "--updates", "3", *args])
    threads = torch.get_num_threads()
    try:
        return zoo.main()
    finally:
        torch.set_num_threads(threads)


def test_strict_fails_a_bug_that_never_began_and_passes_one_named(monkeypatch, capsys):
    named = ["--runs", "1", "--strict", "--bug", "no-loss-scale"]
    assert _zoo(monkeypatch, *named) == 0
    assert _zoo(monkeypatch, *named, "--bug-from", "100") == 1  # the run passes: not named
    assert _zoo(monkeypatch, "--runs", "1", "--bug", "no-loss-scale", "--bug-from", "100") == 0
    assert "1 not named loss-scale first" in capsys.readouterr().out


def test_strict_fails_where_seconds_left_no_run(monkeypatch, capsys):
    assert _zoo(monkeypatch, "--runs", "3", "--seconds", "0", "--strict") == 1
    assert "0 clean runs" in capsys.readouterr().out


def test_cuda_is_refused_where_torch_sees_none(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exited:
        _zoo(monkeypatch, "--runs", "1", "--device", "cuda")
    assert exited.value.code == 2 and "torch sees no CUDA device" in capsys.readouterr().err


def test_a_passing_run_of_a_model_no_merged_run_reproduces_is_a_miss_not_a_false_alarm(
    monkeypatch, capsys
):
    """A load-balancing loss over each forward's batch (`moe-balance`) must fail: where its run
    passes (under bfloat16 its effect can sit below the noise) the bench counts a miss, apart
    from the false alarms of the equivalent models, and leaves it out of the worst pass."""

    def judge(root, model, *args, **loop) -> dict:
        worst = 0.9 if model == "moe-balance" else 0.5
        return {"verdict": "pass", "codes": [], "worst": worst, "first": None}

    monkeypatch.setattr(zoo, "judge", judge)
    runs = ["--models", "moe-balance,lnmlp", "--optimizers", "sgd-mom", "--ks", "2", "--runs", "2"]
    assert _zoo(monkeypatch, *runs, "--strict") == 1
    out = capsys.readouterr().out
    assert "2 clean runs, 0 false alarm(s), worst passing err/allowed 0.5" in out
    assert "1 run(s) of moe-balance not named cross-sample-loss first" in out
    assert "  not named: {'run'" in out and "false alarm: {" not in out


def test_a_penalty_under_float16_needs_a_scale_k_1_does_not_overflow_at(tmp_path):
    """Zoo run 290000 (`--autocast float16 --penalty 0.001 --clip 1.0`, K=2): the penalty sums
    the loss in float32, so GradScaler's default 65536 scales it without overflowing the loss
    itself, and the K=1 baseline's gradient overflows at update 0 where each half-size micro
    gradient does not: `scaler-skips`, its fix naming the scale to start at. From
    `--init-scale 4096` both step at every update and the run passes."""
    options = {"autocast": "float16", "penalty": 1e-3, "clip": 1.0, "updates": 3}
    with one_thread():
        skipped = zoo.judge(tmp_path / "65536", "encoder", "adamw-wd", 2, 290000, None, **options)
        both = zoo.judge(
            tmp_path / "4096", "encoder", "adamw-wd", 2, 290000, None, init_scale=4096.0, **options
        )
    assert skipped["codes"] == ["scaler-skips"] and skipped["first"] == 0, skipped
    assert both["verdict"] == "pass", both


def test_the_zoo_s_lamb_moves_each_tensor_by_lr_times_its_norm():
    """bench/zoo_optimizers.py's LAMB: its trust ratio ||w|| / ||update|| makes every step of a
    tensor lr·||w|| long, whatever the gradient's size (a gradient 1e6 times larger steps as
    far), and a tensor at 0 steps by the update itself."""
    from bench.zoo_optimizers import Lamb

    for scale in (1.0, 1e6):
        w = torch.nn.Parameter(torch.arange(1.0, 7.0).reshape(2, 3))
        opt = Lamb([w], lr=1e-2)
        before = w.detach().clone()
        w.grad = scale * torch.tensor([[0.3, -0.2, 0.1], [0.5, 0.0, -0.4]])
        opt.step()
        moved = float((w.detach() - before).norm())
        assert abs(moved - 1e-2 * float(before.norm())) < 1e-6 * moved, (scale, moved)
    zero = torch.nn.Parameter(torch.zeros(3))
    zero.grad = torch.tensor([1.0, -1.0, 0.0])
    Lamb([zero], lr=1e-2, weight_decay=0.0).step()
    assert torch.allclose(zero.detach(), torch.tensor([-1e-2, 1e-2, 0.0]), atol=1e-6)
