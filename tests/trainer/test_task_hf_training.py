"""transformers models train in the pipeline runtime on local files read through `datasets`: a
ResNet-18 layout on an imagefolder tree of PNGs, GPT-2 and Llama causal LMs on a parquet and a
text file; one pipelined step leaves the parameters single-process training leaves."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.params import max_diff
from pipeboard.trainer.runtime import RunConfig, run_training
from pipeboard.trainer.runtime.checkpoint import assemble_model
from pipeboard.trainer.runtime.reference import train_sync
from pipeboard.trainer.sink import ListSink

LM_ARGS = {"layers": 4, "dim": 32, "heads": 2, "seq_len": 32}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The same text as a .txt and as a parquet file of one document per row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeboard.trainer.zoo.text import corpus_bytes

    where = tmp_path_factory.mktemp("corpus")
    docs = corpus_bytes().decode("utf-8").split("\n\n")[:400]
    (where / "corpus.txt").write_text("\n".join(docs))
    pq.write_table(pa.table({"text": docs}), where / "corpus.parquet")
    return where


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    from pipeboard.trainer.zoo.pngdigits import write_digits_pngs

    return write_digits_pngs(tmp_path_factory.mktemp("digits-png"), size=32)


@pytest.mark.parametrize("stages", [4])  # 2 stages: tests/trainer/test_task_hf.py's splits (suite time)
def test_resnet18_on_a_png_folder_learns(pngs, stages):
    cfg = RunConfig(model="resnet18-images", model_args={"width": 8}, data=str(pngs), schedule="1f1b",
                    num_stages=stages, batch_size=64, microbatches=4, steps=40)
    summary = run_training(cfg)
    assert summary["metric_name"] == "accuracy" and summary["final_metric"] > 0.5, summary  # chance: 0.1


def _losses(sink: ListSink) -> list[float]:
    return [r.values["loss"] for r in sorted(sink.metrics, key=lambda r: r.step) if "loss" in r.values]


# Each model at one stage count, the other at the other (both counts of both: minutes of the suite).
@pytest.mark.parametrize("model,file,stages", [("gpt2-text", "corpus.parquet", 2), ("llama-text", "corpus.txt", 4)])
def test_causal_lms_split_and_their_loss_falls(corpus, model, file, stages):
    sink = ListSink()
    cfg = RunConfig(model=model, model_args=LM_ARGS, data=str(corpus / file), schedule="1f1b", num_stages=stages,
                    batch_size=16, microbatches=4, steps=30, eval_at_end=False)
    run_training(cfg, sink)
    losses = _losses(sink)
    assert len(losses) >= 20 and sum(losses[-5:]) / 5 < 0.8 * sum(losses[:3]) / 3, losses



@pytest.mark.parametrize("model,stages", [("gpt2-text", 4), ("llama-text", 2)])
def test_one_pipelined_step_equals_single_process_training(corpus, tmp_path, model, stages):
    cfg = RunConfig(model=model, model_args=LM_ARGS, data=str(corpus / "corpus.txt"), schedule="1f1b",
                    num_stages=stages, batch_size=8, microbatches=4, steps=1, checkpoint_dir=str(tmp_path),
                    eval_at_end=False, optimizer="sgd", lr=0.1)
    run_training(cfg)
    trained, _ = assemble_model(cfg, tmp_path)
    before, after = train_sync(cfg, 0), train_sync(cfg, 1)
    assert max_diff(trained, before) > 1e-4  # the step moved the weights
    # SGD: the change is lr x the gradient, so equal parameters mean equal gradients
    assert max_diff(trained, after) < 1e-6


def test_bf16_trains_the_lm_close_to_fp32(corpus):
    finals = {}
    for precision in ("fp32", "bf16"):
        sink = ListSink()
        cfg = RunConfig(model="gpt2-text", model_args=LM_ARGS, data=str(corpus / "corpus.txt"), schedule="1f1b",
                        num_stages=2, batch_size=16, microbatches=4, steps=30, eval_at_end=False, precision=precision)
        run_training(cfg, sink)
        losses = _losses(sink)
        finals[precision] = sum(losses[-5:]) / 5
    assert abs(finals["bf16"] - finals["fp32"]) / finals["fp32"] < 0.02, finals
    assert torch.get_default_dtype() == torch.float32
