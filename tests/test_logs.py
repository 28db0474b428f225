"""Tests for gradalign.logs: the Paddle log reader, against the seed fixtures and small files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradalign.errors import BadInput
from gradalign.runs.paddle_log import fingerprint, looks_like_paddle_log, read_paddle_log

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
    return read_paddle_log(BASELINE)


@pytest.fixture(scope="module")
def merged():
    return read_paddle_log(MERGED, accum_steps=K)


def write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_baseline_fixture(baseline):
    assert (baseline.kind, baseline.source) == ("paddle-log", str(BASELINE))
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
    assert baseline.loss_resolution == pytest.approx(1e-8)
    assert baseline.weight_resolution == pytest.approx(1e-8)
    assert baseline.config["ignored_lines"] == 0
    assert np.isnan(baseline.printed_window_loss).all()
    assert baseline.micro_items is None and baseline.init_state is None
    assert baseline.lr is None and baseline.load_grads is None
    assert baseline.load_init_weights is None
    assert baseline.micro_state.shape == (12, 1) and baseline.micro_state.dtype == np.int64
    assert baseline.update_state.shape == (12, 1) and baseline.update_state.dtype == np.int64
    assert baseline.micro_state_known.tolist() == [False] + [True] * 11
    # with k=1 every micro-step starts from what the previous update produced
    assert (baseline.micro_state[1:] == baseline.update_state[:-1]).all()
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


def test_merged_weights_change_only_at_window_end(merged):
    states = merged.micro_state[:, 0]
    for i in range(merged.updates - 1):
        window = states[(i + 1) * K : (i + 2) * K]
        assert (window[1:] == merged.update_state[i, 0]).all(), f"window {i + 1}"
        assert merged.update_state[i + 1, 0] != merged.update_state[i, 0]
    # window 0 prints the initial weights three times, then the first update
    assert len(set(states[1:K].tolist())) == 1
    assert states[1] != merged.update_state[0, 0]


def test_baseline_weights_match_merged_after_each_window(baseline, merged):
    diffs = [
        np.abs(baseline.weights(i)["printed_weight_0"] - merged.weights(i)["printed_weight_0"])
        for i in range(12)
    ]
    worst = max(float(d.max()) for d in diffs)
    print(f"max |baseline weight - merged weight| = {worst:.3g}")
    assert worst <= baseline.weight_resolution
    assert (baseline.update_state == merged.update_state).all()


def test_fingerprint_follows_values():
    grid = np.array([[0.1, -0.2], [0.0, 1.5]])
    assert fingerprint(grid) == fingerprint(grid.copy())
    assert fingerprint(grid) == fingerprint(np.array([[0.1, -0.2], [-0.0, 1.5]]))
    assert fingerprint(grid) != fingerprint(np.array([[0.1, -0.2], [0.0, 1.50000001]]))
    assert isinstance(fingerprint(grid), int)
    assert -(2**63) <= fingerprint(grid) < 2**63


def test_sniff(tmp_path):
    assert looks_like_paddle_log(BASELINE) and looks_like_paddle_log(str(MERGED))
    assert not looks_like_paddle_log(FIXTURES / "README.md")
    assert not looks_like_paddle_log(FIXTURES)
    assert not looks_like_paddle_log(tmp_path / "missing.log")
    assert not looks_like_paddle_log(write(tmp_path, ""))
    assert not looks_like_paddle_log(write(tmp_path, "0   [abc]\n"))
    assert looks_like_paddle_log(write(tmp_path, "\n0   [0.5]\n1   [0.4]\n"))


def test_small_log_grids_ignored_lines_and_avgloss_order(tmp_path):
    text = f"W1121 a warning\n0   [0.5]\n{GRID}\nsome note\n1   [0.25]\n{GRID}\n"
    text += "avgloss -------->[0.375]\n\n2   [1.5e-05]\n" + GRID.replace("0.1 ", "0.9 ") + "\n"
    text += "3   [0.125]\n" + GRID.replace("0.1 ", "0.9 ") + "\n"
    run = read_paddle_log(write(tmp_path, text), accum_steps=2)
    assert run.config["ignored_lines"] == 2
    assert run.micro_loss.tolist() == [0.5, 0.25, 1.5e-05, 0.125]
    assert run.loss_resolution == pytest.approx(1e-6)  # 1.5e-05 has 6 decimals
    assert run.weight_resolution == pytest.approx(0.1)
    grid = run.weights(0)["printed_weight_0"]
    assert grid.tolist() == [[0.1, -0.2, 0.3, 0.4], [0.5, 0.6, -0.7, -0.8]]
    assert run.weights(1)["printed_weight_0"][0, 0] == 0.9
    assert run.printed_window_loss[0] == 0.375 and np.isnan(run.printed_window_loss[1])
    assert run.micro_state[2, 0] == run.update_state[0, 0] != run.update_state[1, 0]


def test_log_without_weights(tmp_path):
    run = read_paddle_log(write(tmp_path, "0   [0.5]\n1   [0.25]\n"), accum_steps=2)
    assert (run.micro_steps, run.updates, run.tensors) == (2, 1, [])
    assert run.micro_state is None and run.update_state is None and run.load_weights is None
    assert run.window_losses().tolist() == [0.375]


BAD_LOGS = {
    "non-consecutive": "0   [0.5]\n2   [0.4]\n",
    "starts at 1": "1   [0.5]\n",
    "garbage loss": "0   [0.5]\n1   [0.4x]\n",
    "two losses": "0   [0.5 0.6]\n",
    "garbage weight": "0   [0.5]\n------------>[[ 0.1  abc]]\n",
    "unclosed grid": "0   [0.5]\n------------>[[ 0.1  0.2]\n [ 0.3  0.4]\n",
    "ragged grid": "0   [0.5]\n------------>[[ 0.1  0.2]\n [ 0.3]]\n",
    "1-D grid": "0   [0.5]\n------------>[ 0.1  0.2]\n",
    "3-D grid": "0   [0.5]\n------------>[[[ 0.1  0.2]]]\n",
    "block count": f"0   [0.5]\n{GRID}\n1   [0.4]\n",
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
        read_paddle_log(path)


def test_bad_line_is_named(tmp_path):
    path = write(tmp_path, "0   [0.5]\n1   [0.4]\n3   [0.3]\n")
    with pytest.raises(BadInput, match=r"train\.log:3: expected step 2, found step 3"):
        read_paddle_log(path)


def test_micro_steps_not_divisible_by_accum_steps(tmp_path):
    path = write(tmp_path, "0   [0.5]\n1   [0.4]\n2   [0.3]\n", name="three.log")
    with pytest.raises(BadInput, match=r"three\.log: 3 micro-steps .*accum_steps=2"):
        read_paddle_log(path, accum_steps=2)
    with pytest.raises(BadInput, match=r"run_grad\.log"):
        read_paddle_log(MERGED, accum_steps=5)


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_accum_steps(k):
    with pytest.raises(BadInput, match="accum_steps"):
        read_paddle_log(BASELINE, accum_steps=k)


def test_missing_directory_and_binary_files(tmp_path):
    with pytest.raises(BadInput, match=r"nothere\.log"):
        read_paddle_log(tmp_path / "nothere.log")
    (tmp_path / "adir").mkdir()
    with pytest.raises(BadInput, match="adir"):
        read_paddle_log(tmp_path / "adir")
    binary = tmp_path / "latin1.log"
    binary.write_bytes(b"0   [0.5]\n\xff\xfe\n")
    with pytest.raises(BadInput, match=r"latin1\.log.*UTF-8"):
        read_paddle_log(binary)


def test_messages_are_one_line(tmp_path):
    for case, text in BAD_LOGS.items():
        with pytest.raises(BadInput) as info:
            read_paddle_log(write(tmp_path, text))
        assert "\n" not in str(info.value), case
