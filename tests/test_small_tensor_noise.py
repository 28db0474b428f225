"""A small tensor's noise is at least the update's typical noise relative to each tensor's norm
(judge/small_noise.small_tensors_noise): its own is a draw of a few elements. A cold probe's loop
(Conv1d, GroupNorm, NAdam, clip_grad_norm_ on each tensor alone, ReduceLROnPlateau) failed
clean: the 2-element output bias, clipped at the updates around update 9 and not there, had
its noise pooled from the clipped ones' (below float32's rounding of its norm) and its own draw
a fifth of the update's typical share; the merged run's error failed at 1.03x allowed."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import gradalign
from gradalign.judge.compare import compare
from gradalign.judge.metrics import TensorDiff
from gradalign.judge.small_noise import ALIKE, small_tensors_noise
from gradalign.runs.reader import read_run_dir

B, N, C, T, K = 16, 12, 4, 20, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(C, 16, 5, padding=2)
        self.gn = nn.GroupNorm(4, 16)
        self.c2 = nn.Conv1d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, 2)

    def forward(self, x):
        h = F.gelu(self.gn(self.c1(x)))
        h = F.gelu(self.c2(h)) + h
        return self.fc(h.mean(-1))


def train(out, k: int, dtype=torch.float32, clip_each_micro: bool = False):
    torch.manual_seed(0)
    model = Net().to(dtype)
    opt = torch.optim.NAdam(
        model.parameters(), lr=1e-2, weight_decay=1e-2, decoupled_weight_decay=True
    )
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=0)
    g = torch.Generator().manual_seed(3)
    x_all = torch.randn(B * N, C, T, generator=g).to(dtype)
    y_all = torch.randn(B * N, 2, generator=g).to(dtype)

    def clip_each():
        for p in model.parameters():
            torch.nn.utils.clip_grad_norm_([p], 0.05)

    n = B // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(N):
            losses = []
            for j in range(k):
                rows = slice(u * B + j * n, u * B + (j + 1) * n)
                loss = F.mse_loss(model(x_all[rows]), y_all[rows])
                (loss / k).backward()
                if clip_each_micro:
                    clip_each()
                rec.micro(loss, batch=(x_all[rows], y_all[rows]))
                losses.append(loss.item())
            if not clip_each_micro:
                clip_each()
            opt.step()
            rec.update()
            opt.zero_grad()
            plateau.step(sum(losses) / k)
    return read_run_dir(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("small_noise")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the probe's rounding: one thread's sums
    try:
        return {
            "ref": train(root / "ref", 1, torch.float64),
            "base": train(root / "base", 1),
            "merged": train(root / "merged", K),
            "bug": train(root / "bug", K, clip_each_micro=True),
        }
    finally:
        torch.set_num_threads(threads)


def test_a_clean_loop_clipping_each_tensor_passes(runs):
    result = compare(runs["base"], runs["merged"], reference=runs["ref"])
    assert result.verdict == "pass", [d.code for d in result.diagnosis]


def test_its_clip_at_every_micro_step_is_still_named(runs):
    result = compare(runs["base"], runs["bug"], reference=runs["ref"])
    assert result.verdict == "fail" and result.diagnosis[0].code == "clip-per-micro"


def _diff(name: str, size: int, norm: float, noise: float) -> TensorDiff:
    return TensorDiff(name, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, noise=noise, norm=norm, size=size)


def test_a_small_tensors_noise_is_at_least_the_updates_typical_share_of_its_norm():
    big = [_diff(f"w{i}", 4096, 0.05, 3e-8) for i in range(ALIKE)]  # 6e-7 of their norms
    shares = small_tensors_noise([*big, _diff("bias", 2, 0.04, 1e-9)])
    assert shares["bias"] == pytest.approx(6e-7 * 0.04)
    assert "w0" not in shares  # a tensor of many elements keeps its own noise
    few = small_tensors_noise([*big[: ALIKE - 2], _diff("bias", 2, 0.04, 1e-9)])
    assert "bias" not in few  # too few tensors measured to tell what is typical
