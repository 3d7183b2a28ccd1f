"""User models: a model torch.export cannot capture names the module, the line and the op; a user
task profiles."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

from pipeboard.trainer.profile.capture import UntraceableModelError
from pipeboard.trainer.profile.outline import capture_layers
from pipeboard.trainer.profile.profiler import profile_model
from pipeboard.trainer.spec import load_task


pytestmark = pytest.mark.usefixtures("one_thread")


class DataDependentBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # control flow on a tensor's value: no capture can take both paths
            return self.lin(x)
        return x


class NumpyCall(nn.Module):
    def forward(self, x):
        return torch.from_numpy(x.numpy())  # leaves torch: export cannot follow it


class ShapeMismatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)

    def forward(self, x):
        return self.lin(x)


def test_control_flow_names_the_line():
    with pytest.raises(UntraceableModelError) as info:
        capture_layers(DataDependentBranch(), torch.randn(2, 4))
    message = str(info.value)
    assert "DataDependentBranch" in message and "\n" not in message
    assert "test_profile_untraceable.py:" in message and "if x.sum() > 0" in message
    assert "data-dependent" in message


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = DataDependentBranch()

    def forward(self, x):
        return self.inner(x)


def test_a_failure_inside_a_submodule_names_its_path():
    with pytest.raises(UntraceableModelError) as info:
        capture_layers(Outer(), torch.randn(2, 4))
    message = str(info.value)
    assert "module 'inner' (DataDependentBranch)" in message and "if x.sum() > 0" in message


def test_a_call_outside_torch_names_the_line():
    with pytest.raises(UntraceableModelError) as info:
        profile_model(NumpyCall(), torch.randn(2, 4), warmup=0, repeats=1)
    assert "x.numpy()" in str(info.value)


def test_a_failing_op_names_the_node_and_module():
    with pytest.raises(UntraceableModelError) as info:
        capture_layers(ShapeMismatch(), torch.randn(2, 4))
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


def test_arguments_with_defaults_are_captured_as_constants():
    model, x = OptionalMask(), torch.randn(2, 3)
    graph = capture_layers(model, x)
    # the final `* scale`, outside any module and read by nothing else, runs with its producer
    assert graph.input_names() == ["x"] and [layer.name for layer in graph.layers][1:] == ["lin"]
    prof = profile_model(model, x, warmup=0, repeats=1)
    assert prof.layer_names() == ["x", "lin"]
    # given explicitly, the mask is an input like any other
    both = capture_layers(model, (x, torch.ones(2, 3)))
    assert both.input_names() == ["x", "mask"]


def test_wrong_number_of_inputs():
    with pytest.raises(UntraceableModelError, match="forward does not take the example's 2 input"):
        capture_layers(ShapeMismatch(), (torch.randn(2, 3), torch.randn(2, 3)))


def test_non_tensor_output_is_refused():
    class ReturnsCount(nn.Module):
        def forward(self, x):
            return x + 1, 3

    with pytest.raises(UntraceableModelError, match="returns 3, not a tensor"):
        capture_layers(ReturnsCount(), torch.randn(2))


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
    assert prof.layer_names() == ["input_1", "0", "1"]  # a top-level Sequential's module paths
    assert prof.layers[1].parameter_bytes == 4 * (6 * 2 + 2)


def test_untraceable_user_task_names_the_line(user_package):
    task = load_task(f"{user_package}.nets:untraceable")
    with pytest.raises(UntraceableModelError) as info:
        capture_layers(task.model, task.example_input())
    assert "while x.max() > 1" in str(info.value)
