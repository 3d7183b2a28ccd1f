"""`pipeboard profile MODEL`, `profile import`, `profile export`, `pipeboard models`."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pipeboard.app.cli import cli
from tests.shared_data import graph_txt
from pipeboard.trainer.profile.files import load_profile


@pytest.fixture()
def run():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, list(args))

    return invoke


def test_profile_a_zoo_model(run, tmp_path, monkeypatch):
    monkeypatch.delenv("PIPEBOARD_CPU_MATMUL", raising=False)
    out = tmp_path / "p.json"
    result = run("profile", "mlp", "--model-arg", "depth=2", "-a", "width=16", "--batch-size", "4",
                 "--repeats", "2", "--warmup", "0", "-o", str(out))
    assert result.exit_code == 0, result.output
    prof = load_profile(out)
    assert prof.model == "mlp" and prof.batch_size == 4 and prof.meta["model_args"] == {"depth": 2, "width": 16}
    assert len(prof.layers) == 6
    assert "self-check" in result.output and "ratio" in result.output
    assert prof.meta["cpu_matmul"] == "default"


def test_profile_with_the_kernels_runs_will_use(run, tmp_path):
    from pipeboard.trainer import cpu_matmul

    out = tmp_path / "p.json"
    try:
        result = run("profile", "mlp", "-a", "depth=2", "-a", "width=16", "--batch-size", "4", "--repeats", "2",
                     "--warmup", "0", "--cpu-matmul", "onednn", "-o", str(out))
        assert cpu_matmul.active() == "onednn"
    finally:
        cpu_matmul.use("default")  # the command sets its (the test) process up
    assert result.exit_code == 0, result.output
    assert load_profile(out).meta["cpu_matmul"] == "onednn"


def test_import_then_export_round_trips(run, tmp_path):
    source = graph_txt("resnet18")
    js, txt = tmp_path / "r.json", tmp_path / "g.txt"
    result = run("profile", "import", str(source), "-o", str(js))
    assert result.exit_code == 0, result.output
    assert "layers" in result.output
    result = run("profile", "export", str(js), "-o", str(txt))
    assert result.exit_code == 0, result.output
    a, b = load_profile(source), load_profile(txt)
    assert a.layers == b.layers and a.edges == b.edges


@pytest.mark.parametrize("args,words", [
    (["profile", "no-such-model"], ["unknown zoo model"]),
    (["profile", "mlp", "-a", "depth"], ["--model-arg", "key=value"]),
    (["profile", "mlp", "-a", "depth=0"], ["depth", ">= 1"]),
    (["profile", "mlp", "--device", "tpu"], ["--device"]),
    (["profile", "mlp", "--batch-size", "0"], ["--batch-size"]),
    (["profile", "mlp", "--cpu-matmul", "mkl"], ["--cpu-matmul", "default, onednn"]),
    (["profile", "no_module_xyz:factory"], ["no module named 'no_module_xyz'"]),
    (["profile", "import", "/nonexistent/graph.txt"], ["/nonexistent/graph.txt"]),
])
def test_bad_input_is_one_line_and_nonzero(run, args, words):
    result = run(*args)
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert "Traceback" not in result.output


def test_bad_graph_txt_line_is_named(run, tmp_path):
    bad = tmp_path / "graph.txt"
    bad.write_text("node1 -- Input -- forward_compute_time=x, backward_compute_time=0, activation_size=1, parameter_size=0\n")
    result = run("profile", "import", str(bad), "-o", str(tmp_path / "p.json"))
    assert result.exit_code != 0 and "line 1" in result.output and "forward_compute_time" in result.output


def test_models_lists_the_zoo(run):
    result = run("models")
    assert result.exit_code == 0
    for name in ("mlp-digits", "cnn-digits", "resnet-digits", "transformer-text", "mlp"):
        assert name in result.output
    assert "perplexity" in result.output


def test_profile_help_shows_the_model_form(run):
    result = run("profile", "--help")
    assert result.exit_code == 0
    assert "pipeboard profile MODEL" in result.output and "import" in result.output and "export" in result.output


def test_profile_a_user_factory_and_an_untraceable_one(run, tmp_path, monkeypatch):
    (tmp_path / "cli_user_models_a.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "from torch.utils.data import TensorDataset\n"
        "from trainer import Task\n\n"
        "def _task(model, width, out):\n"
        "    data = TensorDataset(torch.randn(8, width), torch.randn(8, out))\n"
        "    return Task(model=model, train_data=data, loss=nn.functional.mse_loss, batch_size=5)\n\n"
        "def small(width=3):\n"
        "    return _task(nn.Sequential(nn.Linear(width, 2), nn.Tanh()), width, 2)\n\n"
        "class Branchy(nn.Module):\n"
        "    def forward(self, x):\n"
        "        if x.mean() > 0:\n"
        "            return x\n"
        "        return -x\n\n"
        "def branchy():\n"
        "    return _task(Branchy(), 2, 2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "u.json"
    result = run("profile", "cli_user_models_a:small", "-a", "width=4", "--repeats", "1", "--warmup", "0", "-o", str(out))
    assert result.exit_code == 0, result.output
    prof = load_profile(out)
    assert prof.model == "cli_user_models_a:small" and prof.batch_size == 5 and len(prof.layers) == 3
    result = run("profile", "cli_user_models_a:branchy", "-o", str(tmp_path / "b.json"))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code != 0 and len(lines) == 1
    assert "if x.mean() > 0" in lines[0] and "cli_user_models_a.py" in lines[0]
