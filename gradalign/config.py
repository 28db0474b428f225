"""Typed training configuration: defaults, YAML files and command-line overrides, validated once."""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config_yaml import read_yaml
from .errors import BadInput, shown
from .judge.tolerances import for_dtype

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULERS = ("constant", "linear", "cosine")
DEVICES = ("cpu", "cuda", "auto")
DTYPES = ("float32", "float64")
PRECISIONS = ("fp32", "bf16", "fp16")
# The seed's levels (apex's opt_levels) in PyTorch terms: (autocast precision, parameter dtype).
# O1 and O2 both become autocast to float16 with float32 weights and a GradScaler: PyTorch has no
# fp16-weights-with-fp32-master mode, and recommends autocast where apex used O2. O3 is pure fp16.
AMP_LEVELS = {
    "O0": ("fp32", None),
    "O1": ("fp16", None),
    "O2": ("fp16", None),
    "O3": ("fp32", "float16"),
}
MODELS = ("mlp", "mlp-dropout", "mlp-moe", "cnn-bn", "cnn-gn", "tiny-lm")
LOSS_NORMS = ("items", "mean")
REFERENCES = ("fp64", "none")
RECORD_MODES = ("full", "sketch")
ENTRY_POINT_KEYS = ("model", "data", "loss")  # may name the user's own code as module:attribute
DEFAULT_LR = {"sgd": 0.1, "adam": 1e-3, "adamw": 1e-3}


def _opt(help_text: str, choices: tuple[str, ...] | None = None, **kw: Any) -> Any:
    return field(metadata={"help": help_text, "choices": choices}, **kw)


@dataclass(frozen=True)
class TrainConfig:
    """One training run of the built-in trainer. YAML keys and CLI options share these names."""

    model: str = _opt("built-in model, or your own as module:factory", MODELS, default="mlp")
    batch_size: int = _opt("baseline batch size B (the merged run uses B/K)", default=128)
    updates: int = _opt("optimizer updates N", default=12)
    accum_steps: int = _opt("micro-steps per update K of the merged run", default=4)
    nproc: int = _opt(
        "ranks W of the merged run: data parallel on torch.distributed (gloo on CPU, nccl on "
        "CUDA), each rank B/(W*K) rows per micro-step; the baseline stays one process",
        default=1,
    )
    seed: int = _opt("seed for weights and data", default=0)
    optimizer: str = _opt("optimizer", OPTIMIZERS, default="sgd")
    lr: float | None = _opt(
        "learning rate (default: 0.1 for sgd, 1e-3 for adam/adamw)", default=None
    )
    momentum: float = _opt("SGD momentum", default=0.0)
    nesterov: bool = _opt("SGD Nesterov momentum (needs momentum > 0)", default=False)
    beta1: float = _opt("Adam/AdamW beta1", default=0.9)
    beta2: float = _opt("Adam/AdamW beta2", default=0.999)
    eps: float = _opt("Adam/AdamW epsilon", default=1e-8)
    weight_decay: float = _opt("weight decay", default=0.0)
    l2_penalty: float = _opt(
        "an L2 penalty l2·||w||² added to the loss (its share 1/K in each micro-batch)",
        default=0.0,
    )
    scheduler: str = _opt("lr schedule, stepped once per update", SCHEDULERS, default="constant")
    warmup_updates: int = _opt("linear warmup updates before the schedule", default=0)
    clip_norm: float | None = _opt("clip the merged gradient to this total norm", default=None)
    hidden: int = _opt("MLP hidden width (the CNNs: hidden/16, hidden/8 channels)", default=256)
    dropout: float = _opt("dropout probability of mlp-dropout and tiny-lm", default=0.1)
    data: str | None = _opt(
        "your own data, module:factory(samples, seed) -> (inputs, targets)", default=None
    )
    loss: str | None = _opt(
        "your own loss, module:fn(outputs, targets) -> (summed loss, item count)", default=None
    )
    loss_norm: str | None = _opt(
        "items: window loss sum / window items (default for tiny-lm); mean: each micro-batch's "
        "mean / K (default otherwise; wrong when item counts differ)",
        LOSS_NORMS,
        default=None,
    )
    samples_seed: int | None = _opt("seed of the built-in data (default: seed)", default=None)
    device: str = _opt("cpu, cuda or auto", DEVICES, default="cpu")
    dtype: str = _opt("parameter dtype", DTYPES, default="float32")
    precision: str = _opt(
        "compute precision: fp32, or autocast to bf16 / fp16 (fp16 with a GradScaler)",
        PRECISIONS,
        default="fp32",
    )
    round_to: str | None = _opt(
        "round initial weights and inputs to this dtype first (a float64 reference of an O3 run)",
        ("float16",),
        default=None,
    )
    record: str = _opt(
        "full: weights and gradients saved every update; sketch: per update a fixed-size sketch, "
        "exact norms and fingerprints, full snapshots only at the first (and each until the "
        "optimizer first steps), every --snapshot-every-th and the last update (for models too "
        "big to snapshot)",
        RECORD_MODES,
        default="full",
    )
    snapshot_every: int = _opt(
        "with --record sketch: also keep full snapshots every this many updates (0: first "
        "and last only)",
        default=0,
    )
    amp_level: str | None = _opt(
        "O0 fp32; O1/O2 autocast fp16 + GradScaler; O3 pure fp16 weights",
        tuple(AMP_LEVELS),
        default=None,
    )

    @property
    def micro_batch_size(self) -> int:
        """Rows of one micro-batch on one rank: B/(W*K)."""
        return self.batch_size // (self.accum_steps * self.nproc)

    @property
    def normalization(self) -> str:
        """The loss normalization in effect: loss_norm, else the model's default."""
        if self.loss_norm is not None:
            return self.loss_norm
        return "items" if self.model == "tiny-lm" else "mean"

    @property
    def compute(self) -> str:
        """The compute precision in effect (amp_level, else precision)."""
        return AMP_LEVELS[self.amp_level][0] if self.amp_level else self.precision

    @property
    def param_dtype(self) -> str:
        """The parameter dtype in effect (O3 means float16 weights)."""
        return (AMP_LEVELS[self.amp_level][1] if self.amp_level else None) or self.dtype

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        return build_config({**self.to_dict(), **changes}, "options")


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)


def base_type(name: str) -> type:
    """The scalar type of a config key (int, float or str), without Optional."""
    hint = _HINTS[name]
    if isinstance(hint, types.UnionType):
        return next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint


def _coerce(name: str, value: Any, where: str) -> Any:
    hint, kind = _HINTS[name], base_type(name)
    if value is None:
        if isinstance(hint, types.UnionType):
            return None
        raise BadInput(f"{where}: {name} must be set (got null)")
    ok = (
        (kind is bool and isinstance(value, bool))
        or (kind is int and isinstance(value, int) and not isinstance(value, bool))
        or (kind is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (kind is str and isinstance(value, str))
    )
    if not ok:
        raise BadInput(f"{where}: {name} must be {kind.__name__}, got {shown(value)}")
    if kind is float:
        value = float(value)
        if not math.isfinite(value):
            raise BadInput(f"{where}: {name} must be finite, got {shown(value)}")
    choices = FIELDS[name].metadata["choices"]
    if name in ENTRY_POINT_KEYS and (":" in value or name != "model"):
        if ":" not in value:
            raise BadInput(f"{where}: {name} must be module:attribute, got {shown(value)}")
        return value
    if choices and value not in choices:
        said = f"{where}: {name} must be one of {', '.join(choices)}; got {shown(value)}"
        gpu = re.fullmatch(r"cuda:(\d+)", value) if name == "device" else None
        if gpu:  # one GPU of several: the process sees the one it is given, as cuda
            said += f" (for that GPU alone: CUDA_VISIBLE_DEVICES={gpu[1]} and device cuda)"
        raise BadInput(said)
    return value


def check_keys(values: dict[str, Any], where: str) -> dict[str, Any]:
    """Reject unknown keys and values of the wrong type; return the values coerced."""
    unknown = sorted(set(values) - set(FIELDS), key=str)  # YAML keys need not be strings
    if unknown:
        raise BadInput(
            f"{where}: unknown key {shown(unknown[0])} (known keys: {', '.join(FIELDS)})"
        )
    return {name: _coerce(name, value, where) for name, value in values.items()}


def build_config(
    values: dict[str, Any], where: str = "config", sources: dict[str, str] | None = None
) -> TrainConfig:
    """Validate a flat mapping of config keys into a TrainConfig. An error names where its keys
    came from (`sources`: key -> a file, a run's manifest, "options"), else `where`."""
    sources = sources or {}
    unknown = sorted(set(values) - set(FIELDS), key=str)  # YAML keys need not be strings
    if unknown:
        raise BadInput(
            f"{sources.get(unknown[0], where)}: unknown key {shown(unknown[0])} (known keys: "
            f"{', '.join(FIELDS)})"
        )
    config = TrainConfig(**{k: _coerce(k, v, sources.get(k, where)) for k, v in values.items()})

    def blame(*keys: str) -> str:
        named = dict.fromkeys(sources[k] for k in keys if k in sources)
        return " and ".join(named) or where

    _check_ranges(config, blame)
    return config


def _check_ranges(c: TrainConfig, blame: Callable[..., str]) -> None:
    positive = {"batch_size": c.batch_size, "updates": c.updates, "hidden": c.hidden}
    for name, value in positive.items():
        if value < 1:
            raise BadInput(f"{blame(name)}: {name} must be at least 1, got {value}")
    if c.accum_steps < 1:
        raise BadInput(
            f"{blame('accum_steps')}: accum_steps (K) must be at least 1, got {c.accum_steps}"
        )
    for name in ("seed", "samples_seed"):
        value = getattr(c, name)
        if value is not None and not 0 <= value < 2**32:
            raise BadInput(f"{blame(name)}: {name} must be in [0, 2**32), got {shown(value)}")
    if c.batch_size % c.accum_steps:
        raise BadInput(
            f"{blame('batch_size', 'accum_steps')}: batch_size {c.batch_size} is not divisible "
            f"by accum_steps {c.accum_steps} (K, the merged run's micro-batches an update: a "
            "baseline records the batch it splits; set -k)"
        )
    if c.nproc < 1:
        raise BadInput(f"{blame('nproc')}: nproc (W) must be at least 1, got {c.nproc}")
    if c.batch_size % (c.accum_steps * c.nproc):
        raise BadInput(
            f"{blame('batch_size', 'nproc', 'accum_steps')}: batch_size {c.batch_size} is not "
            f"divisible by nproc x accum_steps ({c.nproc} x {c.accum_steps}): each rank reads "
            "B/(W*K) rows per micro-step"
        )
    if c.lr is not None and c.lr <= 0:
        raise BadInput(f"{blame('lr')}: lr must be positive, got {c.lr}")
    if c.clip_norm is not None and c.clip_norm <= 0:
        raise BadInput(f"{blame('clip_norm')}: clip_norm must be positive, got {c.clip_norm}")
    if not 0 <= c.dropout < 1:
        raise BadInput(f"{blame('dropout')}: dropout must be in [0, 1), got {c.dropout}")
    if c.amp_level is not None and c.precision != "fp32":
        raise BadInput(f"{blame('amp_level', 'precision')}: give amp_level or precision, not both")
    if c.amp_level is not None and AMP_LEVELS[c.amp_level][1] and c.dtype != "float32":
        raise BadInput(  # O3's float16 weights took the place of the dtype without a word
            f"{blame('amp_level', 'dtype')}: amp_level {c.amp_level} sets the weights' dtype "
            f"({AMP_LEVELS[c.amp_level][1]}); leave dtype at float32 or amp_level out"
        )
    if c.compute != "fp32" and c.dtype == "float64":
        raise BadInput(
            f"{blame('precision', 'amp_level', 'dtype')}: precision {c.compute} needs dtype float32"
        )
    if c.nesterov and c.momentum <= 0:
        raise BadInput(f"{blame('nesterov', 'momentum')}: nesterov needs momentum > 0")
    for name in ("beta1", "beta2"):
        if not 0 <= getattr(c, name) < 1:
            raise BadInput(f"{blame(name)}: {name} must be in [0, 1), got {getattr(c, name)}")
    if c.eps <= 0:
        raise BadInput(f"{blame('eps')}: eps must be positive, got {c.eps}")
    for name in ("momentum", "weight_decay", "warmup_updates", "l2_penalty", "snapshot_every"):
        if getattr(c, name) < 0:
            raise BadInput(f"{blame(name)}: {name} must not be negative, got {getattr(c, name)}")
    _check_representable(c, blame)


LARGEST = {"float16": 65504.0, "float32": 3.4028234663852886e38}  # float64: any finite value


def _check_representable(c: TrainConfig, blame: Callable[..., str]) -> None:
    """Every number the optimizer applies to the weights must fit their dtype: torch refuses to
    convert lr 1e39 to float32 (or lr 1e5 to float16) mid-step, which was an internal error."""
    largest = LARGEST.get(c.param_dtype)
    for name in FIELDS:
        value = getattr(c, name)
        if largest and base_type(name) is float and value is not None and abs(value) > largest:
            raise BadInput(
                f"{blame(name, 'dtype')}: {name} {value:g} is beyond the largest {c.param_dtype} "
                f"({largest:g}), "
                "the dtype of the weights it is applied to"
            )


def load_config(
    path: Path | None,
    overrides: dict[str, Any] | None = None,
    recorded: tuple[str, dict[str, Any]] | None = None,
) -> TrainConfig:
    """Defaults, then a recorded config (`recorded`: where it came from, its keys), then the YAML
    file, then command-line overrides (which win). An error names the layer its keys came from."""
    values = read_yaml(path) if path is not None else {}
    values.pop("tolerances", None)  # the judge's section, read by tolerances_from_yaml
    layers = [recorded or ("", {}), (str(path), values)]
    layers = [(where, check_keys(layer, where)) for where, layer in layers]  # even if overridden
    layers.append(("options", overrides or {}))
    sources = {key: where for where, layer in layers for key in layer}
    merged = {key: value for _, layer in layers for key, value in layer.items()}
    return build_config(merged, "options", sources)


def tolerances_from_yaml(path: Path | None) -> dict[str, Any]:
    """The optional `tolerances:` section of a config file."""
    if path is None:
        return {}
    data = read_yaml(path)
    unknown = sorted(set(data) - set(FIELDS) - {"tolerances"}, key=str)
    if unknown:  # a misspelt `tolerance:` judged by the defaults, silently
        raise BadInput(
            f"{path}: unknown key {shown(unknown[0])} (a config holds a tolerances section and "
            "the training keys)"
        )
    section = data.get("tolerances") or {}
    if not isinstance(section, dict):
        raise BadInput(f"{path}: tolerances must be a mapping of names to numbers")
    try:  # the command line's rule (judge/tolerances.py), the error naming this file
        for_dtype("float32", section)
    except BadInput as exc:
        raise BadInput(f"{path}: {exc}") from None
    return section
