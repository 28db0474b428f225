"""Reports of a comparison: `summary` (what every report says first: headline, failures,
causes, rows), `table` (rich, for people), `json_report` (for machines), `junit` (CI test
reports), `markdown` and `github` (job summaries, `::error` lines), `plots` (PNG, the `plot`
extra), `html` (one self-contained page), `assertion` (`assert_aligned`'s message), `files` (the
files one command writes) and `output` (files written whole or not at all). Each reads a
`judge.results.Comparison`.

May import: numpy, rich, `gradalign.judge` and `gradalign.runs`; matplotlib only inside `plots`;
never torch.
"""
