"""Random numbers a loop draws in its forward (a VAE's reparameterization): torch's CPU randn
fills one tensor of B x 6 otherwise than K tensors of B/K x 6, so the runs train on other noise.
The Recorder sees torch's default generator advance between micro-steps (`micro/draws`) and the
judge names `dropout-rng`, not a loss over the micro-batch; noise drawn once per update for the
whole batch and sliced per micro-batch is the same training, and passes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare
from gradalign.runs.reader import read_run_dir

UPDATES, B, K, LATENT = 4, 16, 4, 6


class TinyVAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc, self.dec = nn.Linear(8, 2 * LATENT), nn.Linear(LATENT, 8)

    def forward(self, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        mu, log_var = self.enc(x).chunk(2, dim=-1)
        z = mu + noise.to(x.dtype) * torch.exp(0.5 * log_var)
        recon = ((self.dec(z) - x) ** 2).sum(-1)
        kl = -0.5 * (1 + log_var - mu**2 - log_var.exp()).sum(-1)
        return (recon + kl).mean()  # a mean of per-sample terms


def record(out, k: int, sliced: bool, float64: bool = False, bug: bool = False, reference=None):
    torch.manual_seed(0)
    model = TinyVAE().double() if float64 else TinyVAE()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(UPDATES * B, 8, generator=torch.Generator().manual_seed(1))
    x = x.double() if float64 else x
    n = B // k
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for update in range(UPDATES):
            whole = torch.randn(B, LATENT) if sliced else None  # float32, cast in the forward
            for micro in range(k):
                rows = slice(update * B + micro * n, update * B + (micro + 1) * n)
                noise = whole[micro * n : (micro + 1) * n] if sliced else torch.randn(n, LATENT)
                loss = model(x[rows], noise)
                (loss if bug else loss / k).backward()
                rec.micro(loss.detach(), batch=x[rows])
            opt.step()
            rec.update()
            opt.zero_grad()


@pytest.mark.parametrize("sliced", [False, True])
def test_noise_drawn_per_micro_batch_is_named_and_sliced_noise_passes(tmp_path, sliced):
    record(tmp_path / "fp64", 1, sliced, float64=True)
    record(tmp_path / "base", 1, sliced, reference="../fp64")
    record(tmp_path / "merged", K, sliced)
    merged = read_run_dir(tmp_path / "merged")
    assert merged.micro_draws is not None and merged.draws_each_micro_step() != sliced
    result = compare(tmp_path / "base", tmp_path / "merged")
    if sliced:
        assert result.verdict == "pass", [c for c in result.checks if c.status == "fail"]
        return
    first = result.diagnosis[0]
    assert first.code == "dropout-rng", first.message  # was cross-sample-loss
    assert first.evidence["draws_each_micro_step"] and "no dropout layer" in first.message
    assert "sliced per micro-batch" in first.fix
    # the same loop without 1/K: the noise turns the gradient too far for its scale to be read
    record(tmp_path / "bug", K, sliced, bug=True)
    assert "dropout-rng" in [d.code for d in compare(tmp_path / "base", tmp_path / "bug").diagnosis]


def test_a_loop_that_draws_nothing_records_no_draws(tmp_path, small_runs):
    assert read_run_dir(small_runs["merged"]).micro_draws is None


def test_other_samples_are_not_called_identical_samples_beside_dropout(tmp_path):
    """Other samples in a model with dropout: `data-order`, and no `dropout-rng` whose message
    says the samples were identical (it was listed second, contradicting the first)."""
    from gradalign import api
    from gradalign.config import TrainConfig

    config = TrainConfig(model="mlp-dropout", hidden=16, updates=3, batch_size=16, accum_steps=4)
    base = api.record_baseline(config, tmp_path / "base")
    merged = api.record_merged(config, tmp_path / "merged", fault="data-order")
    codes = [d.code for d in compare(base, merged).diagnosis]
    assert codes[0] == "data-order" and "dropout-rng" not in codes, codes


def test_a_gradient_turned_to_about_1_over_k_beside_draws_is_not_a_cleared_window(tmp_path):
    """Noise drawn per micro-step (NEFTune's on the embeddings) may leave a merged gradient
    about 1/K of the baseline's and turned. The Recorder saw no zero_grad() inside the windows:
    `dropout-rng`, not a `zero-grad-in-window` that no call made (a gradient 1/K of the
    baseline's in size may be read as a loss scale first, beside it: which, the draw decides;
    the draw is fixed per update, where each read drew anew and the result changed with the
    number of reads)."""
    import dataclasses

    import numpy as np

    from gradalign.judge.compare import compare as judge

    record(tmp_path / "base", 1, False)
    record(tmp_path / "merged", K, False)
    base, merged = read_run_dir(tmp_path / "base"), read_run_dir(tmp_path / "merged")
    assert merged.zero_grads_inside is not None and not merged.zero_grads_inside.any()

    def turned(update: int):  # 0.8/K of the baseline's plus 0.6/K of its size elsewhere
        rng = np.random.default_rng(update)  # the same gradient however often it is read
        grads = base.load_grads(update)
        out = {}
        for name, g in grads.items():
            other = rng.standard_normal(g.shape)
            other *= np.linalg.norm(g) / max(np.linalg.norm(other), 1e-30)
            out[name] = ((0.8 * g + 0.6 * other) / K).astype(g.dtype)
        return out

    c = judge(base, dataclasses.replace(merged, load_grads=turned))
    codes = [d.code for d in c.diagnosis]
    assert "dropout-rng" in codes[:2] and "zero-grad-in-window" not in codes, codes


def _dropout_run(
    out,
    k: int,
    train: bool = True,
    float64: bool = False,
    reference=None,
    eval_from=None,
    bug: str | None = None,
):
    """An MLP with dropout, trained (or, the bug, left in eval() mode: its dropout draws
    nothing; from update `eval_from`, as after an evaluation). `bug`: "loss-given-over-k" (the
    loss given to micro() divided by K), "own-statistics" (each micro-batch's inputs
    standardized by its own mean and deviation)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.3), nn.Linear(16, 3))
    model = model.double() if float64 else model
    model.train(train)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * B, 8, generator=g)
    y = torch.randint(0, 3, (UPDATES * B,), generator=g)
    x = x.double() if float64 else x
    n = B // k
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for update in range(UPDATES):
            if update == eval_from:
                model.eval()  # an evaluation that forgot model.train() after it
            for micro in range(k):
                rows = slice(update * B + micro * n, update * B + (micro + 1) * n)
                inputs = x[rows]
                if bug == "own-statistics":  # over the forward's rows: B, or B/K merged
                    inputs = (inputs - inputs.mean(0)) / inputs.std(0)
                loss = nn.functional.cross_entropy(model(inputs), y[rows])
                (loss / k).backward()
                given = loss / k if bug == "loss-given-over-k" and k > 1 else loss
                rec.micro(given.detach(), batch=x[rows])
            opt.step()
            rec.update()
            opt.zero_grad()


@pytest.mark.parametrize(
    "bug, code",
    [
        ("loss-given-over-k", "loss-averaging"),
        ("own-statistics", "cross-sample-loss"),
        (None, None),
    ],
)
def test_dropout_that_never_ran_is_not_named(tmp_path, bug, code):
    """Every run in eval() mode, as one disables dropout to verify: no mask was drawn in either
    run (`micro/draws`), yet any failure at update 0 was `dropout-rng`, "the two runs drew
    different random masks", named before the bug (helper hunt F2)."""
    _dropout_run(tmp_path / "ref", 1, train=False, float64=True, bug=bug)
    _dropout_run(tmp_path / "base", 1, train=False, reference="../ref", bug=bug)
    _dropout_run(tmp_path / "merged", K, train=False, bug=bug)
    c = compare(tmp_path / "base", tmp_path / "merged")
    codes = [d.code for d in c.diagnosis]
    if code is None:
        assert c.verdict == "pass", codes
    else:
        assert c.verdict == "fail" and codes[0] == code and "dropout-rng" not in codes, codes


def test_a_run_whose_dropout_drew_nothing_is_said_to_be_in_eval_mode(tmp_path):
    """The merged run left in eval() mode: its dropout drew no mask. It was `dropout-rng`, "the
    two runs drew different random masks", with a fix about reseeding; the merged run drew
    none (`micro/draws` absent, the baseline's at every micro-step)."""
    _dropout_run(tmp_path / "ref", 1, float64=True)
    _dropout_run(tmp_path / "base", 1, reference="../ref")
    _dropout_run(tmp_path / "eval", K, train=False)
    found = compare(tmp_path / "base", tmp_path / "eval").diagnosis[0]
    assert found.code == "dropout-rng" and found.evidence["drew_nothing"] == "merged"
    assert "the merged run drew none" in found.message and "model.train()" in found.fix
    # left in eval() from update 2: it was `unexplained`
    _dropout_run(tmp_path / "late", K, eval_from=2)
    late = compare(tmp_path / "base", tmp_path / "late").diagnosis[0]
    assert late.code == "dropout-rng" and late.evidence["drew_nothing_from"] == 2, late.message
    assert "from update 2 the merged run drew no random numbers" in late.message
    _dropout_run(tmp_path / "clean", K)
    assert compare(tmp_path / "base", tmp_path / "clean").verdict == "pass"
