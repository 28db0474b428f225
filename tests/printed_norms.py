"""Six updates' losses and gradient norms before clipping, as the tests of logs that print a
norm beside the loss write them (tests/test_log_records.py: a transformers Trainer's dicts;
tests/test_log_keyed_lines.py: Megatron's, fairseq's, torchtitan's and MMEngine's lines)."""

from __future__ import annotations

TRAINER_LOSSES = [2.31 - 0.05 * i for i in range(6)]
TRAINER_NORMS = [1.52 - 0.03 * i for i in range(6)]
