"""The training-log reader (gradalign.runs.logs): the seed's Paddle logs and hand-made ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradalign.errors import BadInput
from gradalign.runs.logs import fingerprint, looks_like_log, read_log

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "paddle"
BASELINE = FIXTURES / "run.log"
MERGED = FIXTURES / "run_grad.log"
K = 4

GRID = """------------>[[ 0.1  -0.2  ...  0.3
   0.4 ]
 ...
 [ 0.5   0.6  ... -0.7
  -0.8 ]]"""


@pytest.fixture(scope="module")
def baseline():
    return read_log(BASELINE)


@pytest.fixture(scope="module")
def merged():
    return read_log(MERGED, accum_steps=K)


def write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_baseline_fixture(baseline):
    assert (baseline.kind, baseline.source) == ("log", str(BASELINE))
    assert (baseline.micro_steps, baseline.updates, baseline.accum_steps) == (12, 12, 1)
    assert [(t.name, t.shape, t.dtype) for t in baseline.tensors] == [
        ("printed_weight_0", (6, 6), "float32")
    ]
    assert baseline.micro_loss.dtype == np.float64
    assert baseline.micro_loss[0] == 0.29568613
    assert baseline.micro_loss[-1] == 0.2862789
    grid = baseline.weights(0)["printed_weight_0"]
    assert grid.shape == (6, 6) and grid.dtype == np.float64
    assert grid[0, 0] == 0.00325679
    assert grid[0, 2] == 0.01728465 and grid[0, 3] == 0.00671757  # the columns around '...'
    assert grid[-1, -1] == 0.05857831
    assert baseline.weights(11)["printed_weight_0"][0, 0] == 0.00327625
    assert not baseline.full_weights
    # printed with 8 decimals (suppress=True): every value is known to 1e-8, or to its float32
    # spacing where that is coarser (a loss near 0.3: 3e-8)
    spacing = np.spacing(baseline.micro_loss.astype(np.float32)).astype(np.float64)
    np.testing.assert_allclose(baseline.loss_quantum, np.maximum(1e-8, spacing))
    assert baseline.loss_quantum.max() == pytest.approx(2**-25)
    np.testing.assert_allclose(baseline.weight_quantum(0)["printed_weight_0"], 1e-8)
    assert baseline.config["ignored_lines"] == 0 and baseline.notes == []
    assert np.isnan(baseline.printed_window_loss).all()
    assert baseline.micro_items is None and baseline.init_state is None
    assert baseline.lr is None and baseline.load_grads is None
    assert baseline.load_init_weights is None
    assert baseline.micro_state.shape == (12, 1) and baseline.micro_state.dtype == np.int64
    assert baseline.update_state.shape == (12, 1) and baseline.update_state.dtype == np.int64
    # with K=1 every step ends a window: what it printed is an update, no micro-step's row
    assert not baseline.micro_state_known.any() and baseline.update_state_known.all()
    assert len(set(baseline.update_state[:, 0].tolist())) == 12  # every step moved the weights


def test_merged_fixture(merged):
    assert (merged.micro_steps, merged.updates, merged.accum_steps) == (48, 12, K)
    assert merged.micro_loss[0] == 0.31094944
    assert merged.tensors[0].shape == (6, 6)
    assert merged.micro_state.shape == (48, 1) and merged.update_state.shape == (12, 1)
    assert merged.printed_window_loss[0] == 0.29568613
    assert not np.isnan(merged.printed_window_loss).any()
    assert merged.config["ignored_lines"] == 0
    with pytest.raises(IndexError):
        merged.weights(12)


def test_window_means_match_baseline_losses(baseline, merged):
    diff = np.abs(merged.window_losses() - baseline.micro_loss)
    print(f"max |mean of merged window - baseline loss| = {diff.max():.3g}")
    assert 1e-9 <= diff.max() <= 7.1e-8
    # averaging is what aligns them: single micro losses are far from the baseline
    first_micro = merged.micro_loss.reshape(12, K)[:, 0]
    assert np.abs(first_micro - baseline.micro_loss).max() > 1e-3


def test_printed_avgloss_matches_computed_window_means(baseline, merged):
    diff = np.abs(merged.printed_window_loss - merged.window_losses())
    print(f"max |printed avgloss - computed window mean| = {diff.max():.3g}")
    assert diff.max() <= 1e-7
    assert np.abs(merged.printed_window_loss - baseline.micro_loss).max() <= 1e-7


def test_merged_rows_are_what_each_micro_step_computed_with(merged):
    """Row m is what step m-1 printed; a window's first row is the update's own print, so it
    is not a micro-step row (it would equal the window's start by construction)."""
    known = merged.micro_state_known.reshape(12, K)
    assert not known[:, 0].any() and known[:, 1:].all()
    states = merged.micro_state[:, 0]
    for i in range(1, merged.updates):
        window = states[i * K + 1 : (i + 1) * K]
        assert (window == merged.update_state[i - 1, 0]).all(), f"window {i}"
        assert merged.update_state[i, 0] != merged.update_state[i - 1, 0]
    # window 0 prints the initial weights three times, then the first update
    assert len(set(states[1:K].tolist())) == 1 and states[1] != merged.update_state[0, 0]


def test_baseline_weights_match_merged_after_each_window(baseline, merged):
    diffs = [
        np.abs(baseline.weights(i)["printed_weight_0"] - merged.weights(i)["printed_weight_0"])
        for i in range(12)
    ]
    worst = max(float(d.max()) for d in diffs)
    print(f"max |baseline weight - merged weight| = {worst:.3g}")
    assert worst == 0
    assert (baseline.update_state == merged.update_state).all()


def test_fingerprint_follows_values():
    grid = np.array([[0.1, -0.2], [0.0, 1.5]])
    assert fingerprint(grid) == fingerprint(grid.copy())
    assert fingerprint(grid) == fingerprint(np.array([[0.1, -0.2], [-0.0, 1.5]]))
    assert fingerprint(grid) != fingerprint(np.array([[0.1, -0.2], [0.0, 1.50000001]]))
    assert isinstance(fingerprint(grid), int)
    assert -(2**63) <= fingerprint(grid) < 2**63


def test_sniff(tmp_path):
    assert looks_like_log(BASELINE) and looks_like_log(str(MERGED))
    assert not looks_like_log(FIXTURES / "README.md")
    assert not looks_like_log(FIXTURES / "make_logs.py")
    assert not looks_like_log(FIXTURES)
    assert not looks_like_log(tmp_path / "missing.log")
    assert not looks_like_log(write(tmp_path, ""))
    assert not looks_like_log(write(tmp_path, "10 20\n3 apples\n"))
    assert looks_like_log(write(tmp_path, "\n0   [0.5]\n1   [0.4]\n"))
    assert looks_like_log(write(tmp_path, "0   [abc]\n"))  # a step line: reading says what is wrong
    noisy = "W1122 08:14:03.5 gpu_resources.cc:119] note\n" * 500 + "0   2.3205233\n"
    assert looks_like_log(write(tmp_path, noisy))  # framework lines first: still a log
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"0   [0.5]\n\x00\x01")
    assert not looks_like_log(binary)


def test_small_log_grids_ignored_lines_and_avgloss_order(tmp_path):
    text = f"W1121 a warning\n0   [0.5]\n{GRID}\nsome note\n1   [0.25]\n{GRID}\n"
    text += "avgloss -------->[0.375]\n\n2   [1.5e-05]\n" + GRID.replace("0.1 ", "0.9 ") + "\n"
    text += "3   [0.125]\n" + GRID.replace("0.1 ", "0.9 ") + "\n"
    run = read_log(write(tmp_path, text), accum_steps=2)
    assert run.config["ignored_lines"] == 2
    assert "2 line(s)" in run.notes[0] and "line 1: 'W1121 a warning'" in run.notes[0]
    assert run.micro_loss.tolist() == [0.5, 0.25, 1.5e-05, 0.125]
    # the losses are too few rounded numbers (0.5, 0.25 and 0.125 are exact) to show their
    # printer's precision: the log's, 3 digits (0.125), each known to 10**(exponent - 3)
    np.testing.assert_allclose(run.loss_quantum, [1e-3, 1e-3, 1e-8, 1e-3])
    # the grid shows its own printer's: 1 digit in 10 distinct rounded values
    np.testing.assert_allclose(run.weight_quantum(0)["printed_weight_0"], 0.1)
    grid = run.weights(0)["printed_weight_0"]
    assert grid.tolist() == [[0.1, -0.2, 0.3, 0.4], [0.5, 0.6, -0.7, -0.8]]
    assert run.weights(1)["printed_weight_0"][0, 0] == 0.9
    assert run.printed_window_loss[0] == 0.375 and np.isnan(run.printed_window_loss[1])
    assert not run.micro_state_known[2]  # the window's start: update 0's own print
    assert run.micro_state[3, 0] == run.update_state[1, 0] != run.update_state[0, 0]


def test_log_without_weights(tmp_path):
    run = read_log(write(tmp_path, "0   [0.5]\n1   [0.25]\n"), accum_steps=2)
    assert (run.micro_steps, run.updates, run.tensors) == (2, 1, [])
    assert run.micro_state is None and run.update_state is None and run.load_weights is None
    assert run.window_losses().tolist() == [0.375]


def test_paddle3_bare_losses_and_scalar_means(tmp_path):
    """Paddle 3 prints a 0-d loss without brackets; an f-string prints it as a Python float."""
    text = "0   2.3205233\n1   2.320523262023926\navgloss -------->2.3205233\n"
    run = read_log(write(tmp_path, text), accum_steps=2)
    assert run.micro_loss.tolist() == [2.3205233, 2.320523262023926]
    assert run.printed_window_loss.tolist() == [2.3205233]
    # a bare number is known to its own last digit, never closer than float32 holds it
    spacing = float(np.spacing(np.float32(2.3205233)))
    np.testing.assert_allclose(run.loss_quantum, [max(1e-7, spacing), spacing])


@pytest.mark.parametrize(
    "line",
    [
        "0   [0.5]",
        "0   0.5",
        "0\t0.5",
        "0   [[0.5]]",
        "step 0 loss 0.5",
        "step: 0, loss: [0.5]",
        "iter 0: 0.5",
        "0, 0.5",
        "0   array(0.5, dtype=float32)",
        "0 [array([0.5], dtype=float32)]",
    ],
)
def test_step_line_forms(tmp_path, line):
    run = read_log(write(tmp_path, f"{line}\n{line.replace('0', '1', 1)}\n"))
    assert run.micro_loss.tolist() == [0.5, 0.5]


@pytest.mark.parametrize(
    "line",
    ["avgloss -------->[0.375]", "avgloss -------->0.375", "avg loss: 0.375", "mean_loss=0.375"],
)
def test_window_mean_forms(tmp_path, line):
    run = read_log(write(tmp_path, f"0   0.5\n{line}\n1   0.25\n"), accum_steps=2)
    assert run.printed_window_loss.tolist() == [0.375]


def test_numpy_repr_arrays(tmp_path):
    block = "------------>array([[ 0.1, -0.2],\n       [ 0.5,  0.6]], dtype=float32)\n"
    run = read_log(write(tmp_path, f"0   0.5\n{block}1   0.25\n{block}"), accum_steps=2)
    assert run.weights(0)["printed_weight_0"].tolist() == [[0.1, -0.2], [0.5, 0.6]]


def test_framework_lines_anywhere_are_noise(tmp_path):
    """`python train.py > log 2>&1`: glog lines, warnings, launcher lines, progress bars, colour
    codes, other encodings; before the first step, between steps and inside a printed array."""
    text = (
        "I1122 08:14:04.100311 40211 interpretercore.cc:237] New Executor is Running.\n"
        "[2026-11-22 08:15:01,234] [    INFO] distributed_strategy.py:214 - initialized\n"
        "100%|\u2588\u2588\u2588\u2588| 2/2 [00:01<00:00,  1.52it/s]\n"
        "0   [0.5]\n"
        "------------>[[ 0.1  -0.2]\n"
        "W1122 08:14:05.914411 40211 dygraph_functions.cc:84] a warning in the middle\n"
        " [ 0.5   0.6]]\n"
        "\x1b[33mUserWarning: coloured\x1b[0m\n"
        "\x1b[32m1   [0.25]\x1b[0m\n"
        "------------>[[ 0.1  -0.2]\n [ 0.5   0.6]]\n"
    )
    path = tmp_path / "noisy.log"
    path.write_bytes(text.encode() + "W1122 \u5f53\u524d\n".encode("gbk"))
    run = read_log(path, accum_steps=2)
    assert run.micro_loss.tolist() == [0.5, 0.25]
    assert run.weights(0)["printed_weight_0"].tolist() == [[0.1, -0.2], [0.5, 0.6]]
    assert run.config["ignored_lines"] == 6
    assert "noisy.log: 6 line(s)" in run.notes[0]


def test_one_and_two_dimensional_arrays_with_labels_and_commas(tmp_path):
    step = (
        "{i}   [0.5]\n"
        "fc1.w ------------>[[ 0.1, -0.2],\n [ 0.5,  0.6]]\n"
        "------------>[ 1.0000000e+00  9.9999997e-06  1.2345679e-01\n  0.0000000e+00]\n"
    )
    run = read_log(write(tmp_path, step.format(i=0) + step.format(i=1)), accum_steps=2)
    assert [(t.name, t.shape) for t in run.tensors] == [
        ("fc1.w", (2, 2)),
        ("printed_weight_1", (4,)),
    ]
    weights, quanta = run.weights(0), run.weight_quantum(0)
    assert weights["printed_weight_1"].tolist() == [1.0, 9.9999997e-06, 0.12345679, 0.0]
    # numpy's precision here is 7 digits (the most this array shows): each value is known to
    # 10**(exponent - 7), but never closer than float32 holds the array's largest value
    floor = float(np.spacing(np.float32(1.0)))
    np.testing.assert_allclose(quanta["printed_weight_1"], [max(1e-7, floor), floor, floor, floor])
    np.testing.assert_allclose(quanta["fc1.w"], 1e-7)  # 3 distinct rounded values: the log's


def test_fixed_and_scientific_blocks_each_keep_their_precision(tmp_path):
    """numpy's defaults print a block with a value below 1e-4 in scientific notation: that block
    is known to 1e-13 near 7e-05, its fixed-notation neighbours still to 1e-8 only."""
    text = (
        "0   [0.5]\n------------>[[ 0.00325679 -0.00487973]\n [ 0.01504303  0.05857831]]\n"
        "1   [0.5]\n------------>[[ 3.2567900e-03 -7.0300000e-05]\n"
        " [ 1.5043030e-02  5.8578310e-02]]\n"
    )
    run = read_log(write(tmp_path, text))
    fixed, scientific = run.weight_quantum(0)["printed_weight_0"], run.weight_quantum(1)
    np.testing.assert_allclose(fixed, 1e-8)
    floor = float(np.spacing(np.float32(0.05857831)))  # the sci block's largest value
    np.testing.assert_allclose(scientific["printed_weight_0"], floor)
    assert floor < 1e-8


def test_weights_printed_only_after_each_update(tmp_path):
    text = "".join(f"{m}   [0.5]\n" + (f"{GRID}\n" if m % 2 == 1 else "") for m in range(6))
    run = read_log(write(tmp_path, text), accum_steps=2)
    assert run.update_state_known.all() and not run.micro_state_known.any()
    assert run.weights(2)["printed_weight_0"].shape == (2, 4)
    assert "weights are printed after 3 of 6 steps" in run.notes[0]
    partial = read_log(write(tmp_path, text.replace(f"3   [0.5]\n{GRID}\n", "3   [0.5]\n")), 2)
    assert partial.weights(1) is None and partial.update_state_known.tolist() == [1, 0, 1]


def test_steps_may_count_from_one(tmp_path):
    run = read_log(write(tmp_path, "1   [0.5]\n2   [0.25]\n"), accum_steps=2)
    assert run.micro_loss.tolist() == [0.5, 0.25]


BAD_LOGS = {
    "non-consecutive": "0   [0.5]\n2   [0.4]\n",
    "starts at 2": "2   [0.5]\n",
    "garbage loss": "0   [0.5]\n1   [0.4x]\n",
    "two losses": "0   [0.5 0.6]\n",
    "garbage weight": "0   [0.5]\n------------>[[ 0.1  abc]]\n",
    "unclosed grid": "0   [0.5]\n------------>[[ 0.1  0.2]\n [ 0.3  0.4]\n",
    "grid cut by a step": "0   [0.5]\n------------>[[ 0.1  0.2]\n1   [0.4]\n",
    "ragged grid": "0   [0.5]\n------------>[[ 0.1  0.2]\n [ 0.3]]\n",
    "3-D grid": "0   [0.5]\n------------>[[[ 0.1  0.2]]]\n",
    "block count": f"0   [0.5]\n{GRID}\n1   [0.4]\n{GRID}\n{GRID}\n",
    "block shape": f"0   [0.5]\n{GRID}\n1   [0.4]\n------------>[[ 0.1 ]]\n",
    "garbage avgloss": "0   [0.5]\navgloss -------->[nope]\n",
    "too many avgloss": "0   [0.5]\navgloss -------->[0.5]\navgloss -------->[0.5]\n",
    "empty": "",
    "no steps": "hello\nworld\n",
}


@pytest.mark.parametrize("case", sorted(BAD_LOGS))
def test_bad_logs_name_the_file(tmp_path, case):
    path = write(tmp_path, BAD_LOGS[case], name="bad_run.log")
    with pytest.raises(BadInput, match=r"bad_run\.log"):
        read_log(path)


def test_bad_line_is_named(tmp_path):
    path = write(tmp_path, "0   [0.5]\n1   [0.4]\n3   [0.3]\n")
    with pytest.raises(BadInput, match=r"train\.log:3: expected step 2, found step 3: step 2 is "):
        read_log(path)
    every = write(tmp_path, "0   [0.5]\n2   [0.4]\n4   [0.3]\n", name="every.log")
    with pytest.raises(
        BadInput, match=r"found step 2: step 1 is not in the log \(printed every 2 steps"
    ):
        read_log(every)


def test_micro_steps_not_divisible_by_accum_steps(tmp_path):
    path = write(tmp_path, "0   [0.5]\n1   [0.4]\n2   [0.3]\n", name="three.log")
    with pytest.raises(BadInput, match=r"three\.log: 3 micro-steps .*accum_steps=2"):
        read_log(path, accum_steps=2)
    with pytest.raises(BadInput, match=r"run_grad\.log"):
        read_log(MERGED, accum_steps=5)


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_accum_steps(k):
    with pytest.raises(BadInput, match="accum_steps"):
        read_log(BASELINE, accum_steps=k)


def test_missing_directory_and_binary_files(tmp_path):
    with pytest.raises(BadInput, match=r"nothere\.log"):
        read_log(tmp_path / "nothere.log")
    (tmp_path / "adir").mkdir()
    with pytest.raises(BadInput, match="adir"):
        read_log(tmp_path / "adir")
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"0   [0.5]\n\x00\xfe\n")
    with pytest.raises(BadInput, match=r"weights\.bin.*binary"):
        read_log(binary)


def test_a_log_a_crash_left_zero_filled_at_its_end_is_read_to_its_last_line(tmp_path):
    """A node that died mid-write leaves its log's last blocks as NUL bytes: the log was
    refused as 'no step line in its first MiB', as if it held none."""
    cut = tmp_path / "cut.log"
    cut.write_bytes(b"0   [0.5]\n1   [0.25]\n2   [0.125]\n3   [0.0625]\n" + b"\0" * 4096)
    assert looks_like_log(cut)
    assert read_log(cut).updates == 4


def test_messages_are_one_line(tmp_path):
    for case, text in BAD_LOGS.items():
        with pytest.raises(BadInput) as info:
            read_log(write(tmp_path, text))
        assert "\n" not in str(info.value), case
