"""The transformers Trainer, recorded by `attach(trainer, out)`: the README's commands run as
written (examples/frameworks/transformers_trainer.py: a tiny GPT-2 built from a config on padded
token data), and the other broken variants."""

from __future__ import annotations

import json

import pytest
import torch

from gradalign.api import compare
from gradalign.errors import BadInput
from gradalign.runs.reader import read_run_dir

from .frameworks import all_checked, example, judged, require, run_readme

require("transformers")
hf = example("transformers_trainer")


def quiet_args(scratch: str, rows: int, k: int, steps: int, **options):
    """TrainingArguments on the CPU at lr 1e-2 that write no logs, checkpoints or bars (unless
    `options` say otherwise)."""
    from transformers import TrainingArguments

    quiet = {"save_strategy": "no", "logging_strategy": "no", "disable_tqdm": True}
    return TrainingArguments(
        output_dir=scratch,
        per_device_train_batch_size=rows,
        gradient_accumulation_steps=k,
        max_steps=steps,
        learning_rate=1e-2,
        use_cpu=True,
        report_to=[],
        **{**quiet, **options},
    )


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("readme-hf")
    return cwd / "runs" / "hf", run_readme("transformers Trainer", cwd)


def test_the_readme_commands_pass_clean_and_name_the_pre_2024_trainer(readme):
    root, results = readme
    assert results["runs/hf/k4"][2] < 0.6  # worst err/allowed of the clean run
    assert results["runs/hf/k4-token-mean"][2] > 1e3
    assert set(all_checked(root / "k1", root / "k4").values()) == {"pass"}


def test_the_run_holds_what_the_trainer_never_shows_its_callbacks(readme):
    root, _ = readme
    run, base = read_run_dir(root / "k4"), read_run_dir(root / "k1")
    assert run.accum_steps == 4 and run.updates == hf.UPDATES
    items = run.micro_items.reshape(hf.UPDATES, 4)
    assert len(set(items[0])) > 1  # padded micro-batches hold different numbers of tokens
    assert (items.sum(axis=1) == base.micro_items).all()  # the same tokens per update
    # the Trainer's num_items_in_batch (attach checks every window against it): transformers
    # 5.17 shifts the labels it counts only for a model whose class name says ForCausalLM, so
    # GPT2LMHeadModel counts every real label (and Llama, below, one fewer per sequence)
    rows = hf.token_rows(hf.BATCH * hf.UPDATES)
    assert items.sum() == sum(len(r["input_ids"]) for r in rows)
    manifest = json.loads((root / "k1" / "manifest.json").read_text())
    assert manifest["reference"] == "../k1-fp64"
    assert manifest["config"]["framework"] == "transformers"
    assert base.grad_norm_pre_clip is not None and base.lr is not None
    assert (base.optimizer_steps == 1).all()


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
@pytest.mark.parametrize(
    "bug, code", [("double-scale", "loss-scale"), ("scheduler-per-batch", "lr-schedule")]
)
def test_a_broken_trainer_run_fails_with_its_code(readme, bug, code):
    runs = hf.record_all(readme[0], bug)
    verdict, codes, worst = judged(runs["k1"], runs[f"k4-{bug}"])
    assert verdict == "fail" and codes[:1] == [code], codes
    assert worst > 1e3
    assert "loss-averaging" not in codes, codes  # the losses read off the backward: its scale
    if bug == "double-scale":  # the fix is what a Trainer user changes, not a backward() call
        fix = compare(runs["k1"], runs[f"k4-{bug}"]).diagnosis[0].fix
        assert "gradient_accumulation_steps" in fix and "compute_loss" in fix, fix
        assert "backward()" not in fix, fix


def test_a_llama_trainer_run_counts_the_tokens_it_predicts(tmp_path):
    runs = hf.record_all(tmp_path, model="llama")
    verdict, codes, worst = judged(runs["k1"], runs["k4"])
    assert verdict == "pass" and not codes and worst < 0.6, (codes, worst)
    rows = hf.token_rows(hf.BATCH * hf.UPDATES)
    items = read_run_dir(runs["k4"]).micro_items
    assert items.sum() == sum(len(r["input_ids"]) - 1 for r in rows)


def test_a_float32_trainer_is_the_reference_of_bf16_trainer_runs(tmp_path):
    """With `bf16=True` the runs compute in bfloat16; the same Trainer in float32 without it is
    a reference of them (judge/rerun.py `check_more_precise`): used, the clean K=4 passes and
    the pre-2024 Trainer is named."""
    hf.train(tmp_path / "k1-fp32", 1)
    base = hf.train(tmp_path / "k1", 1, bf16=True, reference="../k1-fp32")
    assert read_run_dir(base).compute_dtype == "bfloat16"
    clean = compare(base, hf.train(tmp_path / "k4", 4, bf16=True))
    assert clean.verdict == "pass" and clean.reference is not None, clean.diagnosis
    bug = compare(base, hf.train(tmp_path / "k4-bug", 4, bf16=True, bug="token-mean"))
    assert (bug.verdict, bug.diagnosis[0].code) == ("fail", "token-normalization")


def test_the_float64_reference_keeps_the_loss_in_float64():
    from gradalign.record.integrations.transformers_float64 import float64_reference

    model = float64_reference(hf.tiny_gpt2())
    loss = model(**hf.collate(hf.token_rows(4))).loss
    assert loss.dtype == torch.float64  # transformers' own loss would round it to float32


def test_the_float64_reference_of_a_mixture_of_experts_runs_its_experts_eagerly():
    """transformers' default experts implementation (grouped_mm) refuses float64 matrices: the
    float64 rerun of a Mixtral failed in its first forward."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from gradalign.record.integrations.transformers_float64 import float64_reference

    config = MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    model = MixtralForCausalLM(config)
    assert model.config._experts_implementation == "grouped_mm"
    model = float64_reference(model)
    batch = hf.collate(hf.token_rows(4))
    loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
    loss.backward()
    assert loss.dtype == torch.float64 and model.config._experts_implementation == "eager"


def test_attach_refuses_what_is_not_a_trainer(tmp_path):
    from gradalign.record.integrations.transformers import attach

    with pytest.raises(BadInput, match=r"transformers\.Trainer"):
        attach(object(), tmp_path / "run")


def test_a_failed_train_leaves_no_run_behind(tmp_path, monkeypatch):
    def broken(rows):
        raise RuntimeError("collator failed")

    monkeypatch.setattr(hf, "collate", broken)
    with pytest.raises(RuntimeError, match="collator failed"):
        hf.train(tmp_path / "k4", 4)
    assert list(tmp_path.iterdir()) == []


def test_labels_under_another_name_are_counted_as_the_trainer_names_them(tmp_path):
    """`label_names=["targets"]`: the Trainer finds no `labels`, gives no num_items_in_batch and
    divides each micro-batch's token mean by K. The items counted from `targets` name that
    `token-normalization`; it was `cross-sample-loss`, advising items= that attach cannot take."""
    import tempfile

    from transformers import Trainer

    from gradalign.record.integrations.transformers import attach

    class TargetsTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            targets = inputs.pop("targets")[:, 1:]
            logits = model(**inputs).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
            )
            return (loss, None) if return_outputs else loss

    def collate(rows):
        batch = hf.collate(rows)
        batch["targets"] = batch.pop("labels")
        return batch

    def train(out, k):
        with tempfile.TemporaryDirectory() as scratch:
            args = quiet_args(scratch, hf.BATCH // k, k, 3, label_names=["targets"])
            trainer = TargetsTrainer(
                model=hf.tiny_gpt2(),
                args=args,
                train_dataset=hf.token_rows(hf.BATCH * 3),
                data_collator=collate,
            )
            attach(trainer, out)
            trainer.train()

    train(tmp_path / "k1", 1)
    train(tmp_path / "k4", 4)
    assert read_run_dir(tmp_path / "k4").micro_items is not None
    result = compare(tmp_path / "k1", tmp_path / "k4", reference="none")
    assert result.verdict == "fail" and result.diagnosis[0].code == "token-normalization"


def test_an_iterable_datasets_epoch_ending_inside_a_window_is_named(tmp_path):
    """72 rows in micro-batches of 4 at K=4: the Trainer never steps epoch 0's last two
    micro-batches alone, and counts their items apart from the next window's. The refusal said
    'this transformers version counts items another way; please report it'."""
    import tempfile

    from torch.utils.data import IterableDataset
    from transformers import Trainer

    from gradalign.record.integrations.transformers import attach

    class Rows(IterableDataset):
        def __iter__(self):
            return iter(hf.token_rows(72))

    with tempfile.TemporaryDirectory() as scratch:
        args = quiet_args(scratch, 4, 4, 7)
        trainer = Trainer(
            model=hf.tiny_gpt2(), args=args, train_dataset=Rows(), data_collator=hf.collate
        )
        attach(trainer, tmp_path / "k4")
        with pytest.raises(BadInput, match="IterableDataset whose epoch ends inside a window"):
            trainer.train()
    assert not (tmp_path / "k4").exists()


def _padded_pair(tmp_path, trainer_class=None, model=None, padded=True, **extra) -> None:
    """k1 and k4 of a tiny GPT-2 Trainer over padded rows (2 updates; `padded=False`: rows of
    one length), `extra` given to the Trainer; `trainer_class` a subclass of the Trainer,
    `model` one that builds the model."""
    import tempfile

    from transformers import Trainer

    from gradalign.record.integrations.transformers import attach

    for k in (1, 4):
        with tempfile.TemporaryDirectory() as scratch:
            trainer = (trainer_class or Trainer)(
                model=(model or hf.tiny_gpt2)(),
                args=quiet_args(scratch, hf.BATCH // k, k, 2),
                train_dataset=hf.token_rows(hf.BATCH * 2, padded=padded),
                data_collator=hf.collate,
                **extra,
            )
            attach(trainer, tmp_path / f"k{k}")
            trainer.train()


def test_a_term_a_trainer_normalized_by_its_window_never_was_is_no_token_normalization(tmp_path):
    """A compute_loss_func: the summed token loss over num_items_in_batch (the window's items,
    right) plus a z-loss averaged over each micro-batch and not divided by K (wrong). The
    Trainer normalized the token loss by the window, so no micro-batch's mean was divided by
    K; it was named `token-normalization`, with the fix the Trainer already applies, then
    `unexplained`: the micro-batches' unequal token counts, and without a reference the norm
    before clipping that the same gradient moved, kept `cross-sample-loss` from reading it."""

    def loss_func(outputs, labels, num_items_in_batch=None):
        logits = outputs.logits[:, :-1]
        targets = labels[:, 1:]
        summed = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
        )
        z = logits.logsumexp(-1).pow(2).mean()
        return summed / num_items_in_batch + 1e-2 * z

    _padded_pair(tmp_path, compute_loss_func=loss_func)
    assert read_run_dir(tmp_path / "k4").config["loss_normalized_by"] == "num_items_in_batch"
    result = compare(tmp_path / "k1", tmp_path / "k4", reference="none")
    codes = [d.code for d in result.diagnosis]
    assert result.verdict == "fail" and codes[0] == "cross-sample-loss", codes


def test_a_compute_loss_func_returning_each_mean_is_no_loss_over_the_micro_batch(tmp_path):
    """A compute_loss_func that ignores num_items_in_batch and returns each micro-batch's mean:
    the Trainer divides it by nothing (K times the gradient, micro-batches weighted alike). Its
    loss is read back as normalized by the window's items, about K times the baseline's: that
    gap was named `cross-sample-loss` too (16.65 against 3.82 beside a gradient 4.27 times the
    baseline's), a loss over each micro-batch that nothing computed."""
    import tempfile

    from transformers import Trainer

    from gradalign.record.integrations.transformers import attach
    from gradalign.record.integrations.transformers_float64 import float64_reference

    def summed(outputs, labels, num_items_in_batch=None):  # right: over the window's items
        logits, targets = outputs.logits[:, :-1], labels[:, 1:]
        flat, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        return torch.nn.functional.cross_entropy(flat, targets, reduction="sum") / (
            num_items_in_batch
        )

    def mean(outputs, labels, num_items_in_batch=None):  # the bug: num_items_in_batch ignored
        logits, targets = outputs.logits[:, :-1], labels[:, 1:]
        flat = logits.reshape(-1, logits.shape[-1])
        return torch.nn.functional.cross_entropy(flat, targets.reshape(-1), ignore_index=-100)

    for name, k, func, model in [
        ("k1", 1, summed, hf.tiny_gpt2),
        ("k1-fp64", 1, summed, lambda: float64_reference(hf.tiny_gpt2())),
        ("k4", 4, mean, hf.tiny_gpt2),
    ]:
        with tempfile.TemporaryDirectory() as scratch:
            trainer = Trainer(
                model=model(),
                args=quiet_args(scratch, hf.BATCH // k, k, hf.UPDATES, seed=0),
                train_dataset=hf.token_rows(hf.BATCH * hf.UPDATES),
                data_collator=hf.collate,
                compute_loss_func=func,
            )
            attach(trainer, tmp_path / name)
            trainer.train()
    for reference in ("none", tmp_path / "k1-fp64"):
        result = compare(tmp_path / "k1", tmp_path / "k4", reference=reference)
        codes = [d.code for d in result.diagnosis]
        assert codes[0] == "loss-scale" and "cross-sample-loss" not in codes, (reference, codes)


def test_a_compute_loss_of_its_own_that_divides_each_mean_by_k_is_token_normalization(tmp_path):
    """A Trainer subclass whose compute_loss returns the model's mean divided by K, ignoring
    the num_items_in_batch it is given: the run said the Trainer normalized by the window's
    items, so the micro-batches' unequal token counts were read as a loss over each of them
    (`cross-sample-loss`, with a mixture of experts' fix) where `token-normalization` is meant."""
    from transformers import Trainer

    class MeanOverK(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return model(**inputs).loss / self.args.gradient_accumulation_steps

    _padded_pair(tmp_path, MeanOverK)
    assert read_run_dir(tmp_path / "k4").config["loss_normalized_by"] == "a compute_loss of its own"
    result = compare(tmp_path / "k1", tmp_path / "k4", reference="none")
    codes = [d.code for d in result.diagnosis]
    assert result.verdict == "fail" and codes[0] == "token-normalization", codes
    # the run cannot say whether its own compute_loss divided by num_items_in_batch: said
    assert "super().compute_loss does" in result.diagnosis[0].message


def _mean_only_gpt2():
    """A model as stock BART is in the Trainer: its forward takes **kwargs (so the Trainer
    hands it num_items_in_batch and does not divide by K) and returns its own mean loss,
    ignoring the count; it draws LayerDrop's number at layerdrop 0, which skips nothing."""
    from transformers import GPT2LMHeadModel

    class MeanOnly(GPT2LMHeadModel):
        def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
            if self.training:
                torch.rand([])  # LayerDrop's draw, compared with layerdrop = 0
            return super().forward(
                input_ids=input_ids, attention_mask=attention_mask, labels=labels
            )

    tiny = hf.tiny_gpt2()
    model = MeanOnly(tiny.config)
    model.load_state_dict(tiny.state_dict())
    return model


def test_a_model_ignoring_num_items_in_batch_names_the_scale_and_the_reweighting(tmp_path):
    """Each micro-batch's own mean, not divided by K: the gradient is K times the baseline's
    and its micro-batches weighted alike whatever their tokens. Named `loss-scale` beside a
    cause 'named with it', which was `dropout-rng` for the harmless draw: the run said the
    Trainer normalized by the window's items, and that kept `token-normalization` unread."""
    _padded_pair(tmp_path, model=_mean_only_gpt2)
    assert read_run_dir(tmp_path / "k4").config["loss_normalized_by"] == "num_items_in_batch"
    result = compare(tmp_path / "k1", tmp_path / "k4", reference="none")
    codes = [d.code for d in result.diagnosis]
    assert result.verdict == "fail" and codes == ["loss-scale", "token-normalization"], codes
    assert "num_items_in_batch" in result.diagnosis[0].fix


def test_a_model_ignoring_num_items_in_batch_on_rows_of_one_length_is_the_scale_alone(tmp_path):
    """The same model on rows of one length: the scale alone, K times, whose gradient at update
    0 points where the baseline's does, so the harmless draw is no `dropout-rng` beside it (it
    was, as for stock BART on such rows)."""
    _padded_pair(tmp_path, model=_mean_only_gpt2, padded=False)
    result = compare(tmp_path / "k1", tmp_path / "k4", reference="none")
    codes = [d.code for d in result.diagnosis]
    assert result.verdict == "fail" and codes == ["loss-scale"], codes


def _masked_lm_pair(tmp_path, fixed: bool) -> None:
    """k1 and k4 of a tiny stock BertForMaskedLM (4 updates), its collator masking 30% of each
    batch's tokens by draws made per batch, as a masked-LM collator does: the micro-batches of
    k4 draw other masks than k1's batches. `fixed`: k4's Trainer divides each micro-batch's
    loss by K itself (`model_accepts_loss_kwargs = False`)."""
    import tempfile

    from transformers import BertConfig, BertForMaskedLM, Trainer

    from gradalign.record.integrations.transformers import attach

    def masking(rows):
        batch = hf.collate(rows)
        ids, real = batch["input_ids"], batch["attention_mask"].bool()
        masked = (torch.rand(ids.shape) < 0.3) & real
        labels = ids.masked_fill(~masked, -100)
        return {**batch, "input_ids": ids.masked_fill(masked, 3), "labels": labels}

    config = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    for k in (1, 4):
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as scratch:
            trainer = Trainer(
                model=BertForMaskedLM(config),
                args=quiet_args(scratch, hf.BATCH // k, k, 4, remove_unused_columns=False),
                train_dataset=hf.token_rows(hf.BATCH * 4),
                data_collator=masking,
            )
            if fixed and k > 1:
                trainer.model_accepts_loss_kwargs = False
            attach(trainer, tmp_path / f"k{k}")
            trainer.train()


@pytest.mark.parametrize("fixed", [False, True])
def test_masks_drawn_per_batch_do_not_hide_a_model_ignoring_num_items_in_batch(tmp_path, fixed):
    """Masked-LM masks drawn per batch (other samples: `data-order`) beside a stock model that
    takes **kwargs, so the Trainer hands it num_items_in_batch and does not divide by K, and
    whose loss ignores it (BertForMaskedLM under the pinned transformers: each micro-batch's
    mean, K times too large). The other masks turn the gradient, so its shape named nothing
    and `data-order` stood alone, its fix naming the masking only; the gradient's size and the
    losses still say K (`loss-scale`, the Trainer's fix). Divided by K, `data-order` alone."""
    _masked_lm_pair(tmp_path, fixed)
    result = compare(tmp_path / "k1", tmp_path / "k4", reference="none")
    codes = [d.code for d in result.diagnosis]
    assert result.verdict == "fail" and codes[0] == "data-order", codes
    if fixed:
        assert codes == ["data-order"], codes
        return
    assert codes == ["data-order", "loss-scale"], codes
    scaled = result.diagnosis[1]
    assert scaled.evidence["expected_ratio"] == 4, scaled.evidence
    assert abs(scaled.evidence["window_loss_ratio"] / 4 - 1) <= 0.05, scaled.evidence
    assert "num_items_in_batch" in scaled.fix


def test_a_run_resumed_from_a_checkpoint_is_refused_beside_one_from_its_start(tmp_path, cli):
    """A merged Trainer resumed from its own checkpoint at step 3 recorded its updates 3 to 5
    as 0 to 2: refused as "the merged run stopped early? both hold updates 0 to 2", which was
    false. Its start is recorded, and runs that began at other updates are refused saying so."""
    import tempfile

    from transformers import Trainer

    from gradalign.record.integrations.transformers import attach

    data = hf.token_rows(hf.BATCH * 6)

    def trainer(scratch: str, k: int, save: bool = False) -> Trainer:
        options = {"save_strategy": "steps", "save_steps": 3} if save else {}
        args = quiet_args(scratch, hf.BATCH // k, k, 6, seed=0, **options)
        model = hf.tiny_gpt2()
        return Trainer(model=model, args=args, train_dataset=data, data_collator=hf.collate)

    with tempfile.TemporaryDirectory() as scratch:
        base = trainer(scratch, 1)
        attach(base, tmp_path / "k1")
        base.train()
    with tempfile.TemporaryDirectory() as scratch:
        trainer(scratch, 4, save=True).train()
        resumed = trainer(scratch, 4)
        attach(resumed, tmp_path / "k4")
        resumed.train(resume_from_checkpoint=f"{scratch}/checkpoint-3")
    assert read_run_dir(tmp_path / "k4").config["resumed_at_update"] == 3
    result = cli("compare", tmp_path / "k1", tmp_path / "k4")
    assert result.code == 2 and "began at other updates" in result.err, result.err
    assert "the merged at update 3" in result.err and "stopped early" not in result.err
