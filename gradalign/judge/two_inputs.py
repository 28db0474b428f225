"""Two inputs' shares in two slabs of fused experts (judge/kink_shape.py `one_input` reads them):
two tokens routed otherwise between the same two experts at one update. Each slab's error is
then Σ over the two tokens of δ_t x_tᵀ, rank two, and both slabs hold the same two tokens: the
same two inputs x_A, x_B on the input side (a first layer's `gate_up_proj`), the same two δ on
the output side (a second layer's `down_proj`, whose inputs are each expert's own activations).
A bug spreads over a micro-batch's many inputs, in every slab its tokens reach.

Model zoo runs 266511 (transformers' Qwen2-MoE at width 2 under float16 autocast, SGD with
momentum, K=8) and 266083 (Mixtral under float16 against a float32 reference, Adadelta, K=4):
layer 0's and layer 1's fused experts held the error in two slabs, each 100% in two outer
products (57% to 81% in the first), the two slabs' input spans of `gate_up_proj` one plane
(principal cosines 1.000 and 1.000) and their output spans of `down_proj` one plane."""

from __future__ import annotations

import math

import numpy as np

SPAN = 2  # the inputs read at once: two tokens
STEPS = 64  # block power iterations at most (a rank-two error converges in a few)
SAME_SPAN = 0.9  # each principal cosine², two spans one plane


def two_inputs(first: np.ndarray, second: np.ndarray, share: float) -> float:
    """The energy two slabs' errors (`first`, `second`: matrices) hold in two outer products
    each, where `share` of each slab's energy lies there and both slabs' spans are one plane on
    either side (each principal cosine² at least SAME_SPAN); 0 otherwise."""
    totals = [float(np.vdot(m, m)) for m in (first, second)]
    if any(not total > 0 for total in totals):
        return 0.0
    found = [_top_two(m) for m in (first, second)]
    if any(energy < share * total for (energy, _, _), total in zip(found, totals, strict=True)):
        return 0.0
    (_, left_a, right_a), (_, left_b, right_b) = found
    if not (_one_plane(left_a, left_b) or _one_plane(right_a, right_b)):
        return 0.0
    return found[0][0] + found[1][0]


def in_span(line: np.ndarray, matrix: np.ndarray, share: float, right_only: bool = False) -> bool:
    """Whether `share` of `line`'s energy lies in the span of `matrix`'s first two singular
    components on either side (`right_only`: its right side, as hashed grids compare), where
    its shape allows: a router's input among two tokens'."""
    total = float(line @ line)
    if not (math.isfinite(total) and total > 0):
        return False
    _, left, right = _top_two(matrix)
    sides = (right,) if right_only else (left, right)
    spans = [basis for basis in sides if basis.shape[0] == line.shape[0]]
    return any(float(np.sum((basis.T @ line) ** 2)) >= share * total for basis in spans)


def _one_plane(first: np.ndarray, second: np.ndarray) -> bool:
    """Whether two orthonormal bases of two vectors span one plane (SAME_SPAN)."""
    if first.shape != second.shape or first.shape[1] < SPAN:
        return False
    cosines = np.linalg.svd(first.T @ second, compute_uv=False)
    return bool(np.all(cosines**2 >= SAME_SPAN))


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
