"""The Recorder in a process group (gloo, in this process): a group of one, compiled DDP
forwards counted, the selftest's rank cases skipped where ranks cannot start, and the rank
signatures read from hand-made series (scheduler_per_rank's line-up, initial weights broadcast).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gradalign.runs.reader import read_run_dir

from .test_distributed import dist


def test_the_recorder_in_a_process_group_of_one(tmp_path):
    """A group of one rank: recorded as a rank when asked (ranks/rank0), as one process by
    default; a rank label out of range and a missing group are refused."""
    import torch
    from torch import nn

    import gradalign
    from gradalign.record.facts import RecorderError

    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RecorderError, match="initialized process group"):
        gradalign.Recorder(tmp_path / "none", model, opt, distributed=True)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for out, kwargs in ((tmp_path / "rank", {"distributed": True}), (tmp_path / "one", {})):
            with gradalign.Recorder(out, model, opt, **kwargs) as rec:
                model(torch.ones(4, 3)).sum().backward()
                rec.micro(1.0, batch=torch.ones(4, 3))
                opt.step()
                rec.update()
        assert read_run_dir(tmp_path / "rank").world_size == 1
        assert (tmp_path / "rank" / "ranks" / "rank0" / "series.safetensors").is_file()
        assert not (tmp_path / "one" / "ranks").exists()
        with pytest.raises(RecorderError, match="labels"):
            gradalign.Recorder(tmp_path / "bad", model, opt, rank=3)
        assert not (tmp_path / "bad").exists()
        from torch.distributed.fsdp import fully_shard

        sharded = fully_shard(nn.Sequential(nn.Linear(3, 2)))  # its parameters become DTensors
        opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
        with gradalign.Recorder(tmp_path / "fsdp", sharded, opt, distributed=True) as rec:
            sharded(torch.ones(4, 3)).sum().backward()
            rec.micro(1.0, batch=torch.ones(4, 3))
            opt.step()
            rec.update()
        run = read_run_dir(tmp_path / "fsdp")
        assert [t.shape for t in run.tensors] == [(2, 3), (2,)]
        assert run.grads(0)["0.bias"].tolist() == [4.0, 4.0]
    finally:
        dist.destroy_process_group()


def test_forwards_around_a_compiled_ddp_are_counted_and_none_through_it(tmp_path):
    """torch.compile(DDP(model)) traces the model's forward with the Recorder's counting hooks
    in it: forwards through it count as DDP's own (none bypassed), and a compiled
    `ddp.module` called directly at update 1 counts as two forwards around DDP."""
    import torch
    from torch import nn

    import gradalign

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        through, around = (torch.compile(m, backend="eager") for m in (ddp, ddp.module))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 6)
        for out, bypass_at in ((tmp_path / "clean", None), (tmp_path / "around", 1)):
            with gradalign.Recorder(out, through, opt, accum_steps=2) as rec:
                for update in range(3):
                    for j in range(2):
                        net = around if update == bypass_at else through
                        loss = net(x[4 * j : 4 * j + 4]).pow(2).mean()
                        (loss / 2).backward()
                        rec.micro(loss, batch=x[4 * j : 4 * j + 4])
                    opt.step()
                    rec.update()
                    opt.zero_grad()
    finally:
        dist.destroy_process_group()
    assert read_run_dir(tmp_path / "clean").bypassed_forwards is None
    assert read_run_dir(tmp_path / "around").bypassed_forwards.tolist() == [0, 2, 0]


def test_selftest_skips_rank_cases_it_cannot_run_and_says_so(tmp_path, monkeypatch):
    from rich.console import Console

    from gradalign import selftest_ranks
    from gradalign.selftest import CASES, render_selftest, run_selftest

    monkeypatch.setattr(selftest_ranks, "ranks_unavailable", lambda case: "no gloo here")
    cases = [case for case in CASES if case.nproc > 1][:3]
    console = Console(record=True, width=200)
    outcomes = run_selftest(tmp_path / "runs", console, cases)
    assert [o.skipped for o in outcomes] == ["no gloo here"] * 3 and all(o.ok for o in outcomes)
    render_selftest(outcomes, console)
    text = console.export_text()
    assert text.count("skipped: no gloo here") >= 3 and "3 skipped" in text
    assert not (tmp_path / "runs").exists()  # nothing was trained


def test_scheduler_per_rank_reads_only_the_updates_that_line_up():
    """A merged run two updates shorter than its baseline, its lr one schedule step ahead: the
    signature compares the updates both runs have (this once raised IndexError, exit 3)."""
    from types import SimpleNamespace

    from gradalign.judge.signatures.distributed import scheduler_per_rank

    schedule = np.cos(np.linspace(0, 1.5, 12))
    lr_problem = [("lr", "differs")]
    c = SimpleNamespace(
        baseline=SimpleNamespace(lr=schedule[:8], lr_groups=None, accum_steps=1),
        merged=SimpleNamespace(lr=schedule[1:7], lr_groups=None, accum_steps=4, world_size=2),
        results=[SimpleNamespace(update=i, problems=lr_problem) for i in range(6)],
    )
    assert scheduler_per_rank(c) is None  # one step ahead, not W steps per update
    c.merged.lr = schedule[0:12:2]  # W=2 schedule steps per update
    found = scheduler_per_rank(c)
    assert found is not None and found.evidence["schedule_steps_per_update"] == 2


def _ranks(init_1: int, after_1: int) -> SimpleNamespace:
    """A run of 2 ranks over one parameter and one update, by fingerprints alone."""
    from gradalign.runs.model import TensorInfo
    from gradalign.runs.ranks import RankSeries

    def rank(r: int, init: int, after: int) -> RankSeries:
        state = np.array([[after]], dtype=np.int64)
        return RankSeries(r, np.zeros(1), np.array([init]), state, np.array([[5]]))

    return SimpleNamespace(
        ranks=[rank(0, 1, 2), rank(1, init_1, after_1)],
        tensors=[TensorInfo("w", (1,), "float32")],
        updates=1,
    )


def test_other_initial_weights_broadcast_before_the_first_step_are_no_divergence():
    """A Recorder created before DDP wraps the model records each rank's own initialization;
    DDP then broadcasts rank 0's. Equal weights and gradients at update 0 show it; other
    weights after update 0 are a real divergence (dp-rank-init)."""
    from gradalign.judge.distributed import rank_facts

    broadcast = rank_facts(_ranks(init_1=9, after_1=2))
    assert broadcast.agree and broadcast.synced == [1]
    diverged = rank_facts(_ranks(init_1=9, after_1=3))
    assert not diverged.agree and diverged.init == {1: ["w"]}


def test_the_launcher_is_named_by_its_environment_or_the_framework_that_started_the_ranks(
    monkeypatch,
):
    """torchrun and gradalign by their variables (before anything else), a framework that says
    it launched the ranks next, then Slurm's srun and MPI launchers, else 'unknown'."""
    from gradalign.record import distributed
    from gradalign.record.distributed import launched_by, launcher

    for name, _ in distributed._LAUNCHER_VARIABLES + distributed._JOB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert launcher() == "unknown"
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert launcher() == "slurm"
    with launched_by("lightning (spawn)"):
        assert launcher() == "lightning (spawn)"
        with launched_by(None):
            assert launcher() == "slurm"
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
        assert launcher() == "torchrun"
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert launcher() == "slurm"
    monkeypatch.delenv("SLURM_PROCID")
    monkeypatch.setenv("PMI_RANK", "0")
    assert launcher() == "mpirun"
