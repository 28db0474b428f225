"""Reports of a comparison: `table` (rich, for people), `json_report` (for machines), `output`
(files written whole or not at all). Later formats (JUnit, Markdown, plots, HTML) go here, each
its own module reading a `judge.results.Comparison`.

May import: numpy, rich, `gradalign.judge` and `gradalign.runs`; never torch.
"""
