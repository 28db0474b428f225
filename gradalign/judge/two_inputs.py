"""Two inputs' shares in fused experts' slabs (judge/kink_shape.py `one_input` reads them):
two tokens routed otherwise at one update. Each slab's error is then the sum, over the tokens
that left or joined it, of δ_t x_tᵀ, and every slab holds the same two tokens: the same two
inputs x_A, x_B on the input side (a first layer's `gate_up_proj`), the same two δ on the
output side (a second layer's `down_proj`, whose inputs are each expert's own activations).
Stacked one after another on that side, the slabs hold their error in two outer products,
however many slabs the tokens reached. A bug spreads over a micro-batch's many inputs, in every
slab its tokens reach. Experts held as separate modules are stacked alike (`member_in_stack`,
judge/siblings.py names them), and beside them a router's error lies in the two inputs
(`within_inputs`) and a bias's in its weight's two δ (`delta_share`).

Model zoo runs 266511 (transformers' Qwen2-MoE at width 2 under float16 autocast, SGD with
momentum, K=8) and 266083 (Mixtral under float16 against a float32 reference, Adadelta, K=4):
two tokens moved between the same two experts, each of the two slabs 100% in two outer
products (57% to 81% in the first), the same two inputs in both. Run 266508 (Qwen2-MoE, SGD
with momentum, K=4): one token from expert 0 to 3 and one from 1 to 3, slabs 0 and 1 rank one
and slab 3 rank two, 99.8% of the stacked error in two outer products. Run 266102 (gpt-oss under
float16 against a float32 reference, ASGD, K=8): a token routed from expert 1 to 3, slab 3's
error 85% in its first outer product and 12% in a second, 93% of the stacked error in two."""

from __future__ import annotations

import math

import numpy as np

SPAN = 2  # the inputs read at once: two tokens
STEPS = 64  # block power iterations at most (a rank-two error converges in a few)


def stacked_inputs(slabs: np.ndarray) -> float:
    """The energy fused experts' slabs (`slabs`: experts x rows x columns) hold in SPAN outer
    products of the slabs stacked on either side: their rows one after another (every slab
    read on the same columns, a first layer's inputs) or their columns side by side (the same
    rows, a second layer's δ)."""
    experts, rows, columns = slabs.shape
    stacked = (
        slabs.reshape(experts * rows, columns),
        slabs.transpose(1, 0, 2).reshape(rows, experts * columns),
    )
    return max(_top_two(m)[0] for m in stacked)


def in_span(line: np.ndarray, matrix: np.ndarray, share: float, right_only: bool = False) -> bool:
    """Whether `share` of `line`'s energy lies in the span of `matrix`'s first two singular
    components on either side (`right_only`: its right side, as hashed grids compare), where
    its shape allows: a router's input among two tokens'."""
    shares = span_shares(line, matrix)
    return shares[1] >= share or (not right_only and shares[0] >= share)


def _top_two(matrix: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """The energy of a matrix's first two singular components, with orthonormal bases of their
    left and right spans, by block power iteration from its largest row and the row furthest
    off its line (deterministic; a bound from below where it stops early)."""
    m = np.asarray(matrix, dtype=np.float64)
    if min(m.shape) < SPAN:
        return 0.0, np.zeros((m.shape[0], 0)), np.zeros((m.shape[1], 0))
    energies = np.einsum("ij,ij->i", m, m)
    first = m[int(np.argmax(energies))]
    unit = first / math.sqrt(float(first @ first)) if float(first @ first) > 0 else first
    off = m - np.outer(m @ unit, unit)
    second = off[int(np.argmax(np.einsum("ij,ij->i", off, off)))]
    right, _ = np.linalg.qr(np.stack([first, second], axis=1))
    top, found = 0.0, (0.0, np.zeros((m.shape[0], SPAN)), right)
    for _ in range(STEPS):
        image = m @ right
        energy = float(np.vdot(image, image))
        if energy <= top * (1 + 1e-9):
            break
        left, _ = np.linalg.qr(image)
        top, found = energy, (energy, left, right)
        right, _ = np.linalg.qr(m.T @ left)
    return found


def member_in_stack(errors: list[np.ndarray], index: int) -> tuple[float, float, float]:
    """Same-role tensors' errors (`errors`: each rows x columns, one shape) stacked as fused
    experts' slabs are (`stacked_inputs`): the energy their best stacking holds in SPAN outer
    products, the stack's whole energy, and the energy of member `index`'s error in that
    stacking's span (its inputs on the right where stacked row on row, its δ on the left where
    side by side)."""
    slabs = np.stack([np.asarray(e, dtype=np.float64) for e in errors])
    experts, rows, columns = slabs.shape
    by_rows = _top_two(slabs.reshape(experts * rows, columns))
    by_columns = _top_two(slabs.transpose(1, 0, 2).reshape(rows, experts * columns))
    member = slabs[index]
    if by_rows[0] >= by_columns[0]:
        energy, inside = by_rows[0], member @ by_rows[2]
    else:
        energy, inside = by_columns[0], by_columns[1].T @ member
    return energy, float(np.vdot(slabs, slabs)), float(np.vdot(inside, inside))


def span_shares(line: np.ndarray, matrix: np.ndarray) -> tuple[float, float]:
    """The shares of `line`'s energy in the spans of `matrix`'s first SPAN singular components,
    on its left side (a bias's error in its weight's δ) and on its right (an input); 0 on a side
    of another length, or where `line` holds no finite energy."""
    total = float(line @ line)
    if not (math.isfinite(total) and total > 0):
        return 0.0, 0.0
    _, left, right = _top_two(matrix)
    return tuple(  # type: ignore[return-value]
        float(np.sum((basis.T @ line) ** 2)) / total if basis.shape[0] == line.shape[0] else 0.0
        for basis in (left, right)
    )


def two_components(matrix: np.ndarray) -> float:
    """The energy of a matrix's first SPAN singular components (a bound from below)."""
    return _top_two(matrix)[0]


def delta_share(line: np.ndarray, matrix: np.ndarray, share: float) -> float | None:
    """Where `share` of `matrix`'s energy lies in its first SPAN singular components (two
    inputs' shares of a weight's error), the share of `line` (its bias's error) in their left
    span, their two δ; None where they hold less."""
    energy, left, _ = _top_two(matrix)
    if energy < share * float(np.vdot(matrix, matrix)):
        return None
    total = float(line @ line)
    if not (math.isfinite(total) and total > 0) or left.shape[0] != line.shape[0]:
        return 0.0
    return float(np.sum((left.T @ line) ** 2)) / total


def within_inputs(first: np.ndarray, second: np.ndarray, share: float) -> bool:
    """Whether `share` of matrix `first`'s error energy lies in the inputs of `second`'s, where
    `second`'s error is two inputs' shares, not one (`share` of it in SPAN outer products, less
    in one): the span of its first SPAN right singular vectors. A router's gradient is Σ
    (∂ℓ/∂logits_t) x_tᵀ: two tokens routed otherwise move it in their two inputs, rank one or
    two, where they move the experts' first layers (model zoo run 285856: 0.997 of the router's
    error in an expert's two inputs)."""
    a, b = (np.asarray(m, dtype=np.float64) for m in (first, second))
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        return False
    whole, mine = float(np.vdot(b, b)), float(np.vdot(a, a))
    if not (math.isfinite(whole) and whole > 0 and math.isfinite(mine) and mine > 0):
        return False
    energy, _, right = _top_two(b)
    # the first component's energy, read in the two's span: σ₁ of b's image there
    first = float(np.linalg.svd(b @ right, compute_uv=False)[0] ** 2) if right.shape[1] else 0.0
    if energy < share * whole or first >= share * whole:
        return False
    inside = a @ right
    return float(np.vdot(inside, inside)) >= share * mine
