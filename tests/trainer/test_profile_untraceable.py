"""User models: an untraceable model names the failing op and line; a user task profiles."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

from pipeboard.trainer.profile.fxgraph import UntraceableModelError, trace_layers
from pipeboard.trainer.profile.profiler import profile_model
from pipeboard.trainer.spec import load_task


pytestmark = pytest.mark.usefixtures("one_thread")


class DataDependentBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # control flow on a tensor value: fx cannot trace it
            return self.lin(x)
        return x


class NumpyCall(nn.Module):
    def forward(self, x):
        return torch.from_numpy(x.numpy())  # leaves torch: fx cannot trace it


class ShapeMismatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)

    def forward(self, x):
        return self.lin(x)


def test_control_flow_names_the_line():
    with pytest.raises(UntraceableModelError) as info:
        trace_layers(DataDependentBranch(), torch.randn(2, 4))
    message = str(info.value)
    assert "DataDependentBranch" in message
    assert "test_profile_untraceable.py" in message and "if x.sum() > 0" in message
    assert "control flow" in message


def test_a_call_outside_torch_names_the_line():
    with pytest.raises(UntraceableModelError) as info:
        profile_model(NumpyCall(), torch.randn(2, 4), warmup=0, repeats=1)
    assert "x.numpy()" in str(info.value)


def test_a_failing_op_names_the_node_and_module():
    with pytest.raises(UntraceableModelError) as info:
        trace_layers(ShapeMismatch(), torch.randn(2, 4))
    message = str(info.value)
    assert "'lin'" in message and "Linear" in message and "\n" not in message


class OptionalMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, mask=None, scale=2.0):
        y = self.lin(x)
        if mask is not None:  # plain Python control flow on a default: traced as the constant
            y = y * mask
        return y * scale


def test_arguments_with_defaults_are_traced_as_constants():
    model, x = OptionalMask(), torch.randn(2, 3)
    graph = trace_layers(model, x)
    assert graph.input_names() == ["x"] and [layer.name for layer in graph.layers][1:] == ["lin", "mul"]
    prof = profile_model(model, x, warmup=0, repeats=1)
    assert prof.layer_names() == ["x", "lin", "mul"]
    # given explicitly, the mask is an input like any other
    both = trace_layers(model, (x, torch.ones(2, 3)))
    assert both.input_names() == ["x", "mask"]


def test_wrong_number_of_inputs():
    with pytest.raises(UntraceableModelError, match="takes 1 input"):
        trace_layers(ShapeMismatch(), (torch.randn(2, 3), torch.randn(2, 3)))


def test_non_tensor_output_is_refused():
    class ReturnsDict(nn.Module):
        def forward(self, x):
            return {"y": x + 1}

    with pytest.raises(UntraceableModelError, match="must return a tensor"):
        trace_layers(ReturnsDict(), torch.randn(2))


@pytest.fixture()
def user_package(tmp_path, monkeypatch):
    pkg = tmp_path / "usermodels_a"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset
        from pipeboard.trainer import Task

        def _task(model, width):
            return Task(model=model, train_data=TensorDataset(torch.randn(8, width), torch.randn(8, 2)),
                        loss=nn.functional.mse_loss, batch_size=3)

        def good(width=4):
            return _task(nn.Sequential(nn.Linear(width, 2), nn.ReLU()), width)

        def untraceable():
            class M(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lin = nn.Linear(4, 2)
                def forward(self, x):
                    while x.max() > 1:
                        x = x / 2
                    return self.lin(x)
            return _task(M(), 4)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "usermodels_a"
    for name in [m for m in sys.modules if m.startswith("usermodels_a")]:
        del sys.modules[name]


def test_a_user_task_profiles(user_package):
    task = load_task(f"{user_package}.nets:good", model_args={"width": 6})
    prof = profile_model(task.model, task.example_input(), warmup=0, repeats=1)
    assert prof.batch_size == 3
    assert prof.layer_names() == ["input_1", "_0", "_1"]  # fx names of a top-level Sequential
    assert prof.layers[1].parameter_bytes == 4 * (6 * 2 + 2)


def test_untraceable_user_task_names_the_line(user_package):
    task = load_task(f"{user_package}.nets:untraceable")
    with pytest.raises(UntraceableModelError) as info:
        trace_layers(task.model, task.example_input())
    assert "while x.max() > 1" in str(info.value)
