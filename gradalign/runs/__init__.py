"""The run format: the only contract between the recording wing and the judging wing.

`layout` (names inside a run directory), `tensors` (safetensors files, through the package),
`writer` (staged, atomic run directories), `reader` (manifest and checksums checked, tensors
loaded on demand), `model` (`Run`: the judge's view of one run, whatever wrote it), `logs`
(a training log is another source of a run; several card logs make one run), `sources` (open
whatever the user points at), `portable` (a numpy-only writer for other frameworks), `golden`
(golden files: a run kept as a small JSON file), `summaries` (what a golden keeps of a
tensor: norms and a sketch) and `ranks` (a data-parallel run's ranks and their combination).
docs/FORMAT.md documents the format for writers in other frameworks.

May import: numpy, safetensors, `gradalign.errors`. Never torch.
"""
