"""profile_model: names and edges a plan can execute, measured times, bytes, the self-check."""

from __future__ import annotations

import pytest
import torch

from pipeboard.trainer import zoo
from pipeboard.trainer.partition import layer_names, run_stages, split_model
from pipeboard.trainer.profile import Profile
from pipeboard.trainer.profile.outline import capture_layers
from pipeboard.trainer.profile.profiler import profile_model, self_check_line
from pipeboard.trainer.profile.files import load_profile


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def resnet_profile():
    entry = zoo.get("resnet-digits", channels=4, blocks=2)
    x = entry.example_input(8)
    calls = []
    prof = profile_model(entry.model, x, batch_size=8, warmup=1, repeats=3, timer="cpu",
                         progress=lambda done, total, what: calls.append((done, total, what)), model_name="resnet-digits")
    return entry, x, prof, calls


def test_layers_and_edges_are_the_captured_graph(resnet_profile):
    entry, x, prof, _ = resnet_profile
    graph = capture_layers(entry.model, x)
    assert prof.layer_names() == layer_names(entry.model, x)
    assert prof.edges == graph.edges()
    assert prof.layers[0].desc == "Input" and prof.layers[0].compute_ms == 0
    # the residual join, an op outside any module, runs in the layer that reads it: it reads two
    add_inputs = [src for src, dst in prof.edges if dst == "block1.relu2"]
    assert add_inputs == ["block1.conv2", "stem_relu"]
    assert prof.model == "resnet-digits" and prof.batch_size == 8 and prof.device == "cpu"


def test_times_are_measured_per_layer(resnet_profile):
    _, _, prof, _ = resnet_profile
    convs = [layer for layer in prof.layers if layer.desc.startswith("Conv2d")]
    assert convs and all(layer.forward_ms > 0 and layer.backward_ms > 0 for layer in convs)
    assert all(layer.forward_spread_ms >= 0 and layer.backward_spread_ms >= 0 for layer in prof.layers)
    m = prof.meta
    assert m["repeats"] == 3 and m["timer"] == "thread_time"
    assert m["step_ms"] > 0 and m["layer_sum_ms"] == pytest.approx(sum(layer.compute_ms for layer in prof.layers))
    assert m["self_check_ratio"] == pytest.approx(m["layer_sum_ms"] / m["step_ms"])
    line = self_check_line(prof)
    assert "ratio" in line and f"{m['self_check_ratio']:.3f}" in line
    off = Profile(layers=prof.layers, meta={**m, "self_check_ratio": 0.5})
    assert "outside 0.85..1.15" in self_check_line(off)
    assert "outside" not in self_check_line(Profile(layers=prof.layers, meta={**m, "self_check_ratio": 1.0}))


def test_bytes_follow_the_tensors(resnet_profile):
    entry, x, prof, _ = resnet_profile
    by_name = {layer.name: layer for layer in prof.layers}
    stem = entry.model.stem
    assert by_name["stem"].parameter_bytes == 4 * (stem.weight.numel() + stem.bias.numel())
    assert by_name["stem"].optimizer_bytes == 2 * by_name["stem"].parameter_bytes  # Adam's two moments
    assert by_name["stem"].activation_bytes == 4 * 8 * 4 * 8 * 8  # float32 [8, 4, 8, 8]
    assert by_name["x"].activation_bytes == x.numel() * 4
    total = sum(p.numel() * 4 for p in entry.model.parameters())
    assert sum(layer.parameter_bytes for layer in prof.layers) == total


def test_progress_reports_every_step(resnet_profile):
    *_, calls = resnet_profile
    assert calls[0][:2] == (0, 4) and calls[-1] == (4, 4, "done")
    assert [c[0] for c in calls] == [0, 1, 2, 3, 4]


def test_profile_round_trips_and_its_plan_executes(resnet_profile, tmp_path):
    entry, x, prof, _ = resnet_profile
    path = tmp_path / "p.json"
    prof.save(path)
    again = load_profile(path)
    assert again.to_dict() == prof.to_dict()
    # any contiguous split of the profile's order is a stage assignment split_model runs
    names = again.layer_names()
    stages = split_model(entry.model, x, [names[:7], names[7:15], names[15:]])
    assert torch.equal(run_stages(stages, x)[0], entry.model(x))


def test_wall_clock_timer_and_auto_choice():
    model, x = torch.nn.Linear(3, 3), torch.randn(2, 3)
    assert profile_model(model, x, warmup=0, repeats=1, timer="wall").meta["timer"] == "perf_counter"
    # the autouse fixture runs torch on one thread: auto picks this thread's CPU time
    assert profile_model(model, x, warmup=0, repeats=1).meta["timer"] == "thread_time"


def test_saved_bytes_are_what_autograd_keeps_each_storage_once():
    """Linear saves its input; ReLU its output, which the next Linear saves again (counted once,
    to the ReLU); GELU its input, the Linear's output no earlier layer saved. Parameters never."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6), torch.nn.GELU())
    prof = profile_model(model, torch.randn(3, 4), warmup=0, repeats=1, optimizer="sgd")
    saved = {layer.name: layer.saved_bytes for layer in prof.layers}
    assert saved == {"input_1": 0.0, "0": 3 * 4 * 4, "1": 3 * 8 * 4, "2": 0.0, "3": 3 * 6 * 4}
    assert Profile.from_dict(prof.to_dict()).layers[1].saved_bytes == 3 * 4 * 4
    # a split backward keeps each Linear's output gradient from BI to W; ReLU and GELU have no weights
    grads = {layer.name: layer.weight_grad_bytes for layer in prof.layers}
    assert grads == {"input_1": 0.0, "0": 3 * 8 * 4, "1": 0.0, "2": 3 * 6 * 4, "3": 0.0}


def test_shared_module_parameters_count_once():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(torch.relu(self.lin(x)))

    prof = profile_model(Tied(), torch.randn(2, 4), warmup=0, repeats=1, optimizer="sgd")
    assert sum(layer.parameter_bytes for layer in prof.layers) == 4 * 20
    assert sum(layer.optimizer_bytes for layer in prof.layers) == 4 * 20  # one momentum buffer
    assert prof.batch_size == 2


def test_a_recurrent_layer_is_timed_once_with_its_three_tensors():
    from tests.trainer.test_partition import Recurrent

    prof = profile_model(Recurrent(), torch.randn(3, 5, 4), warmup=1, repeats=2)
    layers = {layer.name: layer for layer in prof.layers}
    lstm = layers["lstm"]  # what later layers read of (output, (h, c)): 3 x 5 x 6 and h, 1 x 3 x 6, in float32
    assert lstm.activation_bytes == [3 * 5 * 6 * 4, 3 * 6 * 4]
    assert lstm.parameter_bytes == 4 * sum(p.numel() for p in torch.nn.LSTM(4, 6).parameters())
    assert lstm.forward_ms > 0 and lstm.backward_ms > 0
    assert all(layer.parameter_bytes == 0 for name, layer in layers.items() if name.startswith("getitem"))


def test_multi_input_model_and_integer_tokens():
    entry = zoo.get("transformer-text", dim=16, layers=1, heads=2, seq_len=8)
    prof = profile_model(entry.model, entry.example_input(2), warmup=0, repeats=2)
    by_name = {layer.name: layer for layer in prof.layers}
    assert by_name["tokens"].activation_bytes == 2 * 8 * 8  # int64 ids
    # the positions (an arange outside any module) are made inside the position embedding's layer
    assert [n for n in by_name if "arange" in n] == [] and by_name["pos"].desc.startswith("Embedding(")

    class TwoInputs(torch.nn.Module):
        def forward(self, a, b):
            return a * 2 + b

    prof2 = profile_model(TwoInputs(), (torch.randn(3, 2), torch.randn(3, 2)), warmup=0, repeats=1)
    assert prof2.layer_names()[:2] == ["a", "b"] and prof2.meta["inputs"] == ["a", "b"]


@pytest.mark.parametrize("kwargs,match", [
    ({"repeats": 0}, "repeats"),
    ({"optimizer": "lion"}, "optimizer"),
    ({"device": "cuda"}, "cuda"),
    ({"timer": "sundial"}, "timer"),
])
def test_bad_arguments_are_refused(kwargs, match):
    if kwargs.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match=match):
        profile_model(torch.nn.Linear(2, 2), torch.randn(1, 2), **kwargs)


@pytest.mark.parametrize("workers", [2, 3])
def test_a_pipedream_plan_of_the_profile_executes_exactly(resnet_profile, workers):
    plan_mod = pytest.importorskip("pipeboard.trainer.plan")
    entry, x, prof, _ = resnet_profile
    plan = plan_mod.plan(prof, [(workers, 1e9)], straight=True)
    stages = [stage.layers for stage in plan.stages]
    assert sorted(n for s in stages for n in s) == sorted(prof.layer_names())
    modules = split_model(entry.model, x, stages)
    assert torch.equal(run_stages(modules, x)[0], entry.model(x))


def test_a_parameter_read_directly_is_a_layer_and_keeps_no_hooks():
    class Functional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(5, 3))

        def forward(self, x):
            return torch.nn.functional.linear(x, self.weight).relu()

    model = Functional()
    prof = profile_model(model, torch.randn(4, 3), warmup=1, repeats=2)
    by_name = {layer.name: layer for layer in prof.layers}
    # no module of its own around the ops: the model's forward is one layer, owning the parameter
    assert prof.layer_names() == ["x", "forward"] and by_name["forward"].parameter_bytes == 5 * 3 * 4
    assert not model.weight._backward_hooks  # the profiler's gradient hooks were removed


def test_input_gradient_split_and_optimizer_steps_are_measured_without_touching_the_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    before = [p.detach().clone() for p in model.parameters()]
    prof = profile_model(model, torch.randn(8, 16), warmup=1, repeats=3, optimizer="sgd")
    by_name = {layer.name: layer for layer in prof.layers}
    for layer in prof.layers[1:]:
        assert layer.backward_input_ms is not None and 0 <= layer.backward_input_ms <= layer.backward_ms
        assert layer.backward_weight_ms == pytest.approx(layer.backward_ms - layer.backward_input_ms)
    # the first layer reads only the model input, whose gradient no stage computes
    assert by_name["0"].backward_input_ms == 0 and by_name["2"].backward_input_ms > 0
    assert by_name["0"].optimizer_ms > 0 and by_name["1"].optimizer_ms == 0  # ReLU has no parameters
    assert prof.meta["optimizer_step_ms"] == pytest.approx(sum(layer.optimizer_ms or 0 for layer in prof.layers))
    assert prof.meta["gradients"] == "accumulate" and prof.meta["concurrent"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # steps ran on copies
    assert all(p.grad is None for p in model.parameters())


def test_the_measurements_can_be_left_out_and_a_concurrent_load_runs_meanwhile():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    plain = profile_model(model, torch.randn(4, 8), warmup=0, repeats=1, split_backward=False,
                          optimizer_steps=False, accumulate=False)
    assert all(layer.backward_input_ms is None and layer.optimizer_ms is None for layer in plain.layers)
    assert plain.meta["gradients"] == "fresh" and plain.meta["optimizer_step_ms"] is None
    loaded = profile_model(model, torch.randn(4, 8), warmup=0, repeats=2, concurrent=1)
    assert loaded.meta["concurrent"] == 1 and by_kind(loaded, "Linear") and loaded.meta["load_batch_size"] == 4
    assert plain.meta["load_batch_size"] is None
    with pytest.raises(ValueError, match="concurrent"):
        profile_model(model, torch.randn(4, 8), concurrent=-1)


def test_the_concurrent_load_trains_on_its_own_input(monkeypatch):
    """A batch measured under a load of microbatches (what the other stage runs meanwhile)."""
    import pipeboard.trainer.profile.profiler as profiler

    seen = []
    real = profiler.ConcurrentLoad

    class Spy(real):
        def __init__(self, model, inputs, n, precision="fp32"):
            seen.append([tuple(t.shape) for t in inputs])
            super().__init__(model, inputs, n, precision)

    monkeypatch.setattr(profiler, "ConcurrentLoad", Spy)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    prof = profile_model(model, torch.randn(16, 8), warmup=0, repeats=2, concurrent=1, load_input=torch.randn(2, 8))
    assert seen == [[(2, 8)]] and prof.batch_size == 16 and prof.meta["load_batch_size"] == 2
    profile_model(model, torch.randn(16, 8), warmup=0, repeats=1, concurrent=1)
    assert seen[-1] == [(16, 8)]  # by default the load trains on the measured input


def by_kind(prof: Profile, prefix: str) -> list:
    return [layer for layer in prof.layers if layer.desc.startswith(prefix) and layer.forward_ms > 0]


_FAULTS_PROBE = """
import os, resource, sys
os.environ["THP_MEM_ALLOC_ENABLE"] = "1"  # as every pipeboard command runs
import torch
torch.set_num_threads(1)
if sys.argv[1] == "profiled":
    from pipeboard.trainer.profile.profiler import profile_model
    prof = profile_model(torch.nn.Linear(4, 4), torch.randn(2, 4), warmup=0, repeats=1)
    assert prof.meta["allocator"] == {"huge_pages": True, "keep_freed_memory": True}, prof.meta["allocator"]
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])
x = torch.randn(8, 1024)
for _ in range(3):
    model(x).sum().backward()
per_step = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(x).sum().backward()
    per_step.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sorted(per_step)[2])  # the median step: a one-off burst of the kernel's does not count
"""


def test_profiles_run_with_the_workers_heap_so_backwards_take_no_page_faults():
    """After profile_model the process keeps freed memory as runtime workers do: a backward of four
    Linear(1024, 1024) layers allocates its fresh 4 MiB gradients without page faults. Under glibc's
    defaults (the control, a fresh process) each step faults thousands of pages, time a run's
    backward does not spend, which the profile then charged to every layer's backward. The median
    step counts: once, under the full suite's load in CI, the profiled process averaged 101 faults
    per step where it has 0 alone or beside a compute load (the kernel's doing, which no allocator
    setting controls); a one-off burst in one step is not what the setting is about."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    faults = {}
    for mode in ("profiled", "plain"):
        out = subprocess.run([sys.executable, "-c", _FAULTS_PROBE, mode], capture_output=True, text=True,
                             timeout=120, cwd=root)
        assert out.returncode == 0, out.stderr
        faults[mode] = float(out.stdout.strip().splitlines()[-1])
    assert faults["plain"] > 500, faults  # the control: fresh gradients fault without the setting
    assert faults["profiled"] < 50, faults


def test_input_gradients_above_an_embedding_of_integer_inputs_are_timed():
    """Token inputs need no gradient; the runtime's BI still carries the chain down to the
    embedding's output, so the layers above it have an input-gradient backward (it measured 0 in
    every layer of a language model while the frozen pass had no leaf needing a gradient)."""
    import torch
    from torch import nn

    from pipeboard.trainer.profile.profiler import profile_model

    class TokenModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.a, self.b = nn.Embedding(50, 64), nn.Linear(64, 64), nn.Linear(64, 50)

        def forward(self, t):
            return self.b(torch.relu(self.a(self.emb(t))))

    prof = profile_model(TokenModel(), torch.randint(0, 50, (8, 16)), batch_size=8, warmup=1, repeats=3)
    by = {layer.name: layer for layer in prof.layers}
    assert by["emb"].backward_input_ms == 0.0  # fed by the tokens alone: no input gradient
    assert all(by[n].backward_input_ms > 0 for n in ("a", "b"))  # the relu between them runs in b's layer
