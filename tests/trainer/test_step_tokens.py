"""Tokens per step: each step's record carries its batch's non-padding tokens
(``tokens``, counted by the first stage from the attention mask) and ``tokens_per_s`` over the
window samples/s uses; a task without a sequence dimension has neither."""

from __future__ import annotations

import pytest
import torch

from pipeboard.trainer.runtime import RunConfig, run_training
from pipeboard.trainer.runtime.data import token_counter
from pipeboard.trainer.sink import ListSink

STEPS = 4


def step_values(sink: ListSink) -> dict[int, dict]:
    return {r.step: r.values for r in sink.metrics if "stages" in r.values}


# a synchronous schedule, and the asynchronous one, whose first stage reads a batch before the
# previous step is done
@pytest.mark.parametrize("schedule", ["1f1b", "pipedream"])
def test_a_variable_length_run_reports_the_tokens_of_its_batches(schedule):
    pytest.importorskip("transformers")
    from pipeboard.trainer.zoo.varlen_text import causal_lm

    cfg = RunConfig(model="pipeboard.trainer.zoo.varlen_text:causal_lm", schedule=schedule, num_stages=2, batch_size=8,
                    microbatches=4, steps=STEPS, eval_at_end=False)
    sink = ListSink()
    summary = run_training(cfg, sink)
    # the same batches, read directly in the run's seeded order: real tokens are the mask's ones
    task = causal_lm()
    batches = task.train_batches(8)
    expected = [int(next(batches)[0][1].sum()) for _ in range(STEPS)]
    assert len(set(expected)) > 1  # lengths (and so tokens) really differ between steps
    assert expected[0] < 8 * next(task.train_batches(8))[0][0].shape[1]  # the padding is left out
    values = step_values(sink)
    assert [values[k + 1]["tokens"] for k in range(STEPS)] == expected
    for k in range(1, STEPS):  # every step after the first has a window: tokens/s beside samples/s
        v = values[k + 1]
        assert v["tokens_per_s"] > 0 and v["samples_per_s"] > 0
        window = range(max(1, k - 4), k + 1)  # the window's tokens over its samples are the ratio of the two
        ratio = sum(expected[j] for j in window) / (8 * len(window))
        assert v["tokens_per_s"] / v["samples_per_s"] == pytest.approx(ratio)
    assert summary["tokens_per_s"] > 0


def test_a_fixed_shape_task_reports_no_tokens():
    cfg = RunConfig(model="mlp", model_args={"depth": 4, "width": 48, "samples": 512},
                    schedule="1f1b", num_stages=2, batch_size=16, microbatches=4, steps=3, eval_at_end=False)
    sink = ListSink()
    summary = run_training(cfg, sink)
    values = step_values(sink)
    assert len(values) == 3 and all("samples_per_s" in v for k, v in values.items() if k > 1)
    assert not any("tokens" in v or "tokens_per_s" in v for v in values.values())
    assert "tokens_per_s" not in summary


def test_without_a_mask_tokens_are_the_samples_times_the_length():
    pytest.importorskip("transformers")
    from pipeboard.trainer.zoo.varlen_text import causal_lm

    task = causal_lm()
    count = token_counter(task, {1: 24})
    ids = torch.ones(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.long)
    mask[:, :2] = 1
    assert count((ids, mask)) == 6  # the model names its second input attention_mask
    assert count(ids) == 21  # no mask given: samples x length
    assert token_counter(task, {}) is None  # no sequence dimension


def test_train_json_gives_tokens_per_s():
    pytest.importorskip("transformers")
    import json

    from typer.testing import CliRunner

    from pipeboard.app.cli import cli

    result = CliRunner().invoke(cli, ["train", "--model", "pipeboard.trainer.zoo.varlen_text:causal_lm", "--stages", "2",
                                      "--schedule", "1f1b", "--batch-size", "8", "--microbatches", "4", "--steps", "3",
                                      "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["tokens_per_s"] > summary["samples_per_s"] > 0  # sequences of 4..24 tokens: several per sample
