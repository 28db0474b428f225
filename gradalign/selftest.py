"""`gradalign selftest`: clean setups must pass and every known bug must fail with its own code.

Each case trains a baseline (with its float64 reference) and a merged run on the built-in data,
then judges them exactly as `gradalign compare` would. The judge never sees the fault's name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from . import api
from .config import RECORD_MODES, TrainConfig
from .errors import BadInput
from .judge.results import FAIL, PASS
from .record.faults import FAULTS

SCHEDULE_AND_CLIP = {"scheduler": "cosine", "warmup_updates": 2, "clip_norm": 0.5}
SETUPS: dict[str, dict[str, Any]] = {
    "sgd": {},
    "sgd-momentum": {"momentum": 0.9},
    "adam": {"optimizer": "adam"},
    "adamw": {"optimizer": "adamw", "weight_decay": 0.01},
    "sgd-nesterov-wd": {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
    "adamw-betas": {"optimizer": "adamw", "beta1": 0.8, "beta2": 0.95, "eps": 1e-6},
    **{
        f"{name}+cosine+clip": {**values, **SCHEDULE_AND_CLIP}
        for name, values in {
            "sgd": {},
            "sgd-momentum": {"momentum": 0.9},
            "adam": {"optimizer": "adam"},
            "adamw": {"optimizer": "adamw", "weight_decay": 0.01},
        }.items()
    },
    "bf16": {"precision": "bf16"},
    "bf16-adamw": {"precision": "bf16", "optimizer": "adamw", "weight_decay": 0.01},
    "sgd-l2": {"l2_penalty": 1e-3},
    "tiny-lm-adamw": {"model": "tiny-lm", "optimizer": "adamw", "weight_decay": 0.01},
    "sgd-diverging": {"lr": 1e30},
    "fp16-adamw": {"precision": "fp16", "optimizer": "adamw", "weight_decay": 0.01},
    "O3-sgd": {"amp_level": "O3"},
    "mlp-dropout": {"model": "mlp-dropout"},
    "mlp-moe": {"model": "mlp-moe"},
    "cnn-gn": {"model": "cnn-gn"},
    "cnn-bn": {"model": "cnn-bn"},
    "tiny-lm": {"model": "tiny-lm"},
    "tiny-lm+mean": {"model": "tiny-lm", "loss_norm": "mean"},
}


@dataclass(frozen=True)
class Case:
    setup: str
    fault: str | None = None
    expect_code: str | None = None  # the first cause the judge must name; None: must pass
    also: tuple[str, ...] = ()  # further causes the judge must name too
    nproc: int = 1  # ranks of the merged run (data parallel when > 1)
    accum_steps: int | None = None  # K, if not the setup's
    device: str = "cpu"  # where it trains (selftest --device)
    record: str = "full"  # what its runs keep (selftest --record)

    @property
    def name(self) -> str:
        shape = f" (W={self.nproc}, K={self.config.accum_steps})" if self.nproc > 1 else ""
        return f"{self.setup}{shape} / {self.fault or 'clean'}"

    @property
    def config(self) -> TrainConfig:
        k = {} if self.accum_steps is None else {"accum_steps": self.accum_steps}
        setup = {**SETUPS[self.setup], "nproc": self.nproc, "device": self.device}
        setup["record"] = self.record
        return TrainConfig().replace(**setup, **k)

    @property
    def folder(self) -> str:
        """Where its setup's runs go, below the selftest's folder."""
        return self.setup.replace("+", "_")

    @property
    def merged_run(self) -> str:
        shape = f"w{self.nproc}k{self.config.accum_steps}-" if self.nproc > 1 else ""
        return f"merged-{shape}{self.fault or 'clean'}"


@dataclass(frozen=True)
class LogCase:
    """A pair of simulated Paddle logs (runs/logs/simulate.py), judged as `compare` would."""

    setup: str
    base: str
    merged: tuple[str, ...]
    k: int
    expect_code: str | None = None
    card_loss: str | None = None
    fault: None = None
    also: tuple[str, ...] = ()
    nproc: int = 1  # logs are read, not trained

    folder = "logs"  # all log cases read the logs written there once
    merged_run = None

    @property
    def name(self) -> str:
        return f"{self.setup} / logs"


EXPECTED = {
    "cnn-bn": "batchnorm",
    "mlp-moe": "cross-sample-loss",
    "tiny-lm+mean": "token-normalization",
    "sgd-diverging": "non-finite",
}
CASES: list[Case | LogCase] = [
    *(Case(setup, None, EXPECTED.get(setup)) for setup in SETUPS),
    Case("sgd", "no-loss-scale"),
    Case("adam", "no-loss-scale"),
    Case("sgd", "double-loss-scale"),
    Case("adamw", "loss-plus-scaled"),
    Case("sgd-momentum", "zero-grad-every-micro"),
    Case("adam", "step-every-micro"),
    Case("adamw", "count-every-micro"),
    Case("sgd+cosine+clip", "scheduler-every-micro"),
    Case("sgd+cosine+clip", "clip-every-micro"),
    Case("adamw+cosine+clip", "clip-every-micro"),
    Case("sgd+cosine+clip", "clip-norm-over-k"),
    Case("sgd", "data-order"),
    Case("adam", "bf16-accum"),
    Case("mlp-dropout", "dropout-reseed"),
    Case("sgd", "no-zero-grad"),
    Case("sgd-l2", "penalty-every-micro"),
    Case("fp16-adamw", "scaler-every-micro"),
    Case("sgd", "skip-last-backward"),
    Case("adam", "edit-weights-every-micro"),
    Case("adam", "clamp-hook"),
    Case("sgd", "lr-times-k"),
    Case("sgd", "log-scaled-loss"),
    Case("sgd", "forget-update"),
    Case("tiny-lm+mean", "no-loss-scale", also=("token-normalization",)),
    Case("mlp-moe", "no-loss-scale", also=("cross-sample-loss",)),
    Case("cnn-bn", "no-zero-grad", also=("batchnorm",)),
    LogCase("paddle3", "p3_run.log", ("p3_run_grad.log",), 4),
    LogCase("paddle3-updates", "p3_run.log", ("p3_run_grad_updates.log",), 4),
    LogCase(
        "paddle3-step", "p3_run.log", ("p3_run_grad_step_every_micro.log",), 4, "step-in-window"
    ),
    LogCase("two-cards", "p3_run.log", ("workerlog.0", "workerlog.1"), 2),
    LogCase(
        "two-cards-unsynced",
        "p3_run.log",
        ("workerlog_unsynced.0", "workerlog_unsynced.1"),
        2,
        "replica-divergence",
    ),
    LogCase(
        "two-cards-share", "p3_run.log", ("workerlog_share.0", "workerlog_share.1"), 2, "card-loss"
    ),
    # data parallel: W=2 ranks, recorded in one launch (selftest_ranks.py)
    Case("sgd", nproc=2, accum_steps=2),
    Case("adamw", nproc=2),
    Case("sgd+cosine+clip", nproc=2),
    Case("tiny-lm", nproc=2),
    Case("cnn-bn", nproc=2, accum_steps=1),
    Case("sgd", "dp-loss-sum", nproc=2),
    Case("sgd", "dp-loss-double-mean", nproc=2),
    Case("tiny-lm", "dp-token-normalization", nproc=2),
    Case("sgd", "dp-sync-after-forward", nproc=2),
    Case("sgd", "dp-unsynced-params", nproc=2),
    Case("adam", "dp-rank-init", nproc=2),
    Case("sgd+cosine+clip", "scheduler-per-rank", nproc=2),
    Case("sgd", "dp-sampler", nproc=2),
    Case("cnn-bn", "dp-batchnorm", nproc=2, accum_steps=1),
    Case("sgd", "no-loss-scale", nproc=2),
    Case("adam", "step-every-micro", nproc=2),
]


ERROR = "error"


@dataclass
class Outcome:
    """One case's result; verdict ERROR: the case could not be judged (message says why)."""

    case: Case
    verdict: str
    codes: list[str]  # the causes named, first one first
    worst_over_allowed: float = 0.0  # max err/allowed over weights and gradients
    worst_over_noise: float = 0.0  # max ||merged - ref|| / ||baseline - ref||
    message: str = ""  # the first diagnosis, in words
    skipped: str | None = None  # why the case could not run here (said, never silent)

    @property
    def expected_verdict(self) -> str:
        return PASS if self.expected_code is None else FAIL

    @property
    def expected_code(self) -> str | None:
        if self.case.fault is not None:
            return FAULTS[self.case.fault].code
        return self.case.expect_code

    @property
    def ok(self) -> bool:
        if self.skipped is not None:
            return True
        if self.expected_code is None:
            return self.verdict == PASS and not self.codes
        named = self.codes[:1] == [self.expected_code] and set(self.case.also) <= set(self.codes)
        return self.verdict == FAIL and named


def run_selftest(
    out: Path,
    log: Console,
    cases: list[Case] | None = None,
    reports: list[Path] | None = None,
    device: str = "cpu",
    record: str = "full",
    keep_runs: bool = False,
) -> list[Outcome]:
    """Train and judge every case; baselines and references are shared between cases.
    `reports`: files the caller writes afterwards, checked before any training; `device`: where
    every case trains (cpu, cuda or auto); `record`: "sketch" records every run with sketches
    (the verdicts and codes must not change); `keep_runs`: keep the runs of the cases that went
    as expected too (by default they are removed as each is judged: ~2 GB in all)."""
    from .report.files import check_replaceable
    from .runs.outputs import check_outputs
    from .runs.writer import ensure_parent_writable, missing_dirs
    from .selftest_ranks import run_ranked
    from .selftest_runs import RunsKept

    api.require_torch()
    from .record.device import resolve_device

    resolve_device(TrainConfig().replace(device=device).device)  # refused before any training
    check_outputs([out], [], reports or [])
    check_replaceable(reports or [])  # an earlier selftest's JSON, or nothing of the user's
    ensure_parent_writable(out / "case", str(out))  # every case writes below it
    if record not in RECORD_MODES:
        raise BadInput(f"--record must be one of {', '.join(RECORD_MODES)}, got {record!r}")
    cases = cases or CASES
    made = missing_dirs(out)
    outcomes, recorded, logs = [], set(), None
    cases = [replace(c, device=device, record=record) if isinstance(c, Case) else c for c in cases]
    tidy = RunsKept(out, keep_runs, cases)
    for case in (c for c in cases if c.nproc == 1):
        try:
            if isinstance(case, LogCase):
                logs = logs or tidy.logs_written(_write_logs(out / LogCase.folder))
                comparison = api.compare(
                    logs / case.base,
                    [logs / name for name in case.merged],
                    accum_steps=case.k,
                    card_loss=case.card_loss,
                )
            else:
                comparison = _run_case(case, out, recorded)
        except BadInput as exc:  # a case the gate could not judge is wrong; the others still run
            outcomes.append(tidy.judged(Outcome(case, ERROR, [], message=str(exc))))
            log.print(f"selftest: {case.name}: error: {exc}", markup=False)
            continue
        outcomes.append(tidy.judged(judge_case(case, comparison, log)))
    ranked = [c for c in cases if isinstance(c, Case) and c.nproc > 1]
    outcomes += run_ranked(ranked, out, log, recorded, tidy) if ranked else []
    tidy.finish(made, log)
    return outcomes


def baseline_of(case: Case, out: Path, recorded: set[str]) -> Path:
    """The case's baseline (with its float64 reference), recorded once per setup."""
    base = out / case.folder / "baseline"
    if case.setup not in recorded:
        recorded.add(case.setup)
        api.record_baseline(case.config, base, checked=True)
    return base


def judge_case(case: Case | LogCase, comparison: Any, log: Console) -> Outcome:
    """The outcome of one case, from its comparison (made exactly as `gradalign compare`)."""
    codes = [d.code for d in comparison.diagnosis if d.severity == "error"]
    diffs = [d for r in comparison.results for d in (*r.weights, *r.grads)]
    outcome = Outcome(
        case,
        comparison.verdict,
        codes,
        max((d.ratio for d in diffs), default=0.0),
        max((d.error / d.noise for d in diffs if d.noise), default=0.0),
        comparison.diagnosis[0].message if comparison.diagnosis else "",
    )
    log.print(f"selftest: {case.name}: {outcome.verdict} {', '.join(codes)}", markup=False)
    return outcome


def _run_case(case: Case, out: Path, recorded: set[str]):
    base = baseline_of(case, out, recorded)
    merged = base.parent / case.merged_run
    api.record_merged(case.config, merged, fault=case.fault, checked=True)
    return api.compare(base, merged)


def _write_logs(folder: Path) -> list[Path]:
    from .runs.logs.simulate import write_all

    return write_all(folder)


def render_selftest(outcomes: list[Outcome], console: Console) -> None:
    table = Table(title="gradalign selftest", title_justify="left")
    for column in ("setup", "fault", "expected", "got", "x noise", "ok"):
        table.add_column(column, justify="right" if column == "x noise" else "left")
    for o in outcomes:
        expected = o.expected_verdict + (f" ({o.expected_code})" if o.expected_code else "")
        got = o.verdict + (f" ({', '.join(o.codes)})" if o.codes else "")
        mark = "[green]ok[/]" if o.ok else "[bold red]WRONG[/]"
        if o.skipped is not None:
            got, mark = f"skipped: {o.skipped}", "[yellow]skipped[/]"
        setup = o.case.name.rsplit(" / ", 1)[0]
        table.add_row(setup, o.case.fault or "-", expected, got, f"{o.worst_over_noise:.3g}", mark)
    console.print(table)
    wrong = sum(not o.ok for o in outcomes)
    skipped = sum(o.skipped is not None for o in outcomes)
    verdict = "[green]all cases as expected[/]" if not wrong else f"[bold red]{wrong} wrong[/]"
    if skipped:
        verdict += f", [yellow]{skipped} skipped[/]"
    console.print(
        f"selftest: {len(outcomes)} cases, {verdict} (x noise: the worst ||merged - ref|| / "
        "||baseline - ref|| over all weights and gradients)"
    )


def write_selftest_json(outcomes: list[Outcome], path: Path | None) -> None:
    """The outcomes as JSON at `path` (None: none asked for)."""
    from .report.output import write_text_atomic

    if path is None:
        return

    cases = [
        {
            "setup": o.case.setup,
            "fault": o.case.fault,
            "nproc": o.case.nproc,
            "accum_steps": o.case.k if isinstance(o.case, LogCase) else o.case.config.accum_steps,
            "skipped": o.skipped,
            "expected_verdict": o.expected_verdict,
            "expected_code": o.expected_code,
            "verdict": o.verdict,
            "codes": o.codes,
            "ok": o.ok,
            "worst_over_allowed": o.worst_over_allowed,
            "worst_over_noise": o.worst_over_noise,
            "message": o.message,
        }
        for o in outcomes
    ]
    body = {"ok": all(o.ok for o in outcomes), "cases": cases}
    write_text_atomic(path, json.dumps(body, indent=2, sort_keys=True) + "\n")
