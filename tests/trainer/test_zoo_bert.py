"""bert-text: a transformers BERT encoder with its masked-LM head, from a config (no download),
on the zoo's text: masked inputs against the windows, split into pipeline stages, loss falling."""

import torch

from pipeboard.trainer import zoo
from pipeboard.trainer.runtime.run_config import RunConfig
from pipeboard.trainer.runtime.launch import run_training
from pipeboard.trainer.sink import ListSink

ARGS = {"layers": 2, "dim": 32, "heads": 2, "seq_len": 16}


def test_inputs_are_masked_windows_the_same_every_epoch():
    task = zoo.get("bert-text", **ARGS)
    data = task.train_data
    mask = data.vocab_size - 1
    x, y = data[3]
    hidden = x == mask
    assert torch.equal(x[~hidden], y[~hidden]) and not (y == mask).any()
    shares = [float((data[i][0] == mask).float().mean()) for i in range(200)]
    assert 0.10 < sum(shares) / len(shares) < 0.20  # 15% masked
    assert torch.equal(data[3][0], x)  # fixed by the index


def test_the_encoder_trains_in_two_stages_and_its_loss_falls():
    sink = ListSink()
    cfg = RunConfig(model="bert-text", model_args=ARGS, schedule="1f1b", num_stages=2, batch_size=16,
                    microbatches=4, steps=30, eval_at_end=False)
    run_training(cfg, sink)
    losses = [r.values["loss"] for r in sorted(sink.metrics, key=lambda r: r.step) if "loss" in r.values]
    assert len(losses) >= 20 and sum(losses[-5:]) / 5 < 0.8 * sum(losses[:3]) / 3, losses
