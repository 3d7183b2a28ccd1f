"""Boundary buffers: the received output gradient is counted on CPU while its backward runs, and
memory_model predicts the same bytes at the same moment (no constant input + output term)."""

import torch
from torch import nn

from pipeboard.trainer.runtime.memory_count import Counter
from pipeboard.trainer.runtime.stage import Stage
from pipeboard.trainer.schedule.builder import build
from pipeboard.trainer.schedule.memory_model import StageMemory, worker_memory


def _middle_stage(recompute: bool) -> tuple[Stage, Counter]:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    stage = Stage(1, module, torch.optim.SGD(module.parameters(), lr=0.1), is_first=False, is_last=False,
                  loss_fn=None, stash=False, loss_scale=1.0, recompute=recompute)
    c = Counter()  # this test's own count, whatever the thread's counter saw before
    c.stages.add(stage)
    stage.counter = c
    c.refresh()
    return stage, c


def test_a_received_gradient_is_counted_during_its_backward():
    stage, c = _middle_stage(recompute=False)
    stage.forward(0, stage.versions.current, [torch.randn(1000, 4)], None)
    c.take()  # the next period starts from the level after the forward: weights, input, output, saved
    level = c.peak
    grad = torch.randn(1000, 4)
    stage.backward(0, [grad])
    # the backward's peak is that level and the received gradient (the kept tensors go at its end)
    assert c.take() == level + grad.untyped_storage().nbytes()
    # under recompute the replay's tensors come on top of both
    stage, c = _middle_stage(recompute=True)
    stage.forward(0, stage.versions.current, [torch.randn(1000, 4)], None)
    c.take()
    level = c.peak
    stage.backward(0, [grad])
    assert c.take() > level + grad.untyped_storage().nbytes()


def test_the_prediction_holds_the_received_gradient_during_a_backward_only():
    first = StageMemory(weight_bytes=1000, activation_bytes=100, input_bytes=10, output_bytes=7)
    last = StageMemory(weight_bytes=1000, activation_bytes=100, input_bytes=7, output_bytes=0)
    for schedule in ("gpipe", "1f1b", "zb-h1"):
        w0, w1 = worker_memory(build(schedule, 2, 4), [first, last], optimizer="sgd")
        assert w0.boundary in (0, 7) and w1.boundary == 0, schedule
    # gpipe's stage 0 peaks in its first backward: every microbatch kept, the gradients made, and
    # the received gradient on top
    w0, _ = worker_memory(build("gpipe", 2, 4), [first, last], optimizer="sgd")
    assert (w0.activations, w0.gradients, w0.boundary) == (400, 1000, 7)
    # a larger received gradient raises stage 0's peak by exactly its size, not the last stage's
    bigger = StageMemory(weight_bytes=1000, activation_bytes=100, input_bytes=10, output_bytes=50)
    b0, b1 = worker_memory(build("gpipe", 2, 4), [bigger, last], optimizer="sgd")
    assert b0.total - w0.total == 43 and b1.total == worker_memory(build("gpipe", 2, 4), [first, last],
                                                                     optimizer="sgd")[1].total
