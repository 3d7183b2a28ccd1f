"""Recompute's time in the cost model is what the runtime runs: a forward replayed by B and by BI,
and a W that replays the forward and backpropagates through the interior layers again."""

import torch
from torch import nn

from pipeboard.trainer.runtime.stage import Stage
from pipeboard.trainer.schedule.action_costs import StageCosts
from pipeboard.trainer.schedule.predict import recomputed, recomputed_costs


def test_the_charge_per_action():
    c = StageCosts(fwd_s=1.0, bwd_s=2.2, bwd_input_s=1.0, bwd_weight_s=1.2, bwd_weight_batched_s=0.5)
    r = recomputed(c)
    assert (r.fwd_s, r.bwd_s, r.bi_s) == (1.0, 3.2, 2.0)
    # W replays forward (1.0) and the input gradients (1.0) before its own weight gradients (1.2);
    # a batched W(-1) replays one microbatch at a time: no batching discount
    assert r.w_s == r.w_batched_s == 1.0 + 1.0 + 1.2
    assert recomputed(c, forward_s=0.5).bi_s == 1.5
    # the first stage's BI wants no input gradients: it replays nothing, W does the backward
    first = recomputed(c, first=True)
    assert (first.bi_s, first.w_s, first.bwd_s) == (0.0, r.w_s, r.bwd_s)
    out = recomputed_costs([c, c], [1])
    assert out[0] is c and out[1] == r
    assert recomputed_costs([c, c], [0])[0] == first


def _forwards(split: bool, first: bool = False) -> tuple[int, int, int]:
    """How often the stage's layers run forward in F, in B (or BI), in W, for one microbatch."""
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    calls = []
    layers[0].register_forward_hook(lambda *_: calls.append(1))
    stage = Stage(1, layers, torch.optim.SGD(layers.parameters(), lr=0.1), is_first=first, is_last=False,
                  loss_fn=None, stash=False, loss_scale=1.0, recompute=True)
    stage.forward(0, stage.versions.current, [torch.randn(4, 8)], None)
    f = len(calls)
    stage.backward(0, [torch.randn(4, 8)], weights=not split)
    b = len(calls) - f
    if split:
        stage.backward_weight(0)
    return f, b, len(calls) - f - b


def test_the_runtime_replays_as_charged():
    assert _forwards(split=False) == (1, 1, 0)  # B: one replay
    assert _forwards(split=True) == (1, 1, 1)  # BI: one replay; W: another
    assert _forwards(split=False, first=True) == (1, 1, 0)
    assert _forwards(split=True, first=True) == (1, 0, 1)  # the first stage's BI: nothing to replay for
