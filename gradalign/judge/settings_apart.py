"""Where two runs' optimizers were given other settings, tensor by tensor (the manifest's
`optimizer`: groups listed in another order or split otherwise compare alike). Shared by the
`optimizer-settings` diagnosis (merged against baseline) and the reference's check (a float64
rerun must be the baseline's training). Numpy-free."""

from __future__ import annotations

# (setting, baseline's value, other's value) -> the tensors both optimizers step that differ
Differences = dict[tuple[str, str, str], list[str]]


def per_tensor(settings: dict) -> list[dict | None]:
    """Each tensor's group settings (None: no group of this optimizer steps it)."""
    groups = settings["groups"]
    return [groups[g] if g >= 0 else None for g in settings["tensor_groups"]]


def settings_apart(base: dict, other: dict, names: list[str]) -> Differences:
    """The settings both list that differ for some tensor both optimizers step. A setting one
    group lists and the other does not says nothing (a wrapper such as ZeroRedundancyOptimizer
    lists only what it was given), nor does an entry either run saw change from its first step
    to its second (`counters`: a count, read by `step-count`)."""
    differ: Differences = {}
    counted = set(base.get("counters", [])) | set(other.get("counters", []))  # state: counts
    for name, b, o in zip(names, per_tensor(base), per_tensor(other), strict=True):
        if b is None or o is None:
            continue
        for key in sorted((set(b) & set(o)) - counted):
            if b[key] != o[key]:
                differ.setdefault((key, repr(b[key]), repr(o[key])), []).append(name)
    return differ


def other_kind(base: dict, other: dict) -> bool:
    """Whether the optimizers are of other kinds: other type names, and neither's settings a
    subset of the other's for a tensor both step (SGD's momentum beside AdamW's betas; a
    wrapper names itself, yet lists a subset of what it wraps)."""
    if base.get("type") == other.get("type"):
        return False
    for b, o in zip(per_tensor(base), per_tensor(other), strict=True):
        if b is not None and o is not None:
            return not (set(b) <= set(o) or set(o) <= set(b))
    return False
