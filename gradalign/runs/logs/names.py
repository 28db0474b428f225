"""What a field of a training log is named, shared by keyed lines (`grammar`) and structured
records (`records`): which names are a step, the training loss, the learning rate. Numpy-free.

    step       step, global_step, micro_step, iter, iteration, batch_id, batch_idx, num_updates
               (`Step`, `trainer/global_step` and `_step` alike)
    loss       `loss` plainly; else a training loss (`train_loss`, `train/loss`, `train_loss_step`);
               else the first other named loss (`lm loss`, `nll_loss`, OLMo's
               `train/CrossEntropyLoss`: words split at capitals); never another quantity's
               (`val`, `eval`, `aux`, `running`, `avg`, `kl`, ... before `loss`, `loss_scale`,
               `loss_epoch`); a named loss beside a `total` one and no plain `loss` is refused;
               Composer's `loss/train/total` (its parts `loss/train/<part>`) a training loss
    lr         lr, learning_rate, `learning rate`, `train/learning_rate`, `lr-<Optimizer>`
               (Lightning's LearningRateMonitor: `lr-SGD`, `lr-AdamW/pg1`)
    skips      Megatron-LM's `number of skipped iterations: N` on a keyed line (`skips.py`)
    scale      `loss scale: 65536.0`, `loss_scale=1024` on a keyed line
    size       the micro-batch's count its mean loss was taken over: `bsz`, `batch_size`,
               `num_samples`, `num_items`, `ntokens`, `tokens` (an integer; not `consumed
               samples` or `total tokens`, which count the run so far)
"""

from __future__ import annotations

import functools
import re

from ...errors import BadInput

# A log printed every n steps: how each tool prints every step.
EVERY_STEP_ADVICE = (
    "print every step, e.g. Megatron's --log-interval 1, PaddleNLP's --logging_steps 1, the "
    "transformers Trainer's logging_steps=1, Lightning's log_every_n_steps=1, "
    "paddle.Model.fit(log_freq=1), MMEngine's LoggerHook(interval=1), timm's --log-interval 1, "
    "PaddleDetection's log_iter: 1, PaddleSeg's --log_iters 1, "
    "PaddleOCR's Global.print_batch_step: 1, torchtitan's --metrics.log_freq 1, nanoGPT's "
    "log_interval = 1"
)

MAX_DIGITS = 18  # a step, epoch or count printed with more digits is no training's


def whole(digits: str) -> int:
    """A printed step, epoch or count: refused past MAX_DIGITS digits (Python reads at most
    4300, and no training counts that far)."""
    if len(digits) > MAX_DIGITS:
        raise BadInput(f"a step or count printed with {len(digits)} digits cannot be read")
    return int(digits)


# a step key as a regular expression (keyed lines match it inside a line)
STEP_KEY = (  # accelerate's no_trainer examples count updates in `completed_steps`
    r"(?:(?:global|micro)[\s_]?)?(?:step|iter(?:ation)?|batch(?:[\s_]?(?:id|idx))?)"
    r"|num[\s_]updates|completed[\s_]steps"
)
# in a keyed line, followed by its number: also DeepSpeed's PipelineEngine's `steps: 12`
LINE_STEP_KEY = STEP_KEY.replace("(?:step|", "(?:steps?|", 1)
QUALIFIERS = {"avg", "mean", "average", "val", "valid", "eval", "test", "total", "smoothed"}
# a word before `loss` that names another quantity than the step's training loss
OTHER_LOSSES = QUALIFIERS | {
    *("aux", "auxiliary", "kl", "reg", "ema", "running", "moving", "smooth", "router", "z"),
    *("balance", "d", "g", "disc", "gen", "recon", "contrastive", "validation", "dev"),
}
TRAINING = {"train", "training"}
# a record's step field: also LLaMA-Factory's trainer_log.jsonl `current_steps`
_STEP_FIELD = re.compile(rf"(?:{STEP_KEY})|current[\s_]steps?", re.IGNORECASE)
_LR_FIELD = re.compile(  # `train/learning_rate` as loggers prefix it
    r"(?:train[/.])?(?:lr|learning[\s_]rate)(?:-[A-Za-z]\w*(?:/pg\d+)?)?", re.IGNORECASE
)
# the gradient's total norm a record prints (the Trainer's `grad_norm`: clip_grad_norm_'s
# return, the norm before clipping), `train/grad_norm` as loggers prefix it
_NORM_FIELD = re.compile(r"(?:train[/.])?(?:grad(?:ient)?[\s_\-]?norm|gnorm)", re.IGNORECASE)
# the count a step's mean loss was taken over, by which micro-steps are weighted (`batch_size`)
SIZE_KEY = (
    r"bsz|batch[\s_\-]?size|n(?:um)?[\s_\-]?(?:samples|items|tokens)(?:[\s_\-]in[\s_\-]batch)?"
    r"|samples|items|tokens"
)
_SIZE_FIELD = re.compile(rf"(?:train[/.])?(?:{SIZE_KEY})", re.IGNORECASE)
_KEYED_SIZE = re.compile(
    rf"(?<![\w./])(?:(?P<before>\w+)[\s_])?(?:{SIZE_KEY})\b\s*+[:=]?\s*+(?P<size>\d+)(?![\w.])",
    re.IGNORECASE,
)
_RUN_SO_FAR = {"consumed", "total", "seen", "cumulative", "global", "trained", "processed"}
_WORDS = re.compile(r"[\s_/.\-]+")
_CAMEL = re.compile(r"(?<=[a-z\d])(?=[A-Z])")  # `CrossEntropyLoss`, `trainLoss`: words too


def _words(name: str) -> list[str]:
    """A field name's words, lower case: split at separators and where a capital follows a
    lower-case letter or a digit (`train/CrossEntropyLoss` -> train, cross, entropy, loss)."""
    return [w for w in _WORDS.split(_CAMEL.sub(" ", name.strip()).lower()) if w]


_SKIPPED = re.compile(  # Megatron-LM's count since its last line (`nan iterations` among them)
    r"(?<![\w.])number\s+of\s+skipped\s+iterations\s*+[:=]?\s*+(?P<count>\d+)(?![\w.])",
    re.IGNORECASE,
)
_SCALE = re.compile(
    r"(?<![\w.])loss[\s_]scale\s*+[:=]?\s*+(?P<scale>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)(?![\w.])",
    re.IGNORECASE,
)


def _last_part(name: str) -> str:
    """`trainer/global_step` -> `global_step`; `_step` -> `step`."""
    return name.strip().rsplit("/", 1)[-1].lstrip("_")


@functools.lru_cache(maxsize=1 << 12)  # a log's records repeat the same few names
def is_step_field(name: str) -> bool:
    """Whether a record's field names the step (`step`, `global_step`, `Step`, `num_updates`)."""
    return _STEP_FIELD.fullmatch(_last_part(name)) is not None


@functools.lru_cache(maxsize=1 << 12)
def is_lr_field(name: str) -> bool:
    """Whether a record's field is the learning rate (`lr`, `learning_rate`, `lr-SGD`)."""
    return _LR_FIELD.fullmatch(name.strip()) is not None


def is_norm_field(name: str) -> bool:
    """Whether a record's field is the gradient's total norm (`grad_norm`, `gnorm`)."""
    return _NORM_FIELD.fullmatch(name.strip()) is not None


def is_size_field(name: str) -> bool:
    """Whether a record's field is the micro-batch's count (`num_items`, `bsz`, `ntokens`)."""
    return _SIZE_FIELD.fullmatch(name.strip()) is not None


def batch_size(text: str) -> int | None:
    """The count a keyed line says its loss was a mean over (`bsz 8`, `num_items: 120`): None
    where it prints none, or a count of the run so far (`consumed samples: 6400`)."""
    for found in _KEYED_SIZE.finditer(text):
        if (found["before"] or "").lower() not in _RUN_SO_FAR:
            return whole(found["size"])
    return None


def skipped_count(text: str) -> int | None:
    """The iterations a keyed line says its loss scaler skipped (None: it prints no count)."""
    found = _SKIPPED.search(text) if "skipped" in text.lower() else None
    return None if found is None else whole(found["count"])


def loss_scale(text: str) -> float | None:
    """The loss scale a keyed line prints, if it prints one."""
    found = _SCALE.search(text) if "scale" in text.lower() else None
    return None if found is None else float(found["scale"])


def is_other_loss_word(word: str) -> bool:
    """Whether a word before `loss` names another quantity (`aux`, `val`, `running`, ...)."""
    return word.lower() in OTHER_LOSSES


def loss_rank(name: str) -> int | None:
    """How plainly a record's field names the training loss: 0 for `loss`, 1 for a training
    loss (`train_loss`, `train/loss`, `train_loss_step`), 2 for another named loss whose words
    name no other quantity (`lm loss`, `nll_loss`); None for any other field (`eval_loss`,
    `aux_loss`, `loss_scale`, `train_loss_epoch`)."""
    words = _words(name)
    if len(words) > 1 and words[-1] == "step":
        words = words[:-1]  # Lightning's `train_loss_step` (`_epoch` is an epoch's mean)
    if len(words) > 1 and words[0] == "loss" and words[1] in TRAINING:
        # `loss/<split>/<name>` (Composer's): `loss/train/total` is the step's loss, the sum of
        # its named parts, each `loss/train/<part>`
        rest = words[2:]
        if rest in ([], ["total"]):
            return 1
        return None if any(w in OTHER_LOSSES for w in rest) else 2
    if not words or words[-1] != "loss":
        return None
    before = words[:-1]
    if not before:
        return 0
    if any(w in OTHER_LOSSES for w in before):
        return None
    return 1 if all(w in TRAINING for w in before) else 2


def choose_loss(names: list[str]) -> int | None:
    """Which of a line's or record's loss fields is the training loss (its position), by
    `loss_rank`: the plainest, the first of equals; None if none is. A named component (`ce
    loss`) chosen beside a `total` loss is refused: the total of the components is what the
    optimizer steps on, yet `total` may also be a sum over steps, so neither can be read."""
    ranked = [(rank, at) for at, name in enumerate(names) if (rank := loss_rank(name)) is not None]
    if not ranked:
        return None
    rank, at = min(ranked)
    totals = [name for name in names if "total" in _words(name)]
    if rank == 2 and totals:
        raise BadInput(
            f"the loss fields {totals[0]!r} and {names[at]!r}, none plainly named 'loss': which "
            "is the training loss is not clear; print the loss the optimizer steps on as "
            "'loss: <value>'"
        )
    return at
