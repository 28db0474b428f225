"""The three framework integrations on two processes (torchrun, gloo on the CPU): the README's
"On several processes" commands run as written, every merged run recorded in one launch
(examples/frameworks/on_ranks.py), then judged against the one-process baselines."""

from __future__ import annotations

import pytest

from gradalign import api
from gradalign.runs.reader import read_run_dir

from .frameworks import require, run_readme

require("accelerate")
require("transformers")
require("lightning")


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("readme-ranks")
    return cwd / "runs" / "ranks", run_readme("On several processes", cwd)


@pytest.mark.parametrize(
    "merged",
    ["acc/w2k2", "acc-pad/w2k2-tokens", "acc-shuffled/w2k2-seedable", "hf/w2k2", "pl/w2k2"],
)
def test_clean_runs_on_two_processes_pass_well_within_their_noise(readme, merged):
    runs, results = readme
    base = merged.split("/")[0] + ("/k1-seedable" if "seedable" in merged else "/k1")
    verdict, codes, worst = results[f"runs/ranks/{base} runs/ranks/{merged}"]
    assert (verdict, codes) == ("pass", [])
    assert worst < 0.6
    run = read_run_dir(runs / merged)
    assert run.world_size == 2 and run.accum_steps in (2, 4)
    assert len(run.ranks) == 2  # each process's own series


def test_the_mistakes_each_framework_makes_easy_on_processes_are_named_with_their_fix(readme):
    runs, results = readme
    expected = {
        "acc/k1 acc/w2k4-unsplit": ("scheduler-per-rank", "split_batches=True"),
        # W = K: once per rank or once per micro-step, the same pace; both said
        "acc/k1 acc/w2k2-unsplit": ("lr-schedule", "split_batches=True"),
        "acc-pad/k1 acc-pad/w2k2": ("dp-token-normalization", "all_reduce"),
        "hf/k1 hf/w2k2-local-tokens": (
            "dp-token-normalization",
            "average_tokens_across_devices=True",
        ),
        "pl/k1-sequential pl/w2k2": ("data-order", "use_distributed_sampler=False"),
        "acc-shuffled/k1 acc-shuffled/w2k2": ("data-order", "use_seedable_sampler=True"),
        "acc-tail/k1 acc-tail/w2k2": ("data-order", "even_batches"),
        "hf-tail/k1 hf-tail/w2k2": ("data-order", "dataloader_drop_last=True"),
    }
    for pair, (code, fix) in expected.items():
        base, merged = pair.split()
        verdict, codes, worst = results[f"runs/ranks/{base} runs/ranks/{merged}"]
        assert worst > 1, pair
        assert (verdict, codes[:1]) == ("fail", [code]), pair
        found = api.compare(runs / base, runs / merged).diagnosis[0]
        assert fix in (found.fix or ""), (pair, found.fix)
        if code == "lr-schedule":
            assert "once per micro-step, or once per rank (W = K = 2" in found.message


def test_the_trainer_s_loss_times_the_processes_is_read_back_as_each_process_s_own(readme):
    """The Trainer multiplies each loss by W where it counts the items of all processes; read
    as it is, every window's loss would be twice the baseline's."""
    runs, _ = readme
    base, merged = read_run_dir(runs / "hf" / "k1"), read_run_dir(runs / "hf" / "w2k2")
    comparison = api.compare(runs / "hf" / "k1", runs / "hf" / "w2k2")
    assert all(r.loss_ok for r in comparison.results)
    assert base.micro_items.sum() == pytest.approx(merged.micro_items.sum())
