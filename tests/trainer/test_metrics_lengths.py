"""The built-in validation metrics over text padded per batch: microbatches of
different lengths are joined, padded with the ignored index, so the loss and perplexity are means
per token over the whole split, not means of the batches' means."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pipeboard.trainer.task.metrics import IGNORE_INDEX, accuracy, join, join_targets, mean_squared_error, perplexity


def ragged():
    """Two microbatches of logits and token targets: 1 row of 6 real tokens, 2 rows of 1 each."""
    g = torch.Generator().manual_seed(0)
    outs = [torch.randn(1, 6, 5, generator=g), torch.randn(2, 2, 5, generator=g)]
    tgts = [torch.randint(0, 5, (1, 6), generator=g), torch.tensor([[1, IGNORE_INDEX], [3, IGNORE_INDEX]])]
    return outs, tgts


def per_token(outs, tgts) -> float:
    total = sum(float(F.cross_entropy(o.reshape(-1, 5), t.reshape(-1), reduction="sum")) for o, t in zip(outs, tgts))
    return total / sum(int((t != IGNORE_INDEX).sum()) for t in tgts)


def test_perplexity_is_a_mean_per_token_across_lengths():
    outs, tgts = ragged()
    by_batch = sum(float(F.cross_entropy(o.reshape(-1, 5), t.reshape(-1))) for o, t in zip(outs, tgts)) / 2
    assert abs(per_token(outs, tgts) - by_batch) > 0.05  # the two means differ here
    assert perplexity(outs, tgts) == pytest.approx(math.exp(per_token(outs, tgts)), rel=1e-6)


def test_join_pads_targets_to_be_ignored_and_keeps_equal_shapes_as_they_are():
    outs, tgts = ragged()
    out, tgt = join(outs), join_targets(tgts)
    assert out.shape == (3, 6, 5) and tgt.shape == (3, 6)
    assert (tgt[1:, 1:] == IGNORE_INDEX).all() and (out[1:, 2:] == 0).all()
    a, b = torch.ones(2, 3), torch.zeros(1, 3)
    assert torch.equal(join([a, b]), torch.cat([a, b]))


def test_token_accuracy_leaves_the_padding_out():
    out = [torch.tensor([[[0.0, 1.0], [1.0, 0.0]]]), torch.tensor([[[0.0, 1.0]]])]
    tgt = [torch.tensor([[1, 1]]), torch.tensor([[1]])]
    assert accuracy(out, tgt) == pytest.approx(2 / 3)  # 3 real positions, 2 right; the pad not counted


def test_float_targets_of_different_lengths_are_one_line():
    with pytest.raises(ValueError, match=r"^targets: float targets of different shapes"):
        mean_squared_error([torch.zeros(1, 3), torch.zeros(1, 2)], [torch.zeros(1, 3), torch.zeros(1, 2)])


def lm_with_val(**kw):
    """The variable-length causal LM with a validation split of 10 sequences, lengths 4..24."""
    from pipeboard.trainer.zoo.varlen_text import Lengths, causal_lm

    task = causal_lm(**kw)
    task.val_data = Lengths(10, 4, 24, seed=1)
    return task


def test_the_pipeline_validation_loss_averages_per_token(tmp_path):
    pytest.importorskip("transformers")
    from pipeboard.trainer.runtime import RunConfig, run_training
    from pipeboard.trainer.runtime.checkpoint import assemble_model
    from pipeboard.trainer.zoo.varlen_text import next_token_loss

    cfg = RunConfig(model="tests.trainer.test_metrics_lengths:lm_with_val", schedule="1f1b", num_stages=2,
                    batch_size=8, microbatches=4, steps=2, checkpoint_dir=str(tmp_path), eval_at_end=True)
    summary = run_training(cfg)
    trained, _ = assemble_model(cfg, tmp_path)
    task = lm_with_val()
    sums, counts, means = 0.0, 0, []
    with torch.no_grad():
        for (ids, mask), y in task.val_batches(cfg.microbatch_size):  # the run's validation microbatches
            logits = trained.eval()(ids, mask)
            n = int((y[:, 1:] != IGNORE_INDEX).sum())
            loss = float(next_token_loss(logits, y))
            sums, counts = sums + loss * n, counts + n
            means.append(loss)
    assert len(means) == 5
    per_token_loss, per_batch = sums / counts, sum(means) / len(means)
    assert abs(per_token_loss - per_batch) > 1e-3  # a per-batch average would fail below
    assert summary["final_metric"] == pytest.approx(per_token_loss, rel=1e-5)
