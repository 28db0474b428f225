"""Lightning, recorded by `GradalignCallback`: the README's commands run as written
(examples/frameworks/lightning_fit.py: a tiny GRU language model on generated token data), in
automatic and manual optimization, and the broken variants."""

from __future__ import annotations

import pytest

from gradalign.errors import BadInput
from gradalign.runs.reader import read_run_dir

from .frameworks import all_checked, example, judged, require, run_readme

require("lightning")
pl = example("lightning_fit")
pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning", "ignore::DeprecationWarning", "ignore:.*treespec, LeafSpec"
)


def quiet_trainer(callbacks: list, **options):
    """A Lightning Trainer on the CPU that writes no logs, checkpoints, bars or summaries."""
    import lightning as L

    return L.Trainer(
        accelerator="cpu",
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **options,
    )


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("readme-pl")
    return cwd / "runs", run_readme("Lightning", cwd)


def test_the_readme_commands_pass_clean_runs_and_name_lightnings_mean_over_k(readme):
    runs, results = readme
    assert results["runs/pl/k4"][2] < 0.6  # every micro-batch as many tokens
    assert results["runs/pl-pad/k4"][1][:1] == ["token-normalization"]  # padded: Lightning's K
    assert results["runs/pl-pad/k4"][2] > 1e3
    assert results["runs/pl-pad/k4-manual"][2] < 0.6  # divided by the window's tokens
    assert set(all_checked(runs / "pl" / "k1", runs / "pl" / "k4").values()) == {"pass"}
    assert read_run_dir(runs / "pl" / "k1-fp64").dtype == "float64"  # precision="64-true"


@pytest.mark.parametrize(
    "bug, code", [("double-scale", "loss-scale"), ("scheduler-per-batch", "lr-schedule")]
)
def test_a_broken_lightning_run_fails_with_its_code(readme, bug, code):
    runs = pl.record_all(readme[0] / "pl", padded=False, bug=bug)
    verdict, codes, worst = judged(runs["k1"], runs[f"k4-{bug}"])
    assert verdict == "fail" and codes[:1] == [code], codes
    assert worst > 1e3


def test_manual_optimization_needs_k(tmp_path, monkeypatch):
    real = pl.GradalignCallback
    monkeypatch.setattr(pl, "GradalignCallback", lambda out, **kw: real(out, items="labels"))
    with pytest.raises(BadInput, match="accum_steps=K"):
        pl.train(tmp_path / "k4", 4, manual=True)
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_items_rule_is_refused(tmp_path):
    with pytest.raises(BadInput, match="items must be one of"):
        pl.GradalignCallback(tmp_path / "run", items="tokens")


@pytest.mark.parametrize(
    "schedule, refused",
    [
        ({0: 1, 1: 2}, "from 1 to 2 at epoch 1"),
        ({0: 4, 1: 2}, "from 4 to 2 at epoch 1"),
        ({0: 4}, None),
    ],
)
def test_k_changed_during_the_fit_is_refused(tmp_path, schedule, refused):
    """A GradientAccumulationScheduler that moves K at epoch 1: refused there with one line (a
    run has one K), and no run is left behind. One that holds K from the first batch records
    it: the scheduler sets K only as the first epoch starts, and {0: 4} was refused "from 1 to
    4 at epoch 0"."""
    from lightning.pytorch.callbacks import GradientAccumulationScheduler
    from torch.utils.data import DataLoader

    fit, data = _linear_fit()
    callbacks = [GradientAccumulationScheduler(schedule), pl.GradalignCallback(tmp_path / "run")]
    trainer = quiet_trainer(callbacks, max_epochs=2)
    if refused is None:
        trainer.fit(fit, DataLoader(data, batch_size=2))
        run = read_run_dir(tmp_path / "run")
        assert run.accum_steps == 4 and run.updates == 4  # 8 batches an epoch, 2 epochs
        return
    with pytest.raises(BadInput, match=f"changed during the fit, {refused}"):
        trainer.fit(fit, DataLoader(data, batch_size=4))
    assert not (tmp_path / "run").exists()


def _linear_fit():
    """A LightningModule of one Linear(4, 1) under SGD, and 16 rows of data for it."""
    import lightning as L
    import torch
    from torch.utils.data import TensorDataset

    class Fit(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    return Fit(), TensorDataset(torch.randn(16, 4), torch.randn(16, 1))


def test_a_schedule_given_as_accumulate_grad_batches_is_refused_in_one_line(tmp_path):
    """`Trainer(accumulate_grad_batches={0: 2})`, which this Lightning does not take either: the
    callback raised TypeError (int() of a dict) before Lightning's own."""
    from torch.utils.data import DataLoader

    fit, data = _linear_fit()
    callbacks = [pl.GradalignCallback(tmp_path / "run")]
    trainer = quiet_trainer(callbacks, max_epochs=1, accumulate_grad_batches={0: 2})
    with pytest.raises(BadInput, match="GradientAccumulationScheduler"):
        trainer.fit(fit, DataLoader(data, batch_size=4))
    assert not (tmp_path / "run").exists()


def test_a_loss_divided_twice_under_bf16_mixed_is_named(tmp_path):
    """bf16-mixed turns the gradient a little (cosine 0.999997 here): the same-direction bar
    follows the gradient's noise at the run's precision, so `loss-scale` names its variant."""
    from gradalign import api

    runs = pl.record_all(tmp_path, padded=False, bug="double-scale", precision="bf16-mixed")
    first = api.compare(runs["k1"], runs["k4-double-scale"]).diagnosis[0]
    assert (
        first.code == "loss-scale"
        and "divided by K=4 once too often (twice, a mean loss" in first.message
    ), first.message


def test_manual_optimization_backpropagating_a_batch_in_halves_is_one_micro_step(tmp_path):
    """Two `manual_backward` calls per batch: one micro-step (their losses add up); the run
    passes as the single-backward one does."""
    tiny_data = example("tiny_data")
    runs = tiny_data.record_all(
        tmp_path,
        pl.train,
        "k4",
        data={"padded": False, "manual": True, "halves": True},
        reference={"precision": "64-true"},
        changes={},
    )
    verdict, codes, _ = judged(runs["k1"], runs["k4"])
    assert verdict == "pass", codes
    assert read_run_dir(runs["k4"]).micro_steps == 4 * pl.UPDATES


def test_a_clip_scaled_with_k_under_bf16_mixed_is_named(tmp_path):
    """gradient_clip_val / K in the merged run, bf16-mixed: the two runs' norms before clipping
    differ by 1.8e-4 here (bfloat16 noise), more than float32's 1e-4; the bar follows the
    gradient's noise, so `clip-threshold` is named."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    tiny_data = example("tiny_data")

    class LM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_data.TinyGRULM()
            torch.manual_seed(1)
            for p in self.net.parameters():
                p.data.add_(0.01 * torch.randn_like(p))

        def training_step(self, batch, batch_idx):
            total, n = tiny_data.token_loss_sum(self.net(batch[0]), batch[1])
            return total / n

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def fit(out, k, precision, clip, reference=None):
        rows = tiny_data.token_rows(96, padded=False, seed=1)
        loader = DataLoader(rows, batch_size=16 // k, collate_fn=tiny_data.collate_pairs)
        callback = pl.GradalignCallback(out, items="labels", reference=reference)
        quiet_trainer(
            [callback],
            max_steps=6,
            accumulate_grad_batches=k,
            precision=precision,
            gradient_clip_val=clip,
        ).fit(LM(), loader)
        return out

    base = fit(tmp_path / "k1", 1, "bf16-mixed", 0.05, reference="../k1-fp64")
    fit(tmp_path / "k1-fp64", 1, "64-true", 0.05)
    merged = fit(tmp_path / "k4", 4, "bf16-mixed", 0.05 / 4)
    verdict, codes, _ = judged(base, merged)
    assert verdict == "fail" and codes[:1] == ["clip-threshold"], codes


def test_manual_optimization_closes_an_epochs_short_last_window_where_it_steps(tmp_path):
    """40 samples, batch 16: each epoch ends with a batch of 8, in the merged run a window of 2
    micro-batches that the loop steps at, its loss divided by 2. Those windows close where the
    optimizer stepped (not after K micro-batches, into the next epoch), their loss is read over
    2, and the run passes."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    tiny_data = example("tiny_data")

    class Manual(L.LightningModule):
        def __init__(self, k: int) -> None:
            super().__init__()
            self.net, self.k = tiny_data.TinyGRULM(), k
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            total, n = tiny_data.token_loss_sum(self.net(batch[0]), batch[1])
            batches = self.trainer.num_training_batches
            window = min(self.k, batches - batch_idx + batch_idx % self.k)
            self.manual_backward(total / n / window)
            if (batch_idx + 1) % self.k == 0 or batch_idx + 1 == batches:
                optimizer = self.optimizers()
                optimizer.step()
                optimizer.zero_grad()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def fit(out, k, precision="32-true", reference=None):
        rows = tiny_data.token_rows(40, padded=False)
        loader = DataLoader(rows, batch_size=16 // k, collate_fn=tiny_data.collate_pairs)
        callback = pl.GradalignCallback(out, items="labels", accum_steps=k, reference=reference)
        quiet_trainer([callback], max_steps=6, precision=precision).fit(Manual(k), loader)
        return out

    base = fit(tmp_path / "k1", 1, reference="../k1-fp64")
    fit(tmp_path / "k1-fp64", 1, "64-true")
    merged = fit(tmp_path / "k4", 4)
    verdict, codes, worst = judged(base, merged)
    assert verdict == "pass" and worst < 1, (codes, worst)
    run = read_run_dir(merged)
    assert (run.updates, run.micro_steps) == (6, 20)  # two epochs of windows 4, 4, 2


@pytest.mark.parametrize("manual", [False, True])
def test_a_batch_without_a_backward_is_a_micro_batch_missing(tmp_path, manual):
    """Automatic optimization: `training_step` returns None for batch 1 of each window
    (Lightning skips its backward and still steps every K batches); manual: the window's last
    batch is forwarded, not backpropagated. The windows held K−1 micro-steps (manual: two ran
    together into one of 2K−2) and were named `window-bookkeeping`, whose fix was to call
    Recorder.update() once per K micro-steps."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    tiny_data = example("tiny_data")

    class Skipping(L.LightningModule):
        def __init__(self, k: int, skip: bool) -> None:
            super().__init__()
            self.net, self.k, self.skip = tiny_data.TinyGRULM(), k, skip
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            total, n = tiny_data.token_loss_sum(self.net(batch[0]), batch[1])
            skipped = self.skip and batch_idx % self.k == (self.k - 1 if manual else 1)
            if not manual:
                return None if skipped else total / n
            if not skipped:
                self.manual_backward(total / n / self.k)
            if (batch_idx + 1) % self.k == 0:
                optimizer = self.optimizers()
                optimizer.step()
                optimizer.zero_grad()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def fit(out, k, skip=False, precision="32-true", reference=None):
        rows = tiny_data.token_rows(64, padded=False)
        loader = DataLoader(rows, batch_size=16 // k, collate_fn=tiny_data.collate_pairs)
        stated = {"accum_steps": k} if manual else {}
        callback = pl.GradalignCallback(out, items="labels", reference=reference, **stated)
        options = {} if manual else {"accumulate_grad_batches": k}
        quiet_trainer([callback], max_steps=4, precision=precision, **options).fit(
            Skipping(k, skip), loader
        )
        return out

    base = fit(tmp_path / "k1", 1, reference="../k1-fp64")
    fit(tmp_path / "k1-fp64", 1, precision="64-true")
    verdict, codes, _ = judged(base, fit(tmp_path / "k4", 4))
    assert verdict == "pass", codes
    from gradalign import api

    found = api.compare(base, fit(tmp_path / "k4-skip", 4, skip=True)).diagnosis  # not judged
    assert [d.code for d in found][:1] == ["micro-batch-missing"], [d.message for d in found]
    assert read_run_dir(tmp_path / "k4-skip").sizes.tolist() == [3, 3, 3, 3]


def test_manual_optimization_with_a_plain_backward_is_refused(tmp_path):
    """`loss.backward()` in manual optimization: Lightning's backward hooks never fire, and the
    callback wrote a run of updates without micro-steps; it refuses, naming manual_backward."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    class Plain(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3, 1)
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            (self.net(batch).pow(2).mean() / 2).backward()
            if batch_idx % 2 == 1:
                optimizer = self.optimizers()
                optimizer.step()
                optimizer.zero_grad()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = pl.GradalignCallback(tmp_path / "r", accum_steps=2)
    trainer = quiet_trainer([callback], max_epochs=1)
    with pytest.raises(BadInput, match=r"call self.manual_backward\(loss\), not loss.backward"):
        trainer.fit(Plain(), DataLoader(torch.ones(8, 3), batch_size=2))
    assert not (tmp_path / "r").exists()


def test_two_optimizers_are_refused_with_a_way_forward(tmp_path):
    """A GAN's two optimizers: refused, saying only the count; the Recorder in the loop takes
    the one to check."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    class Two(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            self.manual_backward((self.a(batch) + self.b(batch)).pow(2).mean())

        def configure_optimizers(self):
            sgd = torch.optim.SGD
            return sgd(self.a.parameters(), lr=0.1), sgd(self.b.parameters(), lr=0.1)

    callback = pl.GradalignCallback(tmp_path / "r", accum_steps=2)
    trainer = quiet_trainer([callback], max_epochs=1)
    with pytest.raises(BadInput, match=r"this fit has 2: record the loop with gradalign.Rec"):
        trainer.fit(Two(), DataLoader(torch.ones(8, 3), batch_size=2))
    assert not (tmp_path / "r").exists()


def test_zero_grad_through_self_optimizers_is_counted(tmp_path):
    """Manual optimization's `self.optimizers()` is a LightningOptimizer: a subclass of the
    optimizer's class sharing its state, whose `zero_grad()` runs on the wrapper. A call inside
    the window counts as the optimizer's (it went unseen, and a clip then hid its shape)."""
    import torch

    import gradalign

    optimizer_module = require("lightning.pytorch.core.optimizer")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3)
    with gradalign.Recorder(tmp_path / "run", model, opt, accum_steps=2) as rec:
        wrapper = optimizer_module.LightningOptimizer(opt)
        for u in range(2):
            for j in range(2):
                if u == 1 and j == 1:
                    wrapper.zero_grad()  # the bug: inside window 1
                rows = x[4 * u + 2 * j : 4 * u + 2 * j + 2]
                loss = model(rows).square().mean()
                (loss / 2).backward()
                rec.micro(loss, batch=rows)
            opt.step()  # (the wrapper steps through a Trainer's strategy)
            rec.update()
            wrapper.zero_grad()
    assert read_run_dir(tmp_path / "run").zero_grads_inside.tolist() == [0, 1]


def test_the_run_names_lightning_where_lightning_started_the_processes():
    """Lightning's own launchers (`strategy="ddp"` restarts the script per rank, `"ddp_spawn"`
    spawns) are named in the manifest; none where the processes came from outside (torchrun,
    srun: Lightning has no launcher then) or one process trains."""
    from types import SimpleNamespace

    from lightning.pytorch.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher
    from lightning.pytorch.strategies.launchers.subprocess_script import (
        _SubprocessScriptLauncher,
    )

    from gradalign.record.integrations.lightning import lightning_launcher

    def trainer(launcher, world_size=2):
        return SimpleNamespace(strategy=SimpleNamespace(launcher=launcher), world_size=world_size)

    script = _SubprocessScriptLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    assert lightning_launcher(trainer(script)) == "lightning"
    spawned = _MultiProcessingLauncher(strategy=None, start_method="spawn")
    assert lightning_launcher(trainer(spawned)) == "lightning (spawn)"
    assert lightning_launcher(trainer(None)) is None
    assert lightning_launcher(trainer(script, world_size=1)) is None
