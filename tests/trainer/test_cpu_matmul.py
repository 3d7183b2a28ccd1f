"""trainer/cpu_matmul.py: float32 CPU matrix products through oneDNN, everything else untouched."""

from __future__ import annotations

import os

import pytest
import torch

from pipeboard.trainer import cpu_matmul
from pipeboard.trainer.runtime import RunConfig, run_training
from pipeboard.trainer.runtime.checkpoint import assemble_model
from pipeboard.trainer.runtime.run_config import ConfigError
from pipeboard.trainer.runtime.reference import train_sync

needs_onednn = pytest.mark.skipif(not cpu_matmul.available(), reason="this PyTorch build has no oneDNN")


@pytest.fixture
def onednn():
    cpu_matmul.use("onednn")
    try:
        yield
    finally:
        cpu_matmul.use("default")


def _close(got: torch.Tensor, exact: torch.Tensor) -> bool:
    return torch.allclose(got.double(), exact, rtol=1e-5, atol=1e-4)


@needs_onednn
def test_float32_products_go_through_onednn_and_are_right(onednn):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 96, generator=g), torch.randn(96, 40, generator=g)
    bias = torch.randn(40, generator=g)
    exact = a.double() @ b.double()
    before = cpu_matmul.calls
    assert _close(torch.mm(a, b), exact)
    assert _close(torch.mm(a.t().contiguous().t(), b), exact)  # a laid out by columns
    assert _close(torch.mm(a, b.t().contiguous().t()), exact)  # b laid out by columns
    assert _close(torch.addmm(bias, a, b), exact + bias.double())
    assert cpu_matmul.calls - before == 4


@needs_onednn
@pytest.mark.parametrize("case", ["float64", "int64", "alpha_beta", "matrix_bias", "strided", "empty"])
def test_other_products_fall_back_to_pytorch_with_its_results(case):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(8, 12, generator=g), torch.randn(12, 6, generator=g)
    compute = {
        "float64": lambda: torch.mm(a.double(), b.double()),
        "int64": lambda: torch.mm((a * 10).long(), (b * 10).long()),
        "alpha_beta": lambda: torch.addmm(torch.ones(6), a, b, beta=0.5, alpha=2.0),
        "matrix_bias": lambda: torch.addmm(torch.ones(8, 6), a, b),
        "strided": lambda: torch.mm(torch.randn(8, 24, generator=torch.Generator().manual_seed(2))[:, ::2], b),
        "empty": lambda: torch.mm(torch.randn(8, 0), torch.randn(0, 6)),
    }[case]
    expected = compute()
    cpu_matmul.use("onednn")
    try:
        before = cpu_matmul.calls
        got = compute()
        assert cpu_matmul.calls == before  # not through oneDNN
    finally:
        cpu_matmul.use("default")
    assert torch.equal(got, expected)  # PyTorch's own kernel, bit for bit


@needs_onednn
@pytest.mark.parametrize("call,message", [
    (lambda: torch.mm(torch.randn(4, 3), torch.randn(3, 2, dtype=torch.float64)), "same dtype"),
    (lambda: torch.addmm(torch.randn(2), torch.randn(3), torch.randn(3, 2)), "mat1 must be a matrix"),
    (lambda: torch.nn.functional.linear(torch.randn(4, 3), torch.randn(2, 5)), r"\(4x3 and 5x2\)"),
])
def test_bad_products_fail_with_pytorch_s_own_messages(call, message):
    with pytest.raises(RuntimeError) as plain:
        call()
    assert plain.match(message)
    cpu_matmul.use("onednn")
    try:
        with pytest.raises(RuntimeError) as ours:
            call()
    finally:
        cpu_matmul.use("default")
    assert str(ours.value) == str(plain.value)


@needs_onednn
def test_accumulating_a_weight_gradient_in_place_takes_onednn(onednn):
    g = torch.Generator().manual_seed(3)
    grads, xs = torch.randn(32, 24, generator=g), torch.randn(32, 40, generator=g)
    acc = torch.randn(24, 40, generator=g)
    exact = acc.double() + grads.double().t() @ xs.double()
    before = cpu_matmul.calls
    out = acc.addmm_(grads.t(), xs)  # what the runtime's batched W does into an existing .grad
    assert out is acc and cpu_matmul.calls - before == 1
    assert _close(acc, exact)


@needs_onednn
def test_a_linear_layer_s_forward_and_both_gradients_take_onednn():
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 32)
    x, y = torch.randn(16, 96, requires_grad=True), torch.randn(16, 32)

    def step():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(layer(x), y).backward()
        return x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone()

    expected = step()
    cpu_matmul.use("onednn")
    try:
        before = cpu_matmul.calls
        got = step()
        assert cpu_matmul.calls - before == 3  # forward, input gradient, weight gradient
    finally:
        cpu_matmul.use("default")
    for g, e in zip(got, expected):
        assert torch.allclose(g, e, rtol=1e-5, atol=1e-6)


@needs_onednn
def test_default_removes_the_kernels():
    cpu_matmul.use("onednn")
    assert cpu_matmul.active() == "onednn"
    cpu_matmul.use("default")
    assert cpu_matmul.active() == "default"
    before = cpu_matmul.calls
    torch.mm(torch.randn(4, 4), torch.randn(4, 4))
    assert cpu_matmul.calls == before


def test_a_bad_setting_names_where_it_came_from(monkeypatch):
    with pytest.raises(ValueError, match="cpu_matmul: must be one of default, onednn, got 'mkl'"):
        cpu_matmul.configured("mkl")
    monkeypatch.setenv(cpu_matmul.ENV, "fast")
    with pytest.raises(ValueError, match="PIPEBOARD_CPU_MATMUL: must be one of default, onednn, got 'fast'"):
        cpu_matmul.configured()
    with pytest.raises(ConfigError, match="PIPEBOARD_CPU_MATMUL"):
        RunConfig(model="mlp", schedule="1f1b", batch_size=8, microbatches=2, num_stages=2).validate()
    monkeypatch.setenv(cpu_matmul.ENV, "onednn")
    assert cpu_matmul.configured() == "onednn" and cpu_matmul.configured("default") == "default"


@needs_onednn
def test_workers_train_with_onednn_and_still_equal_gradient_accumulation(tmp_path):
    small = {"depth": 4, "width": 48, "samples": 512}
    cfg = RunConfig(model="mlp", model_args=small, batch_size=16, microbatches=4, schedule="1f1b", num_stages=2,
                    steps=3, checkpoint_dir=str(tmp_path), eval_at_end=False, cpu_matmul="onednn")
    summary = run_training(cfg)
    assert summary["cpu_matmul"] == "onednn"  # what each worker reported it computed with
    assert summary["onednn_products"] > 3 * 4 * 2 * 3  # steps x microbatches x layers x (F, BI, W) at least
    trained, _ = assemble_model(cfg, tmp_path)
    cpu_matmul.use("onednn")
    try:
        reference = train_sync(cfg, 3)
    finally:
        cpu_matmul.use("default")
    untrained = train_sync(cfg, 0)
    diff = lambda m: max(float((p - q).detach().abs().max()) for p, q in zip(trained.parameters(), m.parameters()))  # noqa: E731
    assert diff(untrained) > 1e-4
    assert diff(reference) < 1e-5


def test_workers_report_the_default_kernels_when_not_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(cpu_matmul.ENV, raising=False)
    cfg = RunConfig(model="mlp", model_args={"depth": 2, "width": 8, "samples": 64}, batch_size=8, microbatches=2,
                    schedule="gpipe", num_stages=2, steps=2, eval_at_end=False)
    summary = run_training(cfg)
    assert summary["cpu_matmul"] == "default" and summary["onednn_products"] is None


def test_the_launcher_s_setting_reaches_every_worker(tmp_path, monkeypatch):
    """The variable the launcher sees reaches every worker (it resolves it once, for all of them)."""
    monkeypatch.setenv(cpu_matmul.ENV, "onednn" if cpu_matmul.available() else "default")
    cfg = RunConfig(model="mlp", model_args={"depth": 2, "width": 8, "samples": 64}, batch_size=8, microbatches=2,
                    schedule="gpipe", num_stages=2, steps=2, eval_at_end=False)
    assert run_training(cfg)["cpu_matmul"] == cpu_matmul.configured()


def test_use_with_children_sets_the_variable_for_started_processes(monkeypatch):
    # setenv first, so that the variable use_with_children writes is undone after the test (a
    # delenv of an unset variable records nothing: it leaked onednn into later tests' servers)
    monkeypatch.setenv(cpu_matmul.ENV, "default")
    monkeypatch.delenv(cpu_matmul.ENV)
    try:
        assert cpu_matmul.use_with_children("onednn") == "onednn"
        assert os.environ[cpu_matmul.ENV] == "onednn" and cpu_matmul.active() == "onednn"
        monkeypatch.setenv(cpu_matmul.ENV, "onednn")
        assert cpu_matmul.use_with_children(None) == "onednn"  # None: the configured setting
        with pytest.raises(ValueError, match="cpu_matmul"):
            cpu_matmul.use_with_children("fast")
    finally:
        cpu_matmul.use("default")
    assert cpu_matmul.active() == "default"
