"""Framework integrations: each module drives the public `Recorder` from one framework's hooks, so
that recording a framework's run is a two-line change for its user.

`transformers` (`attach(trainer, out_dir)`: a `transformers.Trainer`), `lightning`
(`GradalignCallback`: a Lightning `Trainer`, automatic or manual optimization), `accelerate`
(`record(accelerator, model, optimizer, out_dir)`: an `accelerator.accumulate(model)` loop), and
`batches` (what they all take from a batch: a padding-free sample digest and an item count).
Importing this package imports no framework; each module imports its own framework.

May import: torch, the framework a module is named after, `gradalign.record`, `gradalign.errors`.
"""
