"""The recording wing: everything that trains or records, and the only part that imports torch.

`recorder` (the public `Recorder`, writing a run through `gradalign.runs`), `trainer` and `loop`
(the one built-in training loop: the baseline is K=1), `models`, `tinylm` (the built-in zoo and
its generated data), `faults` (named deviations inside that loop), `entrypoints` (the user's own
`module:factory`), `facts` (digests, fingerprints, model structure, environment), `preflight`
(warnings before training), `integrations/` (transformers, Lightning, accelerate: each imports its
framework itself), and data parallel: `distributed` (the Recorder on W ranks), `parallel` (DDP
inside the one loop), `launch` (W ranks of it), `dp_faults`, `syncbn`.

May import: torch, numpy, `gradalign.runs` (to write), `gradalign.config`, `gradalign.errors`;
in `integrations/`, the framework a module is named after.
Never `gradalign.judge` or `gradalign.report`: a run is judged from its files alone.
"""
