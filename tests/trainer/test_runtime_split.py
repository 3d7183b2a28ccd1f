"""The split backward of one stage (BI = input gradients, W = weight gradients), in one process.

Two copies of a stage run the same forwards, under two weight versions (weight stashing) or one
(synchronous): one backpropagates in full, the other runs BI per microbatch and then W, per
microbatch or batched over every pending one. Input and weight gradients must agree.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn

import pipeboard.trainer.zoo
from pipeboard.trainer.runtime.stage_modules import build_stages, layer_names, uniform_split
from pipeboard.trainer.runtime.stage import Stage
from pipeboard.trainer.schedule import Kind, build

MICROBATCHES = 4


def _close(actual, expected, what, scale=None):
    """Within 1e-5 relative; entries far below the tensor's (or ``scale``'s) largest compare at
    1e-5 of that largest (a gradient that is zero in exact arithmetic is rounding noise)."""
    assert actual is not None and expected is not None, what
    scale = scale or float(expected.abs().max()) or 1.0
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * scale, msg=lambda m: f"{what}: {m}")


def _zoo_case(name: str, stage: int, num_stages: int, mb_size: int = 4, **args):
    zoo = pipeboard.trainer.zoo.get(name, seed=0, **args)
    example = zoo.example_input(mb_size)
    names = layer_names(zoo.model, example)
    split = uniform_split(names, [1] * len(names), num_stages)
    modules = build_stages(zoo.model, example, split)
    gen = torch.Generator().manual_seed(1)
    train_x, train_y = zoo.train_data.tensors
    order = torch.randperm(len(train_x), generator=gen)[: MICROBATCHES * mb_size]
    data = []
    for i in range(MICROBATCHES):
        rows = order[i * mb_size:(i + 1) * mb_size]
        xs: tuple = (train_x[rows],)
        with torch.no_grad():
            for m in modules[:stage]:
                xs = m(*xs)
        data.append((list(xs), train_y[rows]))
    return modules[stage], stage == 0, stage == num_stages - 1, zoo.loss, data


class TiedLM(nn.Module):
    """One weight shared three ways: an embedding, a Linear's slot (the same Parameter object) and
    a functional read of the attribute (an fx get_attr); one Linear is called twice."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(20, 12)
        self.mid = nn.Linear(12, 12)
        self.head = nn.Linear(12, 20, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, tokens):
        h = torch.tanh(self.mid(self.tok(tokens)))
        h = self.mid(h)
        return self.head(h) + 0.5 * nn.functional.linear(h, self.tok.weight)


def _tied_case():
    torch.manual_seed(0)
    model = TiedLM()
    example = torch.randint(0, 20, (3, 5))
    (module,) = build_stages(model, example, [layer_names(model, example)])
    gen = torch.Generator().manual_seed(2)
    data = [([torch.randint(0, 20, (3, 5), generator=gen)], torch.randint(0, 20, (3, 5), generator=gen))
            for _ in range(MICROBATCHES)]
    loss = lambda out, y: nn.functional.cross_entropy(out.reshape(-1, 20), y.reshape(-1))  # noqa: E731
    return module, True, True, loss, data


CASES = {
    "mlp-first": lambda: _zoo_case("mlp", 0, 3, depth=4, width=32, samples=64),
    "mlp-middle": lambda: _zoo_case("mlp", 1, 3, depth=4, width=32, samples=64),
    "mlp-last": lambda: _zoo_case("mlp", 2, 3, depth=4, width=32, samples=64),
    "cnn-middle": lambda: _zoo_case("cnn-digits", 1, 3, channels=4),
    "resnet-middle": lambda: _zoo_case("resnet-digits", 1, 3, channels=4, blocks=3),
    "resnet-last": lambda: _zoo_case("resnet-digits", 2, 3, channels=4, blocks=3),
    "transformer-first": lambda: _zoo_case("transformer-text", 0, 3, dim=16, layers=2, heads=2, seq_len=8),
    "transformer-middle": lambda: _zoo_case("transformer-text", 1, 3, dim=16, layers=2, heads=2, seq_len=8),
    "tied": _tied_case,
}


def _stage(module, first, last, loss_fn, stash):
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    return Stage(0, module, opt, is_first=first, is_last=last, loss_fn=loss_fn if last else None,
                 stash=stash, loss_scale=1.0 / MICROBATCHES)


def _out_grads(stage: Stage, outs, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=gen) for o in outs if o.dtype.is_floating_point]


def _run(case, stash: bool, mode: str):
    """Forward microbatches 0, 1 on version 0 (stash) and 2, 3 on version 1 (the step between
    them keeps version 0 alive), then backpropagate all: full ("full"), BI then W per
    microbatch ("each") or BI then one W(-1) ("batched"). Version 0 is released (its gradients
    move to the parameters) between the BIs and the weight gradients."""
    module, first, last, loss_fn, data = case
    stage = _stage(module, first, last, loss_fn, stash)
    split = mode != "full"
    versions = [0, 0, 1, 1] if stash else [0] * MICROBATCHES
    outs, in_grads = {}, {}

    def backward(mb):
        grads = None if last else _out_grads(stage, outs[mb], seed=100 + mb)
        in_grads[mb] = stage.backward(mb, grads, weights=not split)

    for mb in (0, 1):
        outs[mb] = stage.forward(mb, versions[mb], [x.clone() for x in data[mb][0]], data[mb][1])
    if stash:  # version 1: a step with gradients that do not depend on the microbatches
        gen = torch.Generator().manual_seed(7)
        for p in stage.versions.params:
            p.grad = torch.randn(p.shape, generator=gen)
        stage.step(1, keep_current=True)
    for mb in (2, 3):
        outs[mb] = stage.forward(mb, versions[mb], [x.clone() for x in data[mb][0]], data[mb][1])
    for mb in (2, 0, 3, 1):
        backward(mb)
    if stash:
        stage.versions.release(0)
    if mode == "each":
        for mb in (3, 1, 0, 2):
            stage.backward_weight(mb)
    elif mode == "batched":
        stage.backward_weight(-1)
    assert not stage.pending_weights
    # What the next step applies: every version's gradients added up on the parameters (a
    # batched W puts a Linear's gradients of both versions on one of them).
    weight_grads = [None if g is None else g.clone() for g in stage.versions.gather_grads()]
    return in_grads, weight_grads, stage.versions.names


@pytest.mark.parametrize("mode", ["each", "batched"])
@pytest.mark.parametrize("stash", [False, True], ids=["sync", "stash"])
@pytest.mark.parametrize("name", list(CASES))
def test_split_backward_equals_full_backward(name, stash, mode, one_thread):
    case = CASES[name]()
    ref_in, ref_w, names = _run((copy.deepcopy(case[0]),) + case[1:], stash, "full")
    in_grads, weights, _ = _run(case, stash, mode)
    for mb in range(MICROBATCHES):
        assert len(in_grads[mb]) == len(ref_in[mb])
        for k, (a, b) in enumerate(zip(in_grads[mb], ref_in[mb])):
            _close(a, b, f"input gradient {k} of microbatch {mb}")
    assert any(g is not None for g in ref_w)
    labels = names
    # the key projection's bias has a zero gradient in exact arithmetic (softmax ignores a
    # constant shift): compare such tensors against the stage's largest weight gradient
    scale = max(float(b.abs().max()) for b in ref_w if b is not None)
    for label, a, b in zip(labels, weights, ref_w):
        if b is None:
            assert a is None or not a.any(), label
        else:
            _close(a, b, label, scale=max(float(b.abs().max()), 1e-2 * scale))


def _aten_ops(fn) -> Counter:
    with torch.profiler.profile() as prof:
        fn()
    return Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


def test_input_backward_skips_weight_matmuls_and_weight_backward_skips_the_chain(one_thread):
    """Four Linear layers, a middle stage: the full backward runs 8 matmuls (input and weight
    gradient of each layer), BI 4 (input only), W(-1) over three microbatches 4 (one per layer,
    batched) and no activation backward (it does not rerun the input chain)."""
    torch.manual_seed(0)
    m = nn.Sequential(*[layer for _ in range(4) for layer in (nn.Linear(16, 16), nn.ReLU())])
    stage = _stage(m, False, False, None, stash=False)
    x, g = torch.randn(8, 16), torch.randn(8, 16)
    stage.forward(9, 0, [x.clone()], None)
    full = _aten_ops(lambda: stage.backward(9, [g]))
    for mb in range(3):
        stage.forward(mb, 0, [x.clone()], None)
    bi = _aten_ops(lambda: stage.backward(0, [g], weights=False))
    stage.backward(1, [g], weights=False)
    stage.backward(2, [g], weights=False)
    w = _aten_ops(lambda: stage.backward_weight(-1))
    matmuls = lambda ops: sum(n for k, n in ops.items() if k in ("aten::mm", "aten::addmm", "aten::addmm_"))  # noqa: E731
    assert matmuls(full) == 8
    assert matmuls(bi) == 4 and bi["aten::threshold_backward"] == 4
    assert matmuls(w) == 4 and w["aten::threshold_backward"] == 0


def test_batched_weight_backward_is_one_matmul_per_linear_across_weight_versions(one_thread):
    """Microbatches that ran against two stashed versions still share one matmul per layer in
    W(-1): a Linear's weight gradient does not read the weights, and both go to the same update."""
    torch.manual_seed(0)
    m = nn.Sequential(*[layer for _ in range(4) for layer in (nn.Linear(16, 16), nn.ReLU())])
    stage = _stage(m, False, False, None, stash=True)
    x, g = torch.randn(8, 16), torch.randn(8, 16)
    stage.forward(0, 0, [x.clone()], None)
    for p in stage.versions.params:
        p.grad = torch.zeros_like(p)
    stage.step(1, keep_current=True)
    stage.forward(1, 1, [x.clone()], None)
    stage.backward(0, [g], weights=False)
    stage.backward(1, [g], weights=False)
    w = _aten_ops(lambda: stage.backward_weight(-1))
    assert sum(n for k, n in w.items() if k in ("aten::mm", "aten::addmm", "aten::addmm_")) == 4


def test_weight_backward_order_errors_and_nothing_left_behind(one_thread):
    torch.manual_seed(0)
    stage = _stage(nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)), False, False, None, stash=False)
    with pytest.raises(RuntimeError, match="before its input-gradient backward"):
        stage.backward_weight(0)
    stage.backward_weight(-1)  # nothing pending: nothing to do
    stage.forward(0, 0, [torch.randn(3, 4)], None)
    stage.backward(0, [torch.randn(3, 2)], weights=False)
    assert set(stage.pending_weights) == {0}
    assert all(p.grad is None for p in stage.versions.params)
    stage.backward_weight(0)
    assert not stage.pending_weights and all(p.grad is not None for p in stage.versions.params)
    with pytest.raises(RuntimeError, match="backward of microbatch 0 before its forward"):
        stage.backward(0, [torch.randn(3, 2)], weights=False)
    stage.forward(1, 0, [torch.randn(3, 4)], None)
    stage.backward(1, [torch.randn(3, 2)], weights=False)
    with pytest.raises(RuntimeError, match="pending"):
        stage.step(1, keep_current=False)  # its weight gradients would miss this update


def test_in_place_change_of_a_linear_input_after_the_forward_is_refused(one_thread):
    class Overwrites(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = torch.tanh(x)
            y = self.a(h)
            return self.b(y) + h.mul_(2).sum()  # h changes after Linear a read it

    stage = _stage(Overwrites(), False, False, None, stash=False)
    stage.forward(0, 0, [torch.randn(2, 4)], None)
    with pytest.raises(RuntimeError, match="modified"):
        stage.backward(0, [torch.randn(2, 4)], weights=False)
        stage.backward_weight(0)


def test_a_stage_built_without_layer_calls_refuses_to_split(one_thread):
    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    stage = Stage(0, m, torch.optim.SGD(m.parameters(), lr=0.1), is_first=False, is_last=False, loss_fn=None,
                  stash=False, loss_scale=1.0, layer_calls=False)
    stage.forward(0, 0, [torch.randn(2, 4)], None)
    with pytest.raises(RuntimeError, match="layer calls"):
        stage.backward(0, [torch.randn(2, 4)], weights=False)
    stage.forward(1, 0, [torch.randn(2, 4)], None)
    assert len(stage.backward(1, [torch.randn(2, 4)])) == 1  # the full backward still works


def _emulate(schedule, modules, lr: float, data) -> list[list[torch.Tensor]]:
    """Run ``schedule``'s compute and update actions on Stage objects in one process, in the order
    the simulator puts them (every action a positive time, so a start sorts after whatever it
    waits for), releasing each weight version after its last use as the runtime does; returns
    every stage's weights at the end."""
    from pipeboard.trainer.schedule import simulate
    from pipeboard.trainer.schedule.action_costs import costs_uniform

    p, stash = schedule.num_stages, not schedule.meta["sync"]
    stages = [Stage(s, m, torch.optim.SGD(m.parameters(), lr=lr, momentum=0.5), is_first=s == 0,
                    is_last=s == p - 1, loss_fn=nn.functional.mse_loss, stash=stash, loss_scale=1.0)
              for s, m in enumerate(modules)]
    timeline = simulate(schedule, costs_uniform(p, 1.0, 2.0, step_s=0.1, allreduce_s=0.1)).timeline
    events = sorted((e for e in timeline if e.kind in ("F", "B", "BI", "W", "step")), key=lambda e: e.start)
    queued: dict[tuple, list] = {}  # (kind, stage, microbatch) -> its actions in list order
    for acts in schedule.actions:
        for a in acts:
            queued.setdefault((a.kind.value, a.stage, a.microbatch), []).append(a)
    order = [queued[(e.kind, e.stage, e.microbatch)].pop(0) for e in events]
    last_use = {(a.stage, a.version): n for n, a in enumerate(order) if a.kind.is_compute}
    acts_out, grads_in = {}, {}
    for n, a in enumerate(order):
        st, s, mb = stages[a.stage], a.stage, a.microbatch
        if a.kind is Kind.FORWARD:
            x, y = data[mb]
            out = st.forward(mb, a.version, [x] if s == 0 else acts_out.pop((s, mb)), y)
            if s < p - 1:
                acts_out[(s + 1, mb)] = [o.clone() for o in out]
        elif a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
            g = st.backward(mb, None if s == p - 1 else grads_in.pop((s, mb)), weights=a.kind is Kind.BACKWARD)
            if s > 0:
                grads_in[(s - 1, mb)] = g
        elif a.kind is Kind.BACKWARD_WEIGHT:
            st.backward_weight(mb)
        else:
            st.step(a.version, last_use.get((s, st.versions.current), -1) > n)
        if a.kind.is_compute and last_use.get((s, a.version)) == n and stash:
            st.versions.release(a.version)
    return [[p.detach().clone() for p in st.versions.params] for st in stages]


def _schedule(name: str, m: int, batched: bool):
    if name == "pipedream-batches":  # one update per 3 microbatches: a W(-1) spans versions
        from pipeboard.trainer.schedule.async_1f1b import build_pipedream

        return build_pipedream(3, m, 3, batch_weight_grads=batched)
    return build("1f1b" if name == "zb-h1" and not batched else name, 3, m, batch_weight_grads=batched)


@pytest.mark.parametrize("name,m", [("1f1b", 4), ("gpipe", 4), ("pipedream", 6), ("pipedream-batches", 9),
                                    ("zb-h1", 4)])
def test_a_schedule_with_batched_weight_gradients_trains_like_the_plain_one(name, m, one_thread):
    """The same schedule run with full backwards and with BI + W(-1) before each update (for
    pipedream: weight stashing, W(-1) naming the current version while older ones are released)
    ends with the same weights; zb-h1 (BI and W per microbatch, W put off) with 1f1b's."""
    if name == "pipedream-batches":  # what this case is for: a W(-1) over BIs of two versions
        versions_per_w, since = [], set()
        for acts in _schedule(name, m, True).actions:
            for a in acts:
                if a.kind is Kind.BACKWARD_INPUT:
                    since.add(a.version)
                elif a.kind is Kind.BACKWARD_WEIGHT:
                    versions_per_w.append(len(since))
                    since = set()
        assert max(versions_per_w) == 2
    zoo = pipeboard.trainer.zoo.get("mlp", seed=0, depth=3, width=16, out=4, samples=64)
    example = zoo.example_input(4)
    names = layer_names(zoo.model, example)
    split = uniform_split(names, [1] * len(names), 3)
    gen = torch.Generator().manual_seed(3)
    data = [(torch.randn(4, 16, generator=gen), torch.randn(4, 4, generator=gen)) for _ in range(m)]
    results = []
    for batched in (False, True):
        schedule = _schedule(name, m, batched)
        modules = build_stages(copy.deepcopy(zoo.model), example, split)
        initial = [[p.detach().clone() for p in mod.parameters()] for mod in modules]
        results.append(_emulate(schedule, modules, lr=0.1, data=data))
    for s, (plain, batched) in enumerate(zip(*results)):
        assert any(not torch.equal(a, b) for a, b in zip(plain, initial[s])), f"stage {s} did not train"
        for a, b in zip(batched, plain):
            _close(a, b, f"stage {s} weights")
