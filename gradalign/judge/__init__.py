"""The judging wing: is the merged run the same training as its baseline, and if not, why?

`compare` (update by update, calibrated by the noise floor of a float64 reference), `metrics`
(errors between tensors), `tolerances`, `windows` (no weight change inside a window),
`compatible` (what can be compared at all), `checks` (named pass/fail/not-checked summaries),
`signatures` (the bug signatures, read from the records) and `diagnose` (which of them name the
cause), `results` (what the judge found), `golden` (make a golden file, judge against one),
`distributed` (a data-parallel run's ranks must be replicas, bit for bit). A
new diagnosis is one signature function in `signatures` and one line in `diagnose`.

May import: numpy, `gradalign.runs`, `gradalign.errors`. Never torch (a test proves it).
"""
