"""Profiles measure in the precision the run will use: a bf16 profile's activations are bf16's."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pipeboard.app.cli import cli
from pipeboard.trainer.profile.profiler import profile_model
from pipeboard.trainer.spec import load_task
from pipeboard.trainer.profile.files import load_profile

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bf16_profile_has_bf16_activations():
    task = load_task("mlp", {"depth": 2, "width": 32, "samples": 128})
    x = task.example_input(8)
    fp32 = profile_model(task.model, x, warmup=0, repeats=1)
    bf16 = profile_model(task.model, x, warmup=0, repeats=1, precision="bf16")
    assert fp32.meta["precision"] == "fp32" and bf16.meta["precision"] == "bf16"
    linears = [i for i, layer in enumerate(fp32.layers) if layer.desc.startswith("Linear")]
    assert linears
    for i in linears:  # autocast runs Linear in bf16: half the bytes of each output
        assert bf16.layers[i].activation_bytes == fp32.layers[i].activation_bytes / 2
    assert bf16.layers[0].activation_bytes == fp32.layers[0].activation_bytes  # the input stays float32


def test_profile_cli_takes_the_precision(tmp_path):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(cli, ["profile", "mlp", "-a", "depth=2", "-a", "width=32", "-a", "samples=128",
                                      "--precision", "bf16", "--repeats", "1", "--warmup", "0", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert load_profile(out).meta["precision"] == "bf16"
    bad = CliRunner().invoke(cli, ["profile", "mlp", "--precision", "fp8", "-o", str(out)])
    assert bad.exit_code == 2 and "--precision" in bad.output
