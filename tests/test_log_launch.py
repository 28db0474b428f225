"""What a framework or launcher prints around the step lines: DeepSpeed's PipelineEngine's
`steps: 12 loss: ...`, Paddle's evaluation blocks inside `Model.fit`, every line printed twice by
two logging handlers, and a launcher's device count where fewer card logs were given."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradalign.errors import BadInput
from gradalign.runs.logs import read_log

from .conftest import one_line_error

LOSSES = [0.5, 0.25, 0.125, 0.375]


def write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_deepspeed_pipeline_steps_key(tmp_path):
    """DeepSpeed's PipelineEngine prints `steps: N loss: ...`; its engine's `step=N, skipped=0,
    lr=[..]` lines beside them hold no loss."""
    text = "".join(
        f"[2024-05-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step={i + 1}, "
        f"skipped=0, lr=[0.5], mom=[(0.9, 0.999)]\n"
        f"steps: {i + 1} loss: {v:.4f} iter time (s): 0.120 samples/sec: 1066.7\n"
        for i, v in enumerate(LOSSES)
    )
    assert read_log(write(tmp_path, text)).micro_loss.tolist() == LOSSES


def _fit(eval_block: str) -> str:
    """Paddle's `Model.fit(verbose=2, eval_data=...)`: an epoch's steps, then its evaluation."""
    return "".join(
        f"Epoch {e + 1}/2\n"
        + "".join(
            f"step {b + 1}/2 - loss: {LOSSES[2 * e + b]:.4f} - acc: 0.4375 - 20ms/step\n"
            for b in range(2)
        )
        + eval_block
        for e in range(2)
    )


@pytest.mark.parametrize(
    "begin", ["Eval begin...", "Evaluating...", "***** Running Evaluation *****"]
)
def test_an_evaluation_block_is_noise(tmp_path, begin):
    """A line announcing an evaluation starts a block whose step lines (in the training's own
    form, counting from 1) are noise, up to an end line or the next epoch's header."""
    steps = "".join(f"step {i}/3 - loss: 9.{i} - acc: 0.7 - 10ms/step\n" for i in (1, 2, 3))
    for end in ("Eval samples: 96\n", ""):
        run = read_log(write(tmp_path, _fit(f"{begin}\n{steps}{end}")), accum_steps=2)
        assert run.micro_loss.tolist() == LOSSES
    with pytest.raises(BadInput, match="found step 1 again: the steps restart"):
        read_log(write(tmp_path, _fit(steps)), accum_steps=2)


def test_an_announced_evaluation_printed_elsewhere_ends_at_the_next_training_step(tmp_path):
    """An evaluation announced but printing no step lines: the training's next step (or the
    next epoch's first) ends the block."""
    lines = [f"epoch {i // 2}, step {i % 2}, loss: {v}" for i, v in enumerate(LOSSES)]
    lines.insert(3, "Evaluating...")  # before epoch 1's second step
    lines.insert(2, "Starting evaluation")  # before epoch 1's first step
    run = read_log(write(tmp_path, "\n".join(lines) + "\n"), accum_steps=2)
    assert run.micro_loss.tolist() == LOSSES


def test_every_line_printed_twice_is_named(cli, tmp_path):
    """Two logging handlers print every line twice, byte for byte: the message says so and how
    to fix it, not to read each copy as a micro-step."""
    once = "".join(f"INFO:tensorflow:global step {i}: loss = {v}\n" for i, v in enumerate(LOSSES))
    twice = "".join(line * 2 for line in once.splitlines(keepends=True))
    result = cli("compare", write(tmp_path, once, "b.log"), write(tmp_path, twice, "m.log"))
    one_line_error(result, "m.log: every step line is printed twice", "two logging handlers")
    assert "-k 2" not in result.err


def _card(losses: list[float], devices: str) -> str:
    head = (
        "LAUNCH INFO 2024-05-01 10:00:00,101 -----------  Configuration  ----------------------\n"
        f"LAUNCH INFO 2024-05-01 10:00:00,101 {devices}\n"
    )
    return head + "".join(f"epoch: 0, step: {i}, loss: {v}\n" for i, v in enumerate(losses))


@pytest.mark.parametrize("devices", ["devices: 0,1,2", "nproc_per_node: 3"])
def test_a_card_log_of_a_run_on_more_devices_is_noted(cli, tmp_path, devices):
    """A merged log whose launcher says the run used 3 devices, given alone (or with one more
    card): a note names the cards' logs missing; all three given, none."""
    base = write(tmp_path, "".join(f"step {i} loss {v}\n" for i, v in enumerate(LOSSES)), "b.log")
    cards = [write(tmp_path, _card(LOSSES, devices), f"workerlog.{c}") for c in range(3)]
    out = " ".join(cli("compare", base, cards[0], "-k", "1").out.split())  # lines wrapped
    assert "says the run used 3 devices, and 1 card log(s) were given" in out
    assert f"missing: {cards[1]}, {cards[2]}" in out
    out = " ".join(cli("compare", base, cards[0], cards[2], "-k", "1").out.split())
    assert f"missing: {cards[1]})" in out
    assert "says the run used" not in cli("compare", base, *cards, "-k", "1").out


def test_a_failure_of_a_run_missing_card_logs_names_them_first(tmp_path):
    """Card 0's log alone, its launcher saying the run used 2 devices, fails at update 0 (its
    loss is card 0's share, not the run's): the diagnosis named smoothing and seeds and left
    the missing log to a note; it now says it first, and its fix leads with giving every log."""
    from gradalign import api

    base = write(tmp_path, "".join(f"step {i} loss {v}\n" for i, v in enumerate(LOSSES)), "b.log")
    card = write(tmp_path, _card([v + 0.05 for v in LOSSES], "devices: 0,1"), "workerlog.0")
    (d,) = api.compare(base, card, accum_steps=1).diagnosis
    assert d.code == "unexplained"
    assert "; the merged logs are not the whole run, which comes first: " in d.message
    assert f"(missing: {tmp_path / 'workerlog.1'})" in d.message
    assert d.fix.startswith("give every card's log, card 0 first")
    plain = write(tmp_path, "".join(f"step {i} loss {v + 0.05}\n" for i, v in enumerate(LOSSES)))
    assert "not the whole run" not in api.compare(base, plain, accum_steps=1).diagnosis[0].message
