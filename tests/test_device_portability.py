"""What keeps runs comparable across devices and dtypes: the built-in dropout's masks and the
hint given when a CUDA model's dropout makes a float64 reference impossible."""

from types import SimpleNamespace

import pytest
import torch

from gradalign.judge.compatible import _rerun_hint
from gradalign.record.models import HostDrawnDropout


def _drop(module: torch.nn.Module, x: torch.Tensor, seed: int = 3) -> torch.Tensor:
    torch.manual_seed(seed)
    return module.train()(x)


def test_host_drawn_dropout_is_nn_dropout_on_the_cpu():
    x = torch.randn(64, 32)
    assert torch.equal(_drop(HostDrawnDropout(0.3), x), _drop(torch.nn.Dropout(0.3), x))


def test_host_drawn_dropout_masks_do_not_depend_on_dtype_or_batch_split():
    x = torch.randn(64, 32) + 5.0  # no zeros but the dropped ones
    whole = _drop(HostDrawnDropout(0.3), x)
    wide = _drop(HostDrawnDropout(0.3), x.double())
    assert torch.equal(whole == 0, wide == 0)
    torch.manual_seed(3)
    parts = torch.cat([HostDrawnDropout(0.3).train()(chunk) for chunk in x.chunk(4)])
    assert torch.equal(whole, parts)
    reseeded = _drop(HostDrawnDropout(0.3), x, seed=4)
    assert not torch.equal(whole == 0, reseeded == 0)


def test_host_drawn_dropout_is_identity_in_eval():
    x = torch.randn(8, 4)
    assert torch.equal(HostDrawnDropout(0.5).eval()(x), x)


@pytest.mark.parametrize(
    ("dropout", "device", "hinted"),
    [(["2"], "cuda:0", True), (["2"], "cpu", False), ([], "cuda:0", False)],
)
def test_reference_refusal_names_cuda_dropout(dropout, device, hinted):
    run = SimpleNamespace(
        model_facts={"dropout": dropout}, environment={"device": device}, optimizer_settings=None
    )
    hint = _rerun_hint(run)
    assert ("dropout (2)" in hint) == hinted and "--reference none" in hint
    assert ("torch.randn_like" in hint) != hinted  # otherwise: draws in the model's dtype
