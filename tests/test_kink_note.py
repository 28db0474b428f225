"""Where a run keeps no full tensors at the failing update (a golden's summaries, a sketched
update), a gradient failure with the loss within noise is noted as perhaps a kink; a gradient
scaled or turned as a whole is not one (judge/kinks.py)."""

from __future__ import annotations

from gradalign.judge.kink_divergence import follow_kink_divergence
from gradalign.judge.metrics import TensorDiff
from gradalign.judge.results import UpdateResult

from .conftest import FIXTURES

KINK = "as when an activation crosses its kink"


class _Summaries:
    """A run that keeps no full tensor at any update."""

    def grads(self, u):
        return None

    weights = grads

    def init_weights(self):
        return None


def _failing(ratio: float, cosine: float) -> list[UpdateResult]:
    grad = TensorDiff("w", float("nan"), float("nan"), float("nan"), float("nan"), 5.0, 1.0, None)
    r = UpdateResult(0, 1.0, 1.0, 0.0, 0.0, 1.0, grads=[grad], grad_ratio=ratio, grad_cosine=cosine)
    return [r]


def test_a_gradient_scaled_as_a_whole_is_not_noted_as_a_kink():
    for ratio, cosine in ((4.0, 1.0), (0.3, 0.9), (1.0, 0.99)):
        assert (
            follow_kink_divergence(_failing(ratio, cosine), _Summaries(), _Summaries(), 4.0) == []
        )
    noted = follow_kink_divergence(_failing(1.0, 0.99999), _Summaries(), _Summaries(), 4.0)
    assert len(noted) == 1 and KINK in noted[0]


def test_a_golden_check_of_a_missing_loss_scale_names_it_without_a_kink_note(cli, tmp_path):
    result = cli(
        "merged", "--against", FIXTURES / "golden", "--fault", "no-loss-scale", "-o", tmp_path / "m"
    )
    assert result.code == 1
    assert "loss-scale" in result.out and KINK not in result.out
