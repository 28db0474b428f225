"""Tensors of one role held as separate modules: experts kept in a list (`experts.0.w1`,
`experts.3.w1`), as a mixture of experts that fuses none holds them. Their names differ in one
index alone and their shapes are the same, so stacked they read as fused experts' slabs do
(judge/two_inputs.py): a token routed from one expert to another leaves one and joins the
other, and two tokens moved at once hold the experts' errors in two outer products stacked.

Model zoo run 285856 (the zoo's tiny mixture of experts, experts as separate modules, bfloat16
autocast, Adam with eps 1e-6, K=4): two tokens moved between experts 0 and 3 at update 7; each
expert's weight errors 55% to 72% in one outer product and 99.8% in two, their first layers
stacked row on row 99.8% in two, the same two inputs, the router's input in their span at
0.999."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def sibling_groups(
    name: str, names: Iterable[str], shape: Callable[[str], tuple[int, ...]]
) -> list[list[str]]:
    """The groups `name` stands in: for each index in its dotted name (a part of digits), the
    tensors named as it is but for that index, of its shape, by index; groups of two or more.
    A layer's index makes a group too (`layers.0.mlp.w1`, `layers.1.mlp.w1`): each layer reads
    its own inputs, so their stacked errors hold no two inputs' shares, and the group says
    nothing."""
    parts = name.split(".")
    split = [other.split(".") for other in names]
    groups = []
    for at, part in enumerate(parts):
        if not part.isdigit():
            continue
        members = sorted(
            (int(other[at]), ".".join(other))
            for other in split
            if len(other) == len(parts)
            and other[at].isdigit()
            and other[:at] == parts[:at]
            and other[at + 1 :] == parts[at + 1 :]
        )
        found = [member for _, member in members if shape(member) == shape(name)]
        if len(found) >= 2:
            groups.append(found)
    return groups
