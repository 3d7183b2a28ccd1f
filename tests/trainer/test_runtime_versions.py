"""Weight versions and the out-of-place SGD step, in one process."""

from __future__ import annotations

import copy

import pytest
import torch

from pipeboard.trainer.runtime.stage_modules import uniform_split
from pipeboard.trainer.runtime.versions import WeightVersions, sgd_out_of_place


@pytest.mark.parametrize("kw", [dict(momentum=0.9), dict(momentum=0.9, nesterov=True, weight_decay=0.01),
                                dict(momentum=0.0), dict(momentum=0.5, dampening=0.1, maximize=True)])
def test_out_of_place_sgd_equals_torch_sgd(kw):
    torch.manual_seed(0)
    a = torch.nn.Linear(8, 4)
    b = copy.deepcopy(a)
    oa, ob = torch.optim.SGD(a.parameters(), lr=0.1, **kw), torch.optim.SGD(b.parameters(), lr=0.1, **kw)
    for _ in range(3):
        x = torch.randn(5, 8)
        for m in (a, b):
            m(x).pow(2).sum().backward()
        oa.step()
        old = [p.data for p in b.parameters()]
        snapshot = [t.clone() for t in old]
        out = [torch.empty_like(p) for p in b.parameters()]
        assert sgd_out_of_place(ob, list(b.parameters()), out)
        for p, t in zip(b.parameters(), out):
            assert p.data.data_ptr() == t.data_ptr()
        assert all(torch.equal(o, s) for o, s in zip(old, snapshot))  # the old version is untouched
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert torch.allclose(pa, pb, rtol=1e-6, atol=1e-7)
        oa.zero_grad(), ob.zero_grad()


def test_out_of_place_declines_other_optimizers():
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(m.parameters())
    assert not sgd_out_of_place(opt, list(m.parameters()), [torch.empty_like(p) for p in m.parameters()])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_stashed_version_survives_updates_and_backward_uses_it(optimizer):
    """F with v0, step to v1 while v0 is in flight, then B of v0: gradients are those of v0."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9) if optimizer == "sgd" else torch.optim.Adam(m.parameters(), lr=0.5)
    v = WeightVersions(m, opt, stash=True)
    x1, x2 = torch.randn(3, 4), torch.randn(3, 4)
    from torch.func import functional_call

    out1 = functional_call(m, v.weights(0), (x1,)).sum()
    out2 = functional_call(m, v.weights(0), (x2,)).sum()
    out2.backward()
    v.step(1, keep_current=True)  # v0 still needed by out1's backward
    assert not torch.equal(v.weights(1)["0.weight"], v.weights(0)["0.weight"])
    out1.backward()  # would raise if v0 had been modified in place under autograd
    v.release(0)
    grads = [p.grad.clone() for p in m.parameters()]
    ref(x1).sum().backward()  # v0 == the initial weights
    for g, r in zip(grads, ref.parameters()):
        assert torch.allclose(g, r.grad)


def test_uniform_split_balances_and_keeps_every_stage_non_empty():
    names = [f"l{i}" for i in range(9)]
    sizes = [100, 1, 100, 1, 100, 1, 100, 1, 10]
    stages = uniform_split(names, sizes, 2)
    assert stages == [names[:4], names[4:]]
    assert uniform_split(names[:3], [1, 1000, 1], 3) == [["l0"], ["l1"], ["l2"]]
    with pytest.raises(ValueError, match="stages"):
        uniform_split(names[:2], [1, 1], 3)


def test_forward_of_an_old_version_uses_its_weights_in_every_slot_including_tied_ones():
    from pipeboard.trainer.runtime.stage import Stage

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
            self.b.weight = self.a.weight

        def forward(self, x):
            return (self.b(torch.tanh(self.a(x))),)

    torch.manual_seed(0)
    m = Tied()
    before = copy.deepcopy(m)
    stage = Stage(0, m, torch.optim.SGD(m.parameters(), lr=0.5), is_first=True, is_last=False, loss_fn=None,
                  stash=True, loss_scale=1.0)
    x = torch.randn(3, 4)
    stage.forward(0, 0, [x], None)
    stage.backward(0, [torch.ones(3, 4)])
    stage.step(1, keep_current=True)  # version 0 kept as its own tensors
    assert torch.equal(stage._call(0, [x])[0], before(x)[0])
    assert not torch.equal(stage._call(1, [x])[0], before(x)[0])
    assert torch.equal(stage._call(1, [x])[0], m(x)[0])  # version 1 is what the module holds now
