"""A recomputing stage under a split backward (BI, then W): the gradients of the plain backward,
with dropout in the model, each microbatch's W replaying the stage once, and nothing it rebuilt
counted after its W (trainer/runtime/memory_count.py)."""

import copy

import pytest
import torch
from torch import nn

from pipeboard.trainer.runtime.memory_count import counter
from pipeboard.trainer.runtime.stage import Stage


class Block(nn.Module):
    """Attention-shaped: layer norm, an embedding-free attention, dropout and an MLP."""

    def __init__(self, calls: list) -> None:
        super().__init__()
        self.calls = calls
        self.norm = nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.3), nn.Linear(32, 16))

    def forward(self, x):
        self.calls.append(1)
        h = self.norm(x)
        return x + self.mlp(self.attn(h, h, h, need_weights=False)[0])


def run(recompute: bool, split: bool, is_last: bool, microbatches: int = 3):
    torch.manual_seed(0)
    calls: list = []
    module = Block(calls)
    stage = Stage(0, module, torch.optim.SGD(module.parameters(), lr=0.1), is_first=False, is_last=is_last,
                  loss_fn=(lambda out, t: ((out - t) ** 2).mean()) if is_last else None, stash=False,
                  loss_scale=1.0 / microbatches, recompute=recompute)
    data = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 5, 16, generator=data) for _ in range(microbatches)]
    target = torch.randn(2, 5, 16, generator=data)
    torch.manual_seed(2)  # dropout's masks: the same draws in every variant
    input_grads = []
    for mb, x in enumerate(xs):
        out = stage.forward(mb, 0, [x.clone()], target if is_last else None)
        grads = None if is_last else [torch.ones_like(o) for o in out]
        input_grads += stage.backward(mb, grads, weights=not split)
    before_w = len(calls)
    if split:
        stage.backward_weight(-1)
    return [p.grad.clone() for p in module.parameters()], input_grads, len(calls) - before_w, stage


@pytest.mark.parametrize("is_last", [False, True], ids=["middle", "last"])
def test_split_backward_under_recompute_gives_the_plain_gradients(is_last):
    plain, plain_in, _, _ = run(recompute=False, split=False, is_last=is_last)
    for split in (False, True):
        redone, redone_in, replays, _ = run(recompute=True, split=split, is_last=is_last)
        assert max((a - b).abs().max().item() for a, b in zip(plain, redone)) < 1e-5
        assert max((a - b).abs().max().item() for a, b in zip(plain_in, redone_in)) < 1e-5
        # W replays each microbatch once (not once per layer); a full backward's W does nothing
        assert replays == (3 if split else 0)


def test_the_counter_holds_nothing_of_a_microbatch_after_its_weight_pass():
    counter().take()
    base_level = counter().level
    for recompute in (False, True):
        *_, stage = run(recompute=recompute, split=True, is_last=False)
        assert counter().level == base_level  # every saved, in-flight and BI-to-W tensor was let go
        assert not stage.pending_weights and not stage.in_flight
    # while microbatches are in flight the counter holds their saved tensors
    torch.manual_seed(0)
    module = Block([])
    stage = Stage(0, copy.deepcopy(module), torch.optim.SGD(module.parameters(), lr=0.1), is_first=False,
                  is_last=False, loss_fn=None, stash=False, loss_scale=1.0)
    out = stage.forward(0, 0, [torch.randn(2, 5, 16)], None)
    assert counter().level > base_level + out[0].numel() * 4
    stage.backward(0, [torch.ones_like(out[0])])
    assert counter().level == base_level
