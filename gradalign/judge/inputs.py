"""What every judge of weights and gradients starts from: the three runs, the tolerances, the
noise floor and the reference's bound (judge/stream.py, judge/sketched.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..runs.model import Run
from .compatible import ReferenceBound
from .tolerances import Tolerances


@dataclass(frozen=True)
class Inputs:
    """The runs and limits a tensor judge works with."""

    base: Run
    merged: Run
    ref: Run | None
    tol: Tolerances
    floor: float  # the noise floor, in units of ||ref||
    bound: ReferenceBound | None  # how far the baseline may stray from the reference
    dtype: str = "float32"  # the compute dtype (the least precise of the runs')

    def unpack(self) -> tuple:
        return self.base, self.merged, self.ref, self.tol, self.floor, self.bound
