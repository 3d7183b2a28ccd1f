"""Task.evaluate on validation batches padded to their own lengths: per-batch sums, never one
concatenated tensor (trainer/task/metrics.Running)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from pipeboard.trainer.task import Task
from pipeboard.trainer.zoo.varlen_text import IGNORE, Lengths, pad


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(97, 8)
        self.out = nn.Linear(8, 97)

    def forward(self, ids, mask):
        return self.out(self.emb(ids) * mask.unsqueeze(-1))


def token_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE)


def _task(metric=None, lo=3, hi=17):
    data = Lengths(20, lo, hi, seed=1)
    return Task(model=TinyLM(), train_data=data, val_data=data, loss=token_loss, collate_fn=pad, metric=metric,
                batch_size=4, loader_workers=0)


def _by_hand(task, batch_size):
    """Per-token sums over every real token of the split, batch by batch."""
    total, tokens, right = 0.0, 0, 0
    with torch.no_grad():
        for x, y in task.val_batches(batch_size):
            logits = task.model(*x)
            keep = y != IGNORE
            total += float(F.cross_entropy(logits[keep], y[keep], reduction="sum"))
            tokens += int(keep.sum())
            right += int((logits.argmax(-1)[keep] == y[keep]).sum())
    return total / tokens, right / tokens


def test_batches_differ_in_length():
    task = _task()
    shapes = {tuple(x[0].shape[1:]) for x, _ in task.val_batches(6)}
    assert len(shapes) > 1  # the test means nothing unless the batches' lengths differ


def test_loss_is_the_per_token_mean_over_batches_of_different_lengths():
    task = _task()
    mean, _ = _by_hand(task, 6)  # 20 samples in batches of 6: the last is short, and lengths differ
    got = task.evaluate(batch_size=6)
    assert math.isclose(got, mean, rel_tol=1e-6)
    # not the mean of the batches' means
    with torch.no_grad():
        means = [float(token_loss(task.model(*x), y)) for x, y in task.val_batches(6)]
    assert not math.isclose(got, sum(means) / len(means), rel_tol=1e-6)


def test_named_metrics_over_batches_of_different_lengths():
    mean, acc = _by_hand(_task(), 6)
    assert math.isclose(_task("perplexity").evaluate(batch_size=6), math.exp(mean), rel_tol=1e-6)
    assert math.isclose(_task("accuracy").evaluate(batch_size=6), acc, rel_tol=1e-9)


def test_fixed_length_task_gives_the_concatenated_numbers():
    task = _task(lo=9, hi=9)  # every sample of one length: the old concatenation works
    outs, tgts = [], []
    with torch.no_grad():
        for x, y in task.val_batches(6):
            outs.append(task.model(*x))
            tgts.append(y)
    whole = float(token_loss(torch.cat(outs), torch.cat(tgts)))
    assert math.isclose(task.evaluate(batch_size=6), whole, rel_tol=1e-6)
    assert math.isclose(task.metric_fn(outs, tgts), whole, rel_tol=1e-6)
