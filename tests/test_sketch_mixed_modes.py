"""A sketched run judged beside a full one, and a sketched run's full files read where it kept
them: the diagnoses that need element values read them wherever a run kept its full files (a
sketch-mode run at its snapshot updates), and tensors kept whole in a sketch are shaped as the
full run's. A sketched baseline against a full merged run crashed (exit 3: shapes (3, 64) and
(192,), or a KeyError); gradients accumulated in bfloat16 and clipped after were
`cross-sample-loss` sketched and `grad-accum-dtype` in full (helper hunt D and A)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import gradalign  # noqa: E402
from gradalign.api import compare  # noqa: E402

B, UPDATES, K, CLIP = 16, 4, 4, 0.05


def _record(out, k: int, mode: str, bf16_sum: bool = False) -> None:
    """An MLP (weights of 1024 and 192 elements: the first sketched, the second kept whole)
    under Adam, clipped at CLIP (it engages); `bf16_sum`: each micro-step's gradient sum
    rounded to bfloat16."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(B, 16, generator=g), torch.randint(0, 3, (B,), generator=g))] * UPDATES
    kwargs = {"record": "sketch", "updates": UPDATES} if mode == "sketch" else {}
    with gradalign.Recorder(out, model, opt, accum_steps=k, **kwargs) as rec:
        for x, y in data:
            n = B // k
            for j in range(k):
                xb, yb = x[j * n : (j + 1) * n], y[j * n : (j + 1) * n]
                loss = nn.functional.cross_entropy(model(xb), yb)
                (loss / k).backward()
                if bf16_sum:
                    for p in model.parameters():
                        p.grad = p.grad.bfloat16().float()
                rec.micro(loss.detach(), batch=(xb, yb))
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            rec.update()
            opt.zero_grad()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    for mode in ("full", "sketch"):
        _record(root / f"{mode}-base", 1, mode)
        _record(root / f"{mode}-bf16", K, mode, bf16_sum=True)
        _record(root / f"{mode}-ok", K, mode)
    return root


@pytest.mark.parametrize("base", ["full", "sketch"])
@pytest.mark.parametrize("merged", ["full", "sketch"])
def test_a_16_bit_sum_clipped_after_is_named_in_every_pairing_of_modes(runs, base, merged):
    c = compare(runs / f"{base}-base", runs / f"{merged}-bf16", reference="none")
    assert c.verdict == "fail" and c.diagnosis[0].code == "grad-accum-dtype", [
        (d.code, d.message[:200]) for d in c.diagnosis
    ]
    assert compare(runs / f"{base}-base", runs / f"{merged}-ok", reference="none").verdict == "pass"
