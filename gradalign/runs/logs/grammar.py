"""The grammar of a training log, line by line: what is a step, a printed array, a window mean.

    0   [0.29568613]                  a step line: its index and its loss, with or without
    0   2.3205233                     brackets (Paddle 3 prints a 0-d loss bare); `step 0 loss
                                      0.29` and `iter 0: 0.29` read alike
    epoch 0, step: 0, loss: 2.29, lr  a keyed step line: step keys (`step`, `iter`, `batch_id`,
                                      `global step`, `micro_step`, `num_updates=`; `Step[0/48]`;
                                      DeepSpeed's `steps: 12`; Paddle's `step 3/30 [==>..]` bar;
                                      of two, the one that counts) and a `loss` key anywhere in
                                      the line (`names` says which), other fields ignored
    Iter(train) [ 3/20] ... loss: 2.3 where no step key, a counter before the loss is the step
                                      (`[0/60000 (0%)]`, `3 / 20`; one striding by samples too)
    ------------>[[ 0.00325679 ...    an arrow line: a printed array (1-D or 2-D, numpy style,
     [ 0.01504303 ... -0.02287037        possibly truncated with `...`, fixed or scientific
      ...                                notation, commas allowed); `name -->[...]` names it
    avgloss -------->[0.29568613]     a labelled mean: the window mean the script printed
    [[ 0.1  0.2] [ 0.3  0.4]]         an unlabelled array on its own line, if it parses as one

A line may carry a prefix a launcher or logger put there (`[rank0]: `, `[1,0]<stdout>:`,
timestamps, `[INFO]`, `LAUNCH INFO`, `train.py:42 -`): it is dropped. A Paddle dygraph Tensor
(`Tensor(shape=[..], dtype=.., place=.., stop_gradient=..,` then its data and `)`) reads as its
data, in the place the Tensor was printed; torch's `tensor(2.3, device=..)` and numpy 2's
`np.float32(2.3)` as `2.3`. A tqdm bar a line was glued to is dropped (`lines`). From a line of
its own announcing an evaluation (`eval_begins`) to its end (`eval_ends`, an epoch header) lines
are the evaluation's (`parse` reads them). Everything else (framework messages, warnings,
progress bars, Keras's running-mean bar, evaluation lines) is noise. Each number keeps how it
was printed (digits, exponent), so the reader can judge it at its own printed precision.
Structured records (JSON, dicts, tables) are `records`'. This module is numpy-free.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ...errors import BadInput
from .lines import BAR
from .names import LINE_STEP_KEY, batch_size, choose_loss, loss_scale, skipped_count, whole

_NUMBER = re.compile(
    r"^[-+]?(?:(?P<int>\d+)\.(?P<frac>\d*)|\.(?P<frac2>\d+)|(?P<bare>\d+))"
    r"(?:[eE](?P<exp>[-+]?\d+))?$|^(?P<special>[-+]?(?:nan|inf))\.?$",  # Paddle prints `inf.`
    re.IGNORECASE,
)
_STEP = re.compile(
    r"^(?:(?:step|iter|iteration|batch)\s*+[:=#]?\s*+)?(?P<index>\d+)(?:\s*+[,:])?\s++"
    r"(?:loss\s*+[:=]?\s*+)?(?P<loss>\S.*?)$",
    re.IGNORECASE,
)
_GROUPED = re.compile(r"(?<![\w.,])[1-9]\d{0,2}(?:,\d{3})+(?!\d|,\d)")  # `1,200`, `6,831.87`
_DECIMAL_COMMA = re.compile(r",\d")  # right after a value read: `loss 1,588130` is not 1
_PRINTED = re.compile(r"[-+]?\d[\d.,]*(?:[eE][-+]?\d+)?")
_BRACKETED_STEP = re.compile(r"^\d+\s+\[[^\[\]]*\]$")  # `0   [..]`: a step line, whatever is inside
_ARROW = re.compile(r"^(?P<label>.*?)(?<!\s)\s*+(?:(?<!-)-++|(?<!=)=++)>\s*(?P<rest>.*)$")
_MEAN_LABEL = re.compile(r"^(?:avg|mean|average)[\s_-]*loss$", re.IGNORECASE)
_MEAN_LINE = re.compile(
    r"^(?P<label>(?:avg|mean|average)[\s_-]*loss)\s*+(?:-+>|=+>|[:=])?\s*+(?P<rest>[-+.\[\d].*)$",
    re.IGNORECASE,
)
_KEYED_INDEX = re.compile(  # `step 3`, `step: 3`, `Step[3/48]`, `batch_id: 3`, `num_updates=3`
    rf"(?<![\w./])(?P<key>{LINE_STEP_KEY})\b\s*+(?:[:=#]|is\b)?\s*+(?P<open>\[)?\s*+(?P<index>\d+)"
    r"(?:\s*/\s*\d+)?\s*(?(open)\])(?![\w.])",
    re.IGNORECASE,
)
_LOSS_VALUE = r"\s*+[:=]?\s*+(?P<loss>\[*[^\s,;|\[\]]+\]*)"  # `: [2.3]`, `=2.3` before `|` or `;`
_KEYED_LOSS = re.compile(  # `loss 2.3`, `loss: [2.3]`, `loss is: 2.3`, `train_loss=2.3`, NeMo's
    # `reduced_train_loss: 2.3` (of the names joined by `_`, only a training loss's: `ce_loss` no),
    # Composer's `loss/train/total: 2.3` (the step's loss, the sum of its `loss/train/<part>`s)
    r"(?<![\w.])(?:(?:[A-Za-z][A-Za-z\d]*_)*train(?:ing)?[\s_])?loss(?:/train/total)?\b"
    r"(?:\s++is)?" + _LOSS_VALUE,
    re.IGNORECASE,
)
_JOINED_LOSS = re.compile(  # any loss named by words joined with `_` (GPT-NeoX's `lm_loss: 2.3`)
    r"(?<![\w.])[A-Za-z][A-Za-z\d]*(?:_[A-Za-z\d]+)*_loss\b" + _LOSS_VALUE, re.IGNORECASE
)
_CAMEL_LOSS = re.compile(  # a loss named in CamelCase (OLMo's `train/CrossEntropyLoss=2.3`)
    r"(?<![\w.])(?:\w+/)*[A-Za-z][A-Za-z\d]*[a-z\d]Loss\b" + _LOSS_VALUE
)
_LOSS_AT_STEP = re.compile(  # the TensorFlow guide's custom loop: `Training loss (for one
    # batch) at step 3: 2.29`, the loss named before the step, its value after it
    r"(?<![\w.])(?P<name>(?:[A-Za-z]\w*[\s_])?loss)(?:\s*\([^()]*\))?\s+at\s+"
    r"(?P<key>step|iter(?:ation)?|batch)\s+(?P<step>\d+)\s*[:=]\s*(?=[-+.\[\d])",
    re.IGNORECASE,
)
_KEYED_LR = re.compile(  # `lr: 0.001`, `lr=[0.0001]`, `learning_rate: 5e-05`, `learning rate: 1E-4`
    # PaddleClas's `lr(LinearWarmup): 0.1` (the schedule's name in parentheses, as `Epoch(train)`)
    r"(?<![\w.])(?:lr|learning[\s_]rate)\b(?:\(\w+\))?\s*+[:=]?\s*+(?P<lr>\[*[^\s,\[\]|]+\]*)",
    re.IGNORECASE,
)
_KEYED_NORM = re.compile(  # `grad_norm: 1.2` (torchtitan, MMEngine), Megatron's `grad norm: 1.2 |`,
    # fairseq's `gnorm=1.2`: the total norm clip_grad_norm_ returns, before clipping
    r"(?<![\w.])(?:grad(?:ient)?[\s_\-]?norm|gnorm)\b\s*+[:=]?\s*+(?P<norm>\[*[^\s,\[\]|]+\]*)",
    re.IGNORECASE,
)
_LEAD_INDEX = re.compile(  # CLU's text writer (Flax's examples): `[3] learning_rate=0.1, loss=2.3`
    r"^\s*\[\s*(?P<index>\d+)\s*\](?=\s)"
)
_LEAD_PAIR = re.compile(  # PyTorch's CIFAR tutorial (and DeepSpeed's): `[1,  2000] loss: 2.187`,
    # the epoch and the step within it
    r"^\s*\[\s*(?P<epoch>\d+)\s*,\s*(?P<index>\d+)\s*\](?=\s)"
)
_EPOCH_HEADER = re.compile(  # a line of its own: `Epoch 2/10`, `Epoch: 2`, `[Epoch 2]`, the
    # TensorFlow guide's `Start of epoch 2`
    r"^\s*+(?:(?:start(?:ing)?|begin(?:ning)?)\s++(?:of\s++)?)?\[?\s*+epoch\s*+[:=#]?\s*+"
    r"(?P<epoch>\d+)\s*+(?:/\s*+\d+)?\s*+\]?\s*+$",
    re.IGNORECASE,
)
_EPOCH = re.compile(  # `epoch 0`, `Epoch: 1`, `epoch 001:`, mmengine's `Epoch(train) [1]`; a
    # number a label gives just before the step's counter, as timm's `Train: 1 [  50/100 (50%)]`
    r"(?<![\w.])(?:epoch\b|轮次)(?:\(\w+\))?\s*+[:=#]?\s*+\[?\s*+(?P<epoch>\d+)"  # 轮次: Chinese
    r"|^\s*[A-Za-z]+:\s*(?P<labelled>\d+)\s+(?=\[\s*\d+\s*/\s*\d+)",
    re.IGNORECASE,
)
_COUNTERS = (  # `[ 1/20]`, `[0/60000 (0%)]`; else a bare `1/20` or `1 / 20`
    re.compile(r"\[\s*(?P<index>\d+)\s*/\s*(?P<total>\d+)\s*(?:\(\s*[\d.]+\s*%\s*\)\s*)?\]"),
    re.compile(r"(?<![\w./:\[])(?P<index>\d+)\s*/\s*(?P<total>\d+)(?![\w./:%\]])"),
)
_QUALIFIER = re.compile(r"[A-Za-z][\w./-]*")  # a word naming a loss: `lm`, `mtp_1`, `aux/z`
_EPOCH_BEFORE = re.compile(r"epoch\W*$", re.IGNORECASE)  # `Epoch [2/10]` counts epochs
_NOT_TRAINING = re.compile(  # never a training step: glog, warnings, evaluation, progress bars
    # a skipped step is an event (`skipping update`), `skipped iterations: 0` a counter; Keras's
    # bar (`3/20 [===>....] - loss: 2.1`) shows the epoch's running mean, not the step's loss
    rf"^[IWEF]\d{{4}}\s+\d\d:\d\d|warning\b|\bwarn\b|error\b|\boverflow|{BAR}|"
    r"\bskip(?:s|ped|ping)?\b(?!\s*+(?:iterations?|steps?|updates?|batch(?:es)?)?\s*+[:=]?\s*+\d)|"
    r"(?<![\w.])(?:eval\w*|val(?:id\w*)?|test(?:ing)?)(?![\w.])",
    re.IGNORECASE,
)
_NAMED = re.compile(r"^(?P<label>[A-Za-z_][\w.]*)\s*+[:=]?\s*+(?P<rest>\[.*)$")  # `fc1.w [[..`
_TOKEN = re.compile(r"\[|\]|\.\.\.|[^\s,\[\]]+")
_EVAL_BEGINS = re.compile(  # a line of its own: `Eval begin...`, `***** Running Evaluation *****`
    r"^[\W_]*(?:(?:start(?:s|ing)?|begin(?:s|ning)?|run(?:ning)?)\s+(?:the\s+)?)?"
    r"(?:eval(?:uation)?|evaluating|validat(?:ion|ing))"
    r"(?:\s+(?:begins?|start(?:s|ed|ing)?|loop))?[\W_]*$",
    re.IGNORECASE,
)
_EVAL_ENDS = re.compile(  # Paddle's `Eval samples: 320`, `Evaluation done.`
    r"^[\W_]*(?:eval(?:uation)?|validation)\s+(?:samples\b|(?:done|over|end(?:s|ed)?|"
    r"finish(?:ed)?|complete(?:d)?)\b(?![\s:=]*\d))",
    re.IGNORECASE,
)
MAX_DIMS = 2
ArrayLine = tuple[list[str], list["Printed | None"], list[int]]  # tokens, numbers, marks' places
_MARKS = frozenset(("[", "]", "..."))


@dataclass(frozen=True)
class Printed:
    """One printed number: its value, the digits after its (mantissa's) decimal point, its
    decimal exponent (0 in fixed notation), and whether it was in scientific notation."""

    value: float
    digits: int
    exponent: int
    scientific: bool


@functools.lru_cache(maxsize=1 << 16)  # a log prints the same weights over and over
def number(token: str) -> Printed | None:
    """A printed float (`0.25`, `-7.03e-05`, `1.`, `nan`), or None if `token` is none.

    Integers without a point or exponent are not floats: numpy prints every float with one."""
    match = _NUMBER.match(token)
    if match is None or (match["bare"] is not None and match["exp"] is None):
        return None
    if match["special"]:
        return Printed(float(token.rstrip(".")), 0, 0, False)
    frac = match["frac"] if match["frac"] is not None else match["frac2"] or ""
    if match["bare"] is not None:
        frac = ""
    exponent = int(match["exp"][:8]) if match["exp"] is not None else 0  # 1e99999999: inf
    return Printed(float(token), len(frac), exponent, match["exp"] is not None)


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def one_number(text: str) -> Printed | None:
    """A single printed number, bare or in up to two pairs of brackets (`[0.29]`, `[[0.29]]`)."""
    parts = tokens(text)
    opening = 0
    while opening < len(parts) and parts[opening] == "[":
        opening += 1
    closing = len(parts) - opening
    if opening > MAX_DIMS or closing != opening + 1 or parts[opening + 1 :] != ["]"] * opening:
        return None
    return number(parts[opening])


def whole_or_number(text: str) -> Printed | None:
    """`one_number`, or a whole number (`lr=0`, as `%g` prints a learning rate of zero)."""
    whole = re.fullmatch(r"\[?\s*(\d+)\s*\]?", text)
    return Printed(float(whole[1]), 0, 0, False) if whole else one_number(text)


@dataclass(frozen=True)
class StepLine:
    index: int | None  # None: a record without a step field, numbered in order
    loss: Printed | None  # None: a skipped iteration's line, which prints none (`skips`)
    bracketed: bool
    epoch: int | None = None
    lr: Printed | None = None  # the learning rate a keyed step line prints beside its loss
    others: tuple[int, ...] = ()  # the line's other step keys, read where `index` does not count
    counter: bool = False  # `[ 1/20]`: a counter, which may advance by a stride (samples)
    skipped: int | None = None  # iterations the line says its loss scaler skipped (`skips`)
    scale: float | None = None  # the loss scale the line prints
    grad_norm: Printed | None = None  # the gradient's total norm a record prints (`grad_norm`)
    size: int | None = None  # the count its loss is a mean over (`bsz 8`, `num_items`)
    total: int | None = None  # a counter's total (`[ 20/600]`: 600)


def step_line(text: str) -> StepLine | None:
    """`<index> <loss>`, or a line of keyed fields holding a step and a loss: None if the line
    is not one. A step-like line that holds several numbers (`0   [0.5 0.6]`) is an error: it
    is a step line the reader cannot read. Numbers grouped by thousands (`step 1,200`, `loss
    6,831.87`) read whole; a value printed with a decimal comma is an error."""
    text = _GROUPED.sub(lambda m: m[0].replace(",", ""), text) if "," in text else text
    match = _STEP.match(text)
    if match is not None:
        rest = match["loss"]
        loss = one_number(rest)
        if loss is not None:
            return StepLine(whole(match["index"]), loss, rest.startswith("["))
        if _BRACKETED_STEP.match(text):
            raise BadInput(f"expected one loss on a step line, found {rest!r}")
    return _keyed_step_line(text)


def _keyed_step_line(text: str) -> StepLine | None:
    """`epoch 0, step: 3, loss: 2.29, lr: 0.001`: the step keys (a `global` one first) and the
    first training loss, in any order among other fields; where no step key, a counter before
    the loss (`Iter(train) [ 3/20]`, `[0/60000 (0%)]`, `3 / 20`), else a bracketed number that
    starts the line (CLU's `[3] loss=2.3`), is the step. None if the line
    holds no such pair, or is a framework, warning, evaluation or progress-bar line. A loss
    named before its step (`Training loss (for one batch) at step 3: 2.29`), or after a bracketed
    epoch and step (`[1,  2000] loss: 2.187`), is read alike."""
    if _NOT_TRAINING.search(text):
        return None
    at_step = _LOSS_AT_STEP.search(text) if "at" in text else None
    if at_step is not None:  # read as `step 3, training loss: 2.29`
        fields = f"{at_step['key']} {at_step['step']}, {at_step['name']}: "
        text = text[: at_step.start()] + fields + text[at_step.end() :]
    pair = _LEAD_PAIR.match(text)
    if pair is not None:  # read as `epoch 1, step 2000, loss: 2.187`
        text = f"epoch {pair['epoch']}, step {pair['index']}," + text[pair.end() :]
    keyed = sorted(_KEYED_INDEX.finditer(text), key=lambda m: "global" not in m["key"].lower())
    found = [(m, v) for m in _KEYED_LOSS.finditer(text) if (v := whole_or_number(m["loss"]))]
    if not found:  # a loss named by joined words is read where it is the line's only loss
        named = (m for p in (_JOINED_LOSS, _CAMEL_LOSS) for m in p.finditer(text))
        joined = [(m, v) for m in named if (v := whole_or_number(m["loss"]))]
        found = joined if len(joined) == 1 else []
    names = [_loss_name(text, m) for m, _ in found]  # `loss scale: 65536` holds no number: gone
    try:
        at = choose_loss(names)
    except BadInput:
        if keyed or _counter(text) is not None:
            raise
        return None  # not a step line: a summary holding a total and its parts
    if at is None:  # a keyed line that says its iteration was skipped holds no loss (`skips`)
        skipped = keyed and (skipped_count(text) or 0) >= 1
        return _step_line(text, [whole(m["index"]) for m in keyed], False) if skipped else None
    named = found[at]
    lrs = ((m, "lr") for m in _KEYED_LR.finditer(text))
    for field, value in ((named[0], "loss"), *lrs):
        if _DECIMAL_COMMA.match(text, field.end()):
            comma = _PRINTED.search(text, field.start(value))[0]
            what = "learning rate" if value == "lr" else value
            raise BadInput(
                f"a {what} printed with a decimal comma ({comma!r}) cannot be read: print it "
                "with a decimal point (the C locale's numbers)"
            )
    indices = [whole(m["index"]) for m in keyed]
    total = None
    if not indices:
        counter = _counter(text[: named[0].start()])
        lead = _LEAD_INDEX.match(text) if counter is None else None
        if counter is None and lead is None:
            return None
        indices = [counter[0] if lead is None else whole(lead["index"])]
        total = None if counter is None else counter[1]
    return _step_line(text, indices, not keyed, named, total)


def _loss_name(text: str, found: re.Match) -> str:
    """A `loss` field's name, with the word qualifying it: `lm loss`, `mtp_1 loss`, `l2 loss`,
    `aux/loss`, `train_loss`, `avg training loss`; plainly `loss` where a separator, a number or
    another field's value comes before it (`| loss`, `step 3, loss`, `memory: 100  loss`)."""
    name = found[0][: found[0].lower().rindex("loss") + 4]
    before = text[: found.start()]
    parts = before.split()
    if not parts:
        return name
    word = parts[-1] if before[-1].isspace() else parts[-1].rstrip("/-")  # `aux/loss`
    return f"{word} {name}" if _QUALIFIER.fullmatch(word) else name  # `avg training loss`


def step_keys(text: str) -> list[str]:
    """The step keys a line prints with a number (`step`, `iter`, `global_step`), lower case."""
    return [m["key"].lower() for m in _KEYED_INDEX.finditer(text)]


def _counter(text: str) -> tuple[int, int] | None:
    """The first counter within its total (`[ 3/20]` before a bare `3/20`), not an epoch's
    (`Epoch [2/10]`), and that total; None if the line holds none."""
    for pattern in _COUNTERS:
        for match in pattern.finditer(text):
            index, total = whole(match["index"]), whole(match["total"])
            if index <= total and not _EPOCH_BEFORE.search(text[: match.start()]):
                return index, total
    return None


def _step_line(
    text: str, indices: list[int], counter: bool, named: tuple = (None, None), total=None
) -> StepLine:
    found, loss = named  # the loss field and its value; none on a skipped iteration's line
    epoch = _EPOCH.search(text)
    epoch = None if epoch is None else epoch["epoch"] or epoch["labelled"]
    lrs = (whole_or_number(m["lr"]) for m in _KEYED_LR.finditer(text))
    norms = (one_number(m["norm"]) for m in _KEYED_NORM.finditer(text))
    return StepLine(
        indices[0],
        loss,
        found is not None and found["loss"].startswith("["),
        None if epoch is None else whole(epoch),
        next((lr for lr in lrs if lr is not None), None),
        tuple(indices[1:]),
        counter,
        skipped_count(text),
        loss_scale(text),
        next((norm for norm in norms if norm is not None), None),
        batch_size(text),
        total,
    )


@dataclass(frozen=True)
class ArrowLine:
    label: str
    rest: str
    named: bool = False  # `name [[..` without an arrow: an array only if it reads as one

    @property
    def is_mean(self) -> bool:
        return bool(_MEAN_LABEL.match(self.label))

    @property
    def is_other_loss(self) -> bool:
        return "loss" in self.label.lower() and not self.is_mean


def arrow_line(text: str) -> ArrowLine | None:
    """`[label] --->[...]`, a window mean (`avgloss -->0.29`, `avg loss: [0.29]`) or a name
    and an array (`fc1.weight [[...`): None if the line is none of these."""
    mean = _MEAN_LINE.match(text)
    if mean and one_number(mean["rest"]) is not None:
        return ArrowLine(mean["label"], mean["rest"])
    match = _ARROW.match(text)
    if match is None:
        named = _NAMED.match(text)
        return None if named is None else ArrowLine(named["label"], named["rest"], named=True)
    label, rest = match["label"].strip(), match["rest"]
    if rest.startswith("[") or (_MEAN_LABEL.match(label) and one_number(rest) is not None):
        return ArrowLine(label, rest)
    return None


def array_line(text: str) -> ArrayLine | None:
    """A line's tokens, their numbers (None at a bracket or `...`) and where those marks are,
    where it can continue a printed array (brackets, `...` and floats only), else None."""
    parts = tokens(text)
    values = list(map(number, parts))
    marks = [at for at, value in enumerate(values) if value is None]
    if parts and all(parts[at] in _MARKS for at in marks):
        return parts, values, marks
    return None


def is_array_content(text: str) -> bool:
    """Whether a line can continue a printed array: brackets, `...` and floats only."""
    return array_line(text) is not None


def epoch_header(text: str) -> int | None:
    """The epoch a line of its own announces (`Epoch 2/10`, as Paddle's Model.fit prints before
    the epoch's step lines), else None."""
    match = _EPOCH_HEADER.match(text)
    return None if match is None else whole(match["epoch"])


def eval_begins(text: str) -> bool:
    """Whether a line of its own says an evaluation begins (`Eval begin...`, `Evaluating...`,
    `***** Running Evaluation *****`): the step lines after it are the evaluation's."""
    return _EVAL_BEGINS.match(text) is not None


def eval_ends(text: str) -> bool:
    """Whether a line says an evaluation ended (Paddle's `Eval samples: 320`, `Eval done`)."""
    return _EVAL_ENDS.match(text) is not None
