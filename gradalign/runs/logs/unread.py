"""Why a file holds no step line the reader knows, in its own words: the loss-like fields and the
step keys its lines print, so a refusal names what it saw (detectron2's `total_loss` beside
`loss_cls`, OpenNMT's `xent`, a loss with no step number) instead of only what it expected.
Numpy-free."""

from __future__ import annotations

import re
from collections import Counter

from .cleaned import readable
from .grammar import step_keys
from .lines import is_progress_bar

SHOWN = 4
BARS = "its progress bars print"  # the clause that says the bars are not read
_LOSS_LIKE = re.compile(  # `total_loss: 2.1`, `loss_cls=1.4`, `xent: 2.12`, `nll 2.3`, and
    # a qualifier after the word before a colon (litgpt's `loss train: 2.3`)
    r"(?<![\w./-])(?P<name>(?:[A-Za-z][\w./-]*?)?(?:loss|xent|nll)[\w./-]*"
    r"(?:\s+[A-Za-z]\w*(?=\s*:))?)\s*+[:=]?\s*+[-+]?\.?\d",
    re.IGNORECASE,
)


_NATIVE_GLOG = re.compile(  # glog's prefix on a line printed from C++ (`solver.cpp:218]`)
    r"^[IWEF]\d{4}\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+\d+\s+[\w./-]+\.(?:cc|cpp|cu|h)\s*:\d+\]"
)


def _named(names: list[str]) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def unread_fields(texts: list[str]) -> str | None:
    """A clause saying which loss-like fields and step keys the lines print (None: none)."""
    losses: Counter[str] = Counter()
    steps: Counter[str] = Counter()
    # lines with a loss; with a step too; printed by C++'s glog; progress bars
    lossy = together = native = bars = 0
    for raw, text in zip(texts, readable(texts), strict=True):
        found = [m["name"] for m in _LOSS_LIKE.finditer(text)]
        keys = step_keys(text)
        losses.update(found)
        steps.update(keys)
        lossy += bool(found)
        together += bool(found and keys)
        native += bool(found) and _NATIVE_GLOG.match(raw) is not None
        bars += bool(found) and is_progress_bar(text)
    if not losses:
        return None
    names = [name for name, _ in losses.most_common()]
    if native == lossy:
        return (
            f"its lines print {_named(names)} only on glog lines from C++ (`I1130 06:00:00.123456 "
            "123 solver.cpp:218] ...`), which the reader leaves as a framework's own messages: "
            "remove the prefix first (sed -E 's/^[IWEF][0-9]{4} [^]]*\\] //' LOG)"
        )
    if bars == lossy and steps:  # tqdm's set_postfix(step=..., loss=...)
        return (
            f"{BARS} {_named(names)} beside `{steps.most_common(1)[0][0]}` in their postfix, "
            "which is not read: a bar is redrawn when its interval has passed (tqdm's "
            "mininterval), not at every step, and its postfix may hold a running mean"
        )
    if not steps:
        return (
            f"its lines print {_named(names)} but no step number the reader knows (`step`, "
            "`iter`, `global_step`, `num_updates`, ...)"
        )
    step = steps.most_common(1)[0][0]
    if not together:
        return (
            f"its lines print {_named(names)} and a step (`{step}`), never on one line (a table "
            "of one field per line is read where its fields are indented under a header line "
            "that holds the step, as Composer's ConsoleLogger prints them (`[batch=3/16]:`, "
            "then `\\t Train loss/train/total: 2.29`) and OLMo's (`[step=3/100,epoch=0]`, then "
            "`    train/CE loss=2.29`))"
        )
    return (
        f"its lines print {_named(names)} beside a step (`{step}`), none of which the reader "
        "takes for the step's training loss: a total beside its parts is not chosen between, "
        "and a loss named for one part or another quantity (`xent`, `ppl`) is not taken for "
        "the loss the optimizer stepped on; nor should a median or a mean over several steps "
        "be (detectron2's `total_loss`, OpenNMT's per-interval `xent`)"
    )
