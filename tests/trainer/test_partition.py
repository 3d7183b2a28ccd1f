"""split_model: every valid cut reproduces the model exactly, skips are carried, bad plans are refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeboard.trainer import zoo
from pipeboard.trainer.partition import PartitionError, layer_names, run_stages, split_graph, split_model, uniform_stages
from pipeboard.trainer.profile.outline import capture_layers as trace_layers


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def resnet():
    entry = zoo.get("resnet-digits", channels=4, blocks=2)
    return entry.model, entry.example_input(4)


@pytest.fixture(scope="module")
def transformer():
    entry = zoo.get("transformer-text", dim=16, layers=2, heads=2, seq_len=8)
    return entry.model, entry.example_input(3)


def _cuts(names, positions):
    bounds = [0, *positions, len(names)]
    return [names[a:b] for a, b in zip(bounds, bounds[1:])]


def test_every_two_stage_cut_of_the_residual_net_is_exact(resnet):
    model, x = resnet
    names = layer_names(model, x)
    # the input node, and the residual join, an op outside any module, in the layer that reads it
    assert names[0] == "x" and "block1.relu2" in names and "add" not in names
    _check_every_cut(model, x)


def test_every_two_stage_cut_of_the_transformer_is_exact(transformer):
    model, x = transformer
    names = layer_names(model, x)
    assert names[0] == "tokens" and "blocks.0" in names  # module paths: the blocks of the stack
    _check_every_cut(model, x)


def _check_every_cut(model, x):
    graph = trace_layers(model, x)  # traced once; split_model would trace it for every cut
    names = graph.names()
    full = model(x)
    for cut in range(1, len(names)):
        stages = split_graph(graph, _cuts(names, [cut]))
        (out,) = run_stages(stages, x)
        assert torch.equal(out, full), f"cut after {names[cut - 1]}"
        assert stages[0].output_names == stages[1].input_names


@pytest.mark.parametrize("num_stages", [3, 4, 6])
def test_uniform_multi_stage_splits_are_exact(resnet, transformer, num_stages):
    for model, x in (resnet, transformer):
        names = layer_names(model, x)
        stages = split_model(model, x, uniform_stages(names, num_stages))
        assert len(stages) == num_stages
        for a, b in zip(stages, stages[1:]):
            assert a.output_names == b.input_names
            assert len(a.output_requires_grad) == len(a.output_names)
        (out,) = run_stages(stages, x)
        assert torch.equal(out, model(x))


def test_skip_connection_is_carried_through_the_middle_stage(resnet):
    model, x = resnet
    names = layer_names(model, x)
    # block1: conv1 -> relu1 -> conv2, shortcut(identity) reads the block input: put conv1 alone
    # in the middle stage, so the block input must cross it to reach the add.
    i = names.index("block1.conv1")
    stages = split_model(model, x, _cuts(names, [i, i + 1]))
    block_input = names[i - 1]
    assert block_input in stages[1].input_names and block_input in stages[1].output_names
    (out,) = run_stages(stages, x)
    assert torch.equal(out, model(x))


def test_gradients_through_stages_match_the_full_model(transformer):
    model, x = transformer
    names = layer_names(model, x)
    stages = split_model(model, x, uniform_stages(names, 4))
    model.zero_grad()
    model(x).square().mean().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    # what a pipeline does: each stage runs on detached copies of what it received, then the
    # gradients of its inputs go back to the previous stage
    inputs, outputs = [], []
    values = (x,)
    for stage in stages:
        ins = tuple(v.detach().requires_grad_(v.is_floating_point()) for v in values)
        outputs.append(stage(*ins))
        inputs.append(ins)
        values = outputs[-1]
    outputs[-1][0].square().mean().backward()
    for k in range(len(stages) - 2, -1, -1):
        upstream = [t.grad for t in inputs[k + 1]]
        flags = stages[k].output_requires_grad
        assert [g is not None for g in upstream] == flags  # token ids and positions carry none
        sent = [(o, g) for o, g in zip(outputs[k], upstream) if g is not None]
        torch.autograd.backward([o for o, _ in sent], [g for _, g in sent])
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, expected[n], rtol=1e-5, atol=1e-7), n


class TupleModel(nn.Module):
    """chunk gives a tuple-valued layer; a cut right after it sends the tuple as two tensors."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(4, 3)

    def forward(self, x):
        left, right = self.a(x).chunk(2, dim=-1)
        return self.b(left) * right.sum(-1, keepdim=True), right


def test_tuple_valued_layer_crosses_as_flat_tensors():
    model = TupleModel()
    x = torch.randn(5, 6)
    names = layer_names(model, x)
    # the chunk (outside any module) runs in its first reader's layer, b's, which hands on both
    # the product and `right` (a model output): a tuple of two that crosses as two tensors
    assert names == ["x", "a", "b"]
    stages = split_model(model, x, _cuts(names, [2, 3]))
    assert stages[1].output_names == ["b.0", "b.1"] and stages[2].input_names == ["b.0", "b.1"]
    out = run_stages(stages, x)
    expected = model(x)
    assert len(out) == 2 and all(torch.equal(a, b) for a, b in zip(out, expected))


def test_a_returned_tuple_layer_leaves_the_last_stage_flat():
    class Halves(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 6)

        def forward(self, x):
            return self.lin(x).chunk(2, dim=-1)

    model, x = Halves(), torch.randn(3, 4)
    names = layer_names(model, x)
    stages = split_model(model, x, _cuts(names, [2]))
    out = run_stages(stages, x)
    assert len(out) == 2 and all(torch.equal(a, b) for a, b in zip(out, model(x)))


class Recurrent(nn.Module):
    """nn.LSTM returns (output, (h, c)): a nested tuple, read twice (the last output and h)."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True)
        self.head = nn.Linear(12, 2)

    def forward(self, x):
        out, (h, _) = self.lstm(x)
        return self.head(torch.cat([out[:, -1], h[-1]], dim=-1))


def test_a_nested_tuple_layer_is_one_layer_that_crosses_as_its_flat_tensors():
    model, x = Recurrent(), torch.randn(3, 5, 4)
    graph = trace_layers(model, x)
    names = graph.names()
    lstm = graph.by_name()["lstm"]  # computed once, by its own layer, not inside each reader
    # it hands on what later layers read of (output, (h, c)): output and h
    assert lstm.desc.startswith("LSTM(") and lstm.n_outputs == 2 and lstm.paths == [(0,), (1,)]
    assert all("lstm" not in {h.name for h in layer.helpers} for layer in graph.layers)
    stages = split_graph(graph, _cuts(names, [names.index("lstm") + 1]))
    assert stages[1].input_names == ["lstm.0", "lstm.1"]
    assert stages[0].output_requires_grad == [True, True]
    _check_every_cut(model, x)
    # each parameter in exactly one stage of any cut: nothing is computed on both sides of it
    for cut in range(1, len(names)):
        owners = [{id(p) for p in stage.parameters()} for stage in split_graph(graph, _cuts(names, [cut]))]
        assert not owners[0] & owners[1], f"cut after {names[cut - 1]}"


def test_stage_accepts_a_tuple_or_separate_tensors(resnet):
    model, x = resnet
    names = layer_names(model, x)
    first, second = split_model(model, x, _cuts(names, [len(names) // 2]))
    mid = first(x)
    assert torch.equal(second(mid)[0], second(*mid)[0])
    with pytest.raises(ValueError, match="stage 1 takes"):
        second(x, x, x, x, x)


def test_a_stage_with_only_the_input_passes_it_through(resnet):
    model, x = resnet
    names = layer_names(model, x)
    stages = split_model(model, x, [[names[0]], names[1:]])
    assert stages[0].output_names == ["x"] and stages[0].layers == []
    assert torch.equal(run_stages(stages, x)[0], model(x))


@pytest.mark.parametrize("make,words", [
    (lambda n: [n[:3], ["ghost", *n[3:]]], ["stages[1]", "ghost"]),
    (lambda n: [n[:3], n[2:]], ["stages[1]", "already in stage 0"]),
    (lambda n: [n[:3], n[3:-1]], ["not assigned"]),
    (lambda n: [[n[0], *n[3:]], n[1:3]], ["stage 1", "later"]),
    (lambda n: [n[1:3], [n[0], *n[3:]]], ["model input", "stage 0"]),
    (lambda n: [], ["at least one stage"]),
    (lambda n: ["x"], ["stages[0]", "list of layer names"]),
])
def test_invalid_assignments_are_refused_naming_the_layer(resnet, make, words):
    model, x = resnet
    names = layer_names(model, x)
    with pytest.raises(PartitionError) as info:
        split_model(model, x, make(names))
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_uniform_stages_bounds():
    assert uniform_stages(list("abcde"), 2) == [["a", "b", "c"], ["d", "e"]]
    with pytest.raises(PartitionError, match="num_stages"):
        uniform_stages(list("ab"), 3)
