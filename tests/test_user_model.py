"""Your own model, data and loss as module:factory, from a file outside the package."""

from __future__ import annotations

import json
import textwrap

import pytest

USER_CODE = textwrap.dedent(
    """
    import numpy as np
    import torch
    from torch import nn


    def make_model():
        return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.LayerNorm(16), nn.Linear(16, 3))


    def make_data(samples, seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((samples, 6)).astype(np.float32)
        return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64)


    def loss_sum(outputs, targets):
        return nn.functional.cross_entropy(outputs, targets, reduction="sum"), len(targets)


    def not_a_model():
        return 42


    def mean_loss(outputs, targets):
        return nn.functional.cross_entropy(outputs, targets)


    def exits():
        raise SystemExit(0)


    def count_of_letters(outputs, targets):
        return nn.functional.cross_entropy(outputs, targets, reduction="sum"), "x"


    def half_a_count(outputs, targets):
        return nn.functional.cross_entropy(outputs, targets, reduction="sum"), 2.5


    def one_more_target(samples, seed):
        x, y = make_data(samples, seed)
        return x, np.concatenate([y, y[:1]])


    def too_narrow(samples, seed):
        return np.zeros((samples, 3), np.float32), np.zeros(samples, np.int64)


    def strings(samples, seed):
        return np.array([["a"] * 6] * samples), np.zeros(samples, np.int64)


    def detached_loss(outputs, targets):
        loss = nn.functional.cross_entropy(outputs.detach(), targets, reduction="sum")
        return loss, len(targets)


    def frozen():
        model = make_model()
        model.requires_grad_(False)
        return model


    class Detached(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = make_model()

        def forward(self, x):
            return self.net(x).detach()
    """
)
SMALL = ["--updates", "4", "--batch-size", "32", "-k", "4"]


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "user_nets.py"
    path.write_text(USER_CODE)
    return path


def test_user_model_data_and_loss_from_a_file_pass(cli, tmp_path, user_file):
    report = tmp_path / "r.json"
    result = cli(
        "verify",
        *SMALL,
        "--model",
        f"{user_file}:make_model",
        "--data",
        f"{user_file}:make_data",
        "--loss",
        f"{user_file}:loss_sum",
        "-o",
        tmp_path / "v",
        "--json",
        report,
    )
    assert result.code == 0, result.out + result.err
    data = json.loads(report.read_text())
    assert data["verdict"] == "pass" and data["reference"] is not None
    manifest = json.loads((tmp_path / "v" / "merged" / "manifest.json").read_text())
    assert [t["name"] for t in manifest["tensors"]][:2] == ["0.weight", "0.bias"]


def test_user_module_on_the_path_passes_and_its_bug_is_caught(
    cli, tmp_path, user_file, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    args = ["--model", "user_nets:make_model", "--data", "user_nets:make_data"]
    assert cli("verify", *SMALL, *args, "-o", tmp_path / "a").code == 0
    failing = cli("verify", *SMALL, *args, "--fault", "no-loss-scale", "-o", tmp_path / "b")
    assert failing.code == 1 and "loss-scale:" in failing.out


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--model", "no_such_module_xyz:make", "cannot import no_such_module_xyz"),
        ("--model", "{file}:missing", "has no 'missing'"),
        ("--model", "{file}:not_a_model", "must return a torch.nn.Module, got int"),
        ("--model", "{dir}/absent.py:make", "no such file"),
        ("--data", "{file}:make_model", "raised TypeError"),
        ("--loss", "{file}:mean_loss", "must return (summed loss tensor, item count)"),
        ("--loss", "{file}:make_data", "raised TypeError"),
        ("--data", "nocolon", "must be module:attribute"),
        ("--model", "{file}:exits", "exited (sys.exit(0)) instead of returning"),
        ("--model", "{dir}/parses_args.py:make", "importing it exited (sys.exit(2))"),
        # these were exit 3, "internal error ... a gradalign bug" (or 2.5 items taken for 2)
        ("--loss", "{file}:count_of_letters", "returned an item count of 'x'"),
        ("--loss", "{file}:half_a_count", "returned an item count of 2.5"),
        ("--data", "{file}:too_narrow", "first forward pass with your data"),
        ("--data", "{file}:one_more_target", "inputs has 128 rows and targets 129"),
        ("--data", "{file}:strings", "inputs must hold numbers, got <U1"),
        ("--loss", "{file}:detached_loss", "does not depend on the model's outputs"),
    ],
)
def test_bad_entry_points_exit_2(cli, tmp_path, user_file, option, value, message):
    (tmp_path / "parses_args.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--epochs', required=True)\nparser.parse_args()\n"
    )
    value = value.format(file=user_file, dir=tmp_path)
    result = cli("verify", *SMALL, option, value, "-o", tmp_path / "v")
    assert result.code == 2, result.out + result.err
    lines = result.err.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], result.err
    assert "Traceback" not in result.err and len(lines[-1]) < 400
    assert not (tmp_path / "v").exists()  # refused before any training


@pytest.mark.parametrize("factory", ["frozen", "Detached"])
def test_a_model_whose_loss_has_no_gradient_exits_2(cli, tmp_path, user_file, factory):
    """A model whose parameters all have requires_grad=False, or whose forward detaches its
    output, was exit 3 ("internal error: element 0 of tensors does not require grad")."""
    data = ["--data", f"{user_file}:make_data", "--model", f"{user_file}:{factory}"]
    result = cli("verify", *SMALL, *data, "-o", tmp_path / "v")
    assert result.code == 2, result.out + result.err
    last = result.err.strip().splitlines()[-1]
    assert last.startswith("error: the model's loss has no gradient"), result.err
    assert not (tmp_path / "v").exists()
