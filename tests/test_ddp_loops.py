"""Hand-written DDP loops (tests/ddp_loops.py) under torch.distributed.run, W=2 x K=2, every
variant recorded in ONE launch; each test judges its runs from their files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradalign import api
from gradalign.errors import BadInput
from gradalign.judge.results import FAIL, PASS

from .conftest import rewrite_tensor_file

dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):  # pragma: no cover
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

SCRIPT = Path(__file__).with_name("ddp_loops.py")
ROOT = SCRIPT.parent.parent


@pytest.fixture(scope="module")
def loops(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp-loops")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    done = subprocess.run(
        [*command, "--nproc-per-node", "2", str(SCRIPT), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        # the ranks import this checkout's gradalign, whatever the environment installed
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert (out / "allreduce-bf16" / "manifest.json").exists(), done.stderr[-3000:]
    return out


@pytest.mark.parametrize("variant", ["leftover-cleared", "leftover-by-hand"])
def test_a_leftover_cleared_before_a_window_is_left_out_on_every_rank(loops, variant):
    """runs/discarded.py drops the leftover from the run's series and each rank's, cleared by
    zero_grad() or by hand."""
    comparison = judged(loops, variant)
    assert comparison.verdict == PASS, [c for c in comparison.checks if c.status == FAIL]
    assert any("had their gradient cleared" in note for note in comparison.notes)


def judged(loops: Path, variant: str):
    base = "baseline-clip" if variant.startswith("clip") else "baseline"
    return api.compare(loops / base, loops / variant)


def errors(comparison) -> list:
    return [d for d in comparison.diagnosis if d.severity == "error"]


@pytest.mark.parametrize("variant", ["clean", "uneven-items", "clip-scaler"])
def test_clean_loops_pass(loops, variant):
    """Unequal shards whose loss is weighted by the window's rows on all ranks are the large
    batch's training: the rows recorded per rank must not make them a suspect."""
    comparison = judged(loops, variant)
    assert comparison.verdict == PASS, [c for c in comparison.checks if c.status == FAIL]


@pytest.mark.parametrize("variant", ["reduce-step-broadcast", "reduce-all-step-broadcast"])
def test_ranks_whose_weights_rank_0_broadcasts_after_its_step_are_replicas(loops, variant):
    """Gradients reduced to rank 0, which steps and broadcasts: rank 1 stepped with its own
    gradient (or not at all), yet held rank 0's weights after every update. Was
    `replicas-diverged`, a false alarm with a fix about no_sync()."""
    comparison = judged(loops, variant)
    assert comparison.verdict == PASS, [c for c in comparison.checks if c.status == FAIL]
    check = next(c for c in comparison.checks if c.name.startswith("ranks hold"))
    assert "rank(s) 1 stepped with other gradients" in check.detail, check.detail


def test_a_buffer_each_rank_writes_from_its_own_rows_is_named_for_the_ranks(loops):
    """W=2 x K=1, a running mean of the inputs: each rank's forward sees its own B/W rows. The
    message said "K times per update, from a micro-batch of B/K" with K=1, and its fix spoke of
    windows; it names the ranks' rows and an all-reduce."""
    c = api.compare(loops / "baseline-buffer", loops / "buffer-k1", reference="none")
    first = errors(c)[0]
    assert first.code == "buffers-in-forward", first.message
    assert "its own B/W rows" in first.message and "K times" not in first.message
    assert "all-reduce" in first.fix


def test_a_baseline_whose_ranks_diverged_is_refused(loops):
    """Given as the baseline, a run whose ranks stepped apart is no training at batch B: it was
    judged, and its gap named `cross-sample-loss` about the merged run's loss."""
    with pytest.raises(BadInput, match="the baseline's ranks are not replicas from update 0"):
        api.compare(loops / "reduce-all-step", loops / "clean", baseline_accum_steps=2)
    kept = api.compare(loops / "reduce-step-broadcast", loops / "clean", baseline_accum_steps=2)
    assert kept.verdict == PASS


def test_ranks_that_step_alone_without_the_broadcast_still_diverge(loops):
    comparison = judged(loops, "reduce-all-step")
    assert comparison.verdict == FAIL
    assert errors(comparison)[0].code == "replicas-diverged"


def test_a_plain_mean_over_unequal_shards_is_named_from_the_rows(loops):
    """No items recorded, only batch=: each rank's rows count. Was `unexplained`."""
    comparison = judged(loops, "uneven-mean")
    first = errors(comparison)[0]
    assert first.code == "dp-token-normalization", first.message
    assert first.evidence["samples_per_rank"] == [12.0, 4.0]
    assert "12, 4 samples" in first.message and "DDP averaged the ranks equally" in first.message
    assert "items=n" in first.fix


def test_a_global_count_off_by_one_on_unequal_shards_is_a_wrong_scale(loops):
    """Each rank weighted by its share of a window count of B + 1: the gradient is B/(B+1)
    times the baseline's, turned by nothing. Was `dp-token-normalization`, whose fix (all-reduce
    the count) the loop already follows."""
    first = errors(judged(loops, "uneven-items-count-off"))[0]
    assert first.code == "loss-scale", first.message
    assert abs(first.evidence["grad_ratio"] - 16 / 17) < 1e-4, first.evidence


def test_a_plain_mean_over_other_shards_at_each_micro_step_is_named(loops):
    """Rows 6, 2 then 3, 5: each micro-batch's mean / K weighs micro-batches by up to 100%
    wrong, beyond what the ranks' totals (9, 7) alone allow. Was `token-normalization`, whose
    one-process fix does not mend it."""
    first = errors(judged(loops, "uneven-mean-micro"))[0]
    assert first.code == "dp-token-normalization", first.message
    assert first.evidence["samples_per_rank"] == [9.0, 7.0]


def test_a_loss_summed_over_the_ranks_before_micro_says_so(loops):
    """Only the recorded losses are off, by W: not 'micro-batches of different sizes'."""
    comparison = judged(loops, "loss-summed")
    first = errors(comparison)[0]
    assert first.code == "loss-averaging"
    assert "summed over the ranks" in first.message and "(W=2)" in first.message
    assert "different numbers of items" not in first.message
    assert first.evidence["world_size"] == 2


def test_w_equal_to_k_says_the_scale_may_be_the_ranks(loops):
    """A loss multiplied by W on W = K ranks is a loss not divided by K to the gradient: the
    diagnosis names loss-scale and says the ranks can give the same ratio."""
    first = errors(judged(loops, "loss-times-w"))[0]
    assert first.code == "loss-scale" and first.evidence["expected_ratio"] == 2
    assert "with W = K = 2, a loss multiplied by W (or a comm hook summing" in first.message


def test_w_equal_to_k_plus_1_is_the_ranks_reduction(loops):
    """DDP on 2 ranks without accumulation (K=1), each loss multiplied by W: the gradient is
    W = K+1 times the baseline's. It was named `loss += loss / K` (loss-scale's K+1)."""
    first = errors(judged(loops, "times-w-k1"))[0]
    assert first.code == "dp-loss-reduction" and first.evidence["expected_ratio"] == 2
    assert "K+1" not in first.message  # K = 1: no accumulation to read it in


def test_a_scale_of_w_a_clip_hid_is_read_before_clipping(loops):
    """A clip that engages at every update steps with the baseline's gradient: the scale W
    stands only in the norms before clipping. It was `unexplained`."""
    first = errors(judged(loops, "clip-times-w"))[0]
    assert first.code == "dp-loss-reduction", first.message
    assert first.evidence["pre_clip_ratio"] == pytest.approx(2, rel=1e-3)
    assert "before clipping is 2 times" in first.message


def test_ranks_stepping_their_own_gradients_kept_alike_by_a_broadcast_are_named(loops):
    """Each rank steps with its own rows' gradient, never reduced, and rank 0's weights are
    broadcast after the step (a ZeroRedundancyOptimizer without DDP does the same): the ranks
    agree in their weights, not their gradients. It was `cross-sample-loss`."""
    first = errors(judged(loops, "own-step-broadcast"))[0]
    assert first.code == "replicas-diverged", first.message
    assert "not all-reduced" in first.message and first.evidence["first_update"] == 0
    # reduced to rank 0 and broadcast, each rank stepping: the same fingerprints; its loss not
    # divided by K scales the gradient, which one rank's rows do not
    assert errors(judged(loops, "reduce-broadcast-undivided"))[0].code == "loss-scale"


def test_comm_hooks_are_recorded_and_named(loops):
    """The Recorder keeps the DDP wrapper's comm hooks; fp16 compression is named as such, and
    PowerSGD (no other signature fits its low-rank error) by `dp-comm-hook`. Was `unexplained`."""
    manifest = json.loads((loops / "fp16-hook" / "manifest.json").read_text())
    assert manifest["model"]["comm_hooks"] == ["fp16_compress_hook"]
    assert "comm_hooks" not in json.loads((loops / "clean" / "manifest.json").read_text())["model"]
    fp16 = errors(judged(loops, "fp16-hook"))[0]
    assert fp16.code == "grad-accum-dtype"
    assert "comm hook fp16_compress_hook" in fp16.message and "fp16_compress_hook" in fp16.fix
    power = errors(judged(loops, "powersgd-hook"))
    assert [d.code for d in power] == ["dp-comm-hook"], power[0].message
    assert power[0].evidence["comm_hooks"] == ["powerSGD_hook"]
    assert power[0].evidence["update"] == 2  # vanilla all-reduce before start_powerSGD_iter


def test_gradients_all_reduced_in_bfloat16_are_named_so(loops):
    """Every bfloat16 number inside float16's range is a float16 number too: the gradients of
    a bfloat16 all-reduce were named float16 when that format was tried first."""
    first = errors(judged(loops, "allreduce-bf16"))[0]
    assert first.code == "grad-accum-dtype", first.message
    assert first.evidence["accumulation_dtype"] == "bfloat16"
    assert "exactly a bfloat16 number" in first.message


def test_a_clip_by_a_hand_computed_norm_is_named(loops):
    """The norm's squares all-reduced over gradients DDP had averaged: the clip divided by √W
    times the norm. Reported to grads(), it is `clip-threshold` (was `loss-scale`, "scale each
    micro-batch's loss by 1/K", with losses that agree); unreported, `loss-scale` says the
    baseline's clip engaged and an unrecorded clip fits too."""
    first = errors(judged(loops, "clip-hand-sqrtw"))[0]
    assert first.code == "clip-threshold", first.message
    assert first.evidence["norm_ratio"] == pytest.approx(2**0.5, rel=1e-3)
    assert "√W = 1.414" in first.message and "clip_grad_norm_" in first.fix
    silent = errors(judged(loops, "clip-hand-sqrtw-silent"))[0]
    assert silent.code == "loss-scale" and silent.evidence["baseline_clipped"]
    assert "the merged run clipped otherwise" in silent.message
    assert "pre_clip_norm" in silent.fix


def test_a_clip_by_hand_the_recorder_did_not_see_is_clip_threshold(loops):
    """Each tensor clipped by its own norm, by hand: no clip function was called, so the
    Recorder counted none; was `clip-per-micro` ("applied to partial sums inside the window")
    on the evidence meant for runs that do not count clips."""
    first = errors(judged(loops, "clip-hand-per-tensor"))[0]
    assert first.code == "clip-threshold", first.message
    assert "called no clip function" in first.message and "each tensor's own" in first.message
    assert first.evidence["clip_calls"] == {"merged": 0}


def test_a_clip_before_unscale_is_named(loops):
    """clip_grad_norm_ before the GradScaler's unscale_(): the Recorder counts such clips per
    window (update/clips_before_unscale); was `loss-scale` ("scaled by the wrong factor")."""
    first = errors(judged(loops, "clip-before-unscale"))
    assert [d.code for d in first] == ["clip-before-unscale"], first[0].message
    assert first[0].evidence["windows"] == 4 and first[0].evidence["first_window"] == 0
    merged, base = first[0].evidence["pre_clip_norms"]
    assert merged / base == pytest.approx(1024.0, rel=1e-4)  # the scaler's init_scale
    assert "scaler.unscale_(optimizer), then clip_grad_norm_" in first[0].fix
    assert judged(loops, "clip-scaler").merged.clips_before_unscale is None
    # clipped inside the window too (before unscale_ there as well): clip-per-micro comes first
    inside = errors(judged(loops, "clip-each-micro"))
    assert inside[0].code == "clip-per-micro", inside[0].message


def test_a_clip_on_each_rank_before_the_reduce_is_named_by_the_ranks_norms(loops):
    """Each rank clipped its own gradient, then the loop averaged the ranks' by hand: the ranks
    step as replicas, but their norms before clipping differ (after an all-reduce every rank
    holds the same bits). It was `cross-sample-loss` (K=2, 4) or `loss-scale` (K=1), with fixes
    about batch losses and 1/K."""
    found = errors(judged(loops, "clip-before-reduce"))[0]
    assert found.code == "clip-per-micro", found.message
    assert "the ranks clipped before their gradients were reduced" in found.message
    norms = found.evidence["pre_clip_norms"]
    assert len(norms) == 2 and norms[0] != norms[1]
    assert judged(loops, "clip-scaler").verdict == PASS  # one norm on every rank: no such claim


def test_a_clip_before_the_reduce_that_engaged_nowhere_fails_on_the_ranks_norms(loops):
    """The same loop at a max_norm no rank's share reached, against a baseline that clips
    nothing: every weight and gradient agrees, yet the first share that reaches it clips alone.
    It passed; the check of the ranks' norms fails it, and clip-per-micro says nothing engaged.
    A norm only logged on each rank before the reduce (an infinite max_norm) clips nothing: no
    such check, a pass."""
    c = judged(loops, "wide-clip-before-reduce")
    check = next(k for k in c.checks if k.name == "one norm before clipping on every rank")
    assert check.status == FAIL and "4/4 updates clipped by other norms" in check.detail
    assert all(k.status != FAIL for k in c.checks if k is not check), c.checks
    found = errors(c)[0]
    assert found.code == "clip-per-micro" and found.evidence["engaged"] is False, found.message
    assert "No clip engaged in this run" in found.message
    logged = judged(loops, "norm-logged-before-reduce")
    assert logged.verdict == PASS, [k for k in logged.checks if k.status == FAIL]
    assert "one norm before clipping on every rank" not in [k.name for k in logged.checks]
    clean = next(k for k in judged(loops, "clip-scaler").checks if k.name.startswith("one norm"))
    assert clean.status == PASS and "the 2 ranks clipped by one norm" in clean.detail


def test_a_comm_hook_that_sums_is_named_with_the_hook(loops):
    """W=2, K=4: the gradient twice the baseline's, and the hook the Recorder saw on the DDP
    wrapper named beside the causes the ratio leaves open."""
    found = errors(judged(loops, "sum-hook"))[0]
    assert found.code == "dp-loss-reduction", found.message
    assert "(DDP ran " in found.message and "sum_hook" in found.message


def test_a_bug_on_rank_1_only_is_named_from_rank_1s_counts(loops):
    """zero_grad() inside the window, or a clip of the partial sums, on rank 1 alone: the run's
    own series are rank 0's, so the counts that name them must come from rank 1's series file.
    Both were `cross-sample-loss` (rank 1's counts never reached the judge)."""
    cleared = errors(judged(loops, "zero-grad-rank1"))[0]
    assert cleared.code == "zero-grad-in-window", cleared.message
    assert cleared.evidence["ranks"] == [1] and "on rank 1" in cleared.message
    clipped = errors(judged(loops, "clip-each-micro-rank1"))[0]
    assert clipped.code == "clip-per-micro", clipped.message
    assert clipped.evidence["ranks"] == [1] and "on rank 1" in clipped.message
    # the window's clip on rank 1 alone, after the all-reduce: the ranks part (it was said
    # that the gradients were not all-reduced, with a fix about no_sync())
    parted = errors(judged(loops, "clip-rank1-only"))[0]
    assert parted.code == "replicas-diverged", parted.message
    assert "a clip ran on rank 1 only" in parted.message and "no_sync" not in parted.fix
    # both ranks: no rank named (the run's own counts say it)
    both = errors(judged(loops, "clip-each-micro"))[0]
    assert "ranks" not in both.evidence and "on rank" not in both.message


def test_a_last_window_padded_from_the_datas_start_names_the_sampler(loops):
    """Only the last window holds another sample (the data's first, where a DistributedSampler
    with drop_last=False pads): `data-order`, whose fix said only "the same drop_last"; it names
    the sampler's padding, as for the frameworks' samplers."""
    c = api.compare(loops / "baseline", loops / "padded-last")
    first = c.diagnosis[0]
    assert first.code == "data-order", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["first_update"] == 3
    assert "DistributedSampler with drop_last=False" in first.fix and "multiple" in first.fix


def test_a_forward_around_ddp_is_named(loops):
    """`ddp.module(x)`: DDP never all-reduced those gradients, and the ranks part. The message
    blamed DDP's sync flag or no_sync() around the last micro-step."""
    found = errors(judged(loops, "forward-module"))[0]
    assert found.code == "replicas-diverged", found.message
    assert "2 forwards of window 0 went around DistributedDataParallel" in found.message
    assert found.evidence["bypassed_forwards"] == 2 and "ranks" not in found.evidence
    assert "ddp(x) rather than ddp.module(x)" in found.fix and "no_sync" not in found.fix
    # every forward through DDP: nothing counted
    assert api.compare(loops / "baseline", loops / "clean").merged.bypassed_forwards is None


def _rank_series(path: Path, rank: int, edit) -> None:
    """Rewrite one rank's series file (and its checksum in the manifest)."""
    rewrite_tensor_file(path, f"ranks/rank{rank}/series.safetensors", edit)


def test_ranks_that_kept_no_counts_are_read_as_before(loops, tmp_path):
    """A run recorded before each rank kept its counts is judged on the run's own (rank 0's),
    naming no rank; a count of another shape than docs/FORMAT.md's is bad input."""
    old = Path(shutil.copytree(loops / "zero-grad-rank1", tmp_path / "old"))
    for rank in (0, 1):
        _rank_series(old, rank, lambda d: [d.pop(k) for k in list(d) if k.startswith("update/z")])
    comparison = api.compare(loops / "baseline", old)
    assert comparison.verdict == FAIL and errors(comparison)
    assert all("ranks" not in d.evidence for d in comparison.diagnosis)
    short = Path(shutil.copytree(loops / "zero-grad-rank1", tmp_path / "short"))
    _rank_series(short, 1, lambda d: d.update({"update/zero_grads_inside": d["micro/steps"]}))
    with pytest.raises(BadInput, match="update/zero_grads_inside has shape"):
        api.compare(loops / "baseline", short)


def test_a_recorder_on_rank_0_alone_says_so_within_its_timeout(loops):
    """It waited silently for gloo's 30-minute timeout while rank 1 trained on."""
    said = (loops / "rank0-alone.txt").read_text()
    assert "not every rank created its Recorder within 2 s" in said, said
    assert "Ranks 1 failed" in said and "not on rank 0 alone" in said, said
    assert not (loops / "rank0-alone").exists()


def test_the_syncing_backward_skipped_is_micro_batch_missing_first(loops):
    """The window's last micro-step, the one DDP syncs, forwarded and never backpropagated: the
    ranks step on their own unsynced gradients, so the replicas part too, and
    `replicas-diverged` was named first, blaming the sync flag; the skipped backward explains
    the parted replicas and comes first (a cold probe's `--fault skip-last-backward --nproc 2`)."""
    codes = [d.code for d in errors(judged(loops, "skip-last-backward"))]
    assert codes[:1] == ["micro-batch-missing"], codes
