"""Tied weights across stages train as one parameter: synchronous schedules equal single-process
gradient accumulation and every copy stays bit-identical; pipedream refuses a tie across workers
before any worker starts."""

from __future__ import annotations

import textwrap

import pytest
import torch

from pipeboard.trainer.runtime import RunConfig, run_training
from pipeboard.trainer.runtime import stage_modules, tied
from pipeboard.trainer.runtime.checkpoint import assemble_model
from pipeboard.trainer.runtime.run_config import ConfigError
from pipeboard.trainer.runtime.layout import resolve
from pipeboard.trainer.runtime.reference import train_sync
from pipeboard.trainer.sink import ListSink

TASK = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import TensorDataset

    from pipeboard.trainer import Task


    class TiedLM(nn.Module):
        """Embedding, tanh(Linear) blocks, and logits through the embedding's own weight (a
        Linear sharing it, or h @ embed.weight.T); ties "a-b,c-d" also ties blocks a and b's weights,
        c and d's."""

        def __init__(self, vocab, width, depth, head, ties):
            super().__init__()
            self.head = head
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
            for pair in filter(None, ties.split(",")):
                a, b = map(int, pair.split("-"))
                self.blocks[b].weight = self.blocks[a].weight
            if head == "linear":
                self.out = nn.Linear(width, vocab, bias=False)
                self.out.weight = self.embed.weight

        def forward(self, x):
            h = self.embed(x)
            for block in self.blocks:
                h = torch.tanh(block(h))
            return self.out(h) if self.head == "linear" else h @ self.embed.weight.T


    def make(vocab=23, width=16, depth=3, head="linear", ties="", samples=128):
        g = torch.Generator().manual_seed(3)
        x = torch.randint(0, vocab, (samples, 6), generator=g)
        y = (x * 7 + 1) % vocab
        return Task(model=TiedLM(vocab, width, depth, head, ties), train_data=TensorDataset(x, y),
                    loss=lambda out, t: F.cross_entropy(out.flatten(0, 1), t.flatten()), loader_workers=0)


    def gpt2(samples=64):
        import transformers

        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=97, n_positions=16,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                      eos_token_id=1, use_cache=False)
        g = torch.Generator().manual_seed(4)
        x = torch.randint(0, 97, (samples, 8), generator=g)
        y = torch.roll(x, -1, dims=1)
        # the loss gets what the model returns: a transformers ModelOutput
        return Task(model=transformers.GPT2LMHeadModel(cfg), train_data=TensorDataset(x, y),
                    loss=lambda out, t: F.cross_entropy(out.logits.flatten(0, 1), t.flatten()), loader_workers=0)
''')



def one_block_each(n: int) -> list[list[str]]:
    """n blocks cut into n stages: embed + block 0 | block 1 | ... | block n-1 + logits (each
    tanh, an op outside any module, runs in the layer of the block that reads it, the last one in
    the head's layer)."""
    return [(["embed"] if i == 0 else []) + [f"blocks.{i}"] + (["out"] if i == n - 1 else [])
            for i in range(n)]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "tiedlm.py"
    path.write_text(TASK)
    return str(path)


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    return max(float((pa[k] - pb[k]).detach().abs().max()) for k in pa)


def ties_of(cfg: RunConfig) -> list[tied.Tied]:
    task = stage_modules.load_task(cfg)
    layout = resolve(cfg)
    modules = stage_modules.build_stages(task.model, task.example_input(cfg.microbatch_size),
                                         stage_modules.stage_layers(cfg, task, layout.virtual_stages))
    return tied.find(modules, task.model)


def assert_copies_identical(cfg: RunConfig, states: dict, ties: list[tied.Tied]) -> None:
    """Every copy of every tie, on every rank and stage holding it, is bit-identical."""
    for t in ties:
        copies = [(r, s, st["stages"][s]["module"][name]) for r, st in states.items()
                  for s in st["stages"] if s in t.slots for name in t.slots[s]]
        assert len({(r, s) for r, s, _ in copies}) >= len(t.stages)
        for r, s, value in copies[1:]:
            assert torch.equal(value, copies[0][2]), f"{t.name}: rank {r} stage {s} differs from the first copy"


def run(tmp_path, task_file, *, steps=3, factory="make", model_args=None, batch_size=16, microbatches=4, **kw):
    # SGD, not Adam: Adam's step barely changes when a gradient is scaled, so a tie counted
    # twice would slip through
    cfg = RunConfig(model=f"{task_file}:{factory}", model_args=model_args or {}, batch_size=batch_size,
                    microbatches=microbatches,
                    steps=steps, checkpoint_dir=str(tmp_path / "ckpt"), eval_at_end=False, optimizer="sgd",
                    lr=0.1, **kw)
    summary = run_training(cfg)
    assert summary["steps"] == steps
    trained, states = assemble_model(cfg, tmp_path / "ckpt")
    ties = ties_of(cfg)
    assert ties, "the test model must tie parameters across stages"
    assert_copies_identical(cfg, states, ties)
    reference = train_sync(cfg, steps)
    assert max_diff(reference, train_sync(cfg, 0)) > 1e-4  # it really trained
    assert max_diff(trained, reference) < 1e-5
    return cfg, ties


@pytest.mark.parametrize("schedule,stages,head", [
    ("gpipe", 2, "linear"), ("1f1b", 2, "linear"), ("gpipe", 3, "linear"), ("1f1b", 3, "matmul"),
])
def test_tied_embedding_and_head_equal_gradient_accumulation(tmp_path, task_file, schedule, stages, head):
    cfg, ties = run(tmp_path, task_file, schedule=schedule, num_stages=stages, model_args={"head": head})
    assert [t.stages for t in ties] == [(0, stages - 1)]  # the pair sits in the first and last stage


def test_tied_with_replicas(tmp_path, task_file):
    """Stage 0 has two replicas: its replica sum counts once in the tied sum."""
    run(tmp_path, task_file, schedule="1f1b", num_stages=2, replicas=[2, 1], workers=3)


def test_tied_with_replicas_on_both_sides_split_backward(tmp_path, task_file):
    run(tmp_path, task_file, schedule="zb-h1", num_stages=2, replicas=[1, 2], steps=2)


def test_tied_interleaved(tmp_path, task_file):
    """2 workers x 2 chunks: stage 0 on worker 0, stage 3 on worker 1."""
    _, ties = run(tmp_path, task_file, schedule="interleaved-1f1b", num_stages=2, chunks=2)
    assert [t.stages for t in ties] == [(0, 3)]


def test_tied_interleaved_ties_stepped_in_a_cycle(tmp_path, task_file):
    """3 workers x 2 chunks, blocks (0, 4), (1, 5), (2, 3) tied: worker 0 steps stage 0 then 3,
    worker 1 stage 1 then 4, worker 2 stage 2 then 5. Summing each tie at its own STEP would have
    worker 0 wait on 1 (tie 0-4), 1 on 2 (tie 1-5) and 2 on 0 (tie 2-3): a deadlock."""
    _, ties = run(tmp_path, task_file, schedule="interleaved-1f1b", stages=one_block_each(6), chunks=2,
                  batch_size=12, microbatches=3, model_args={"depth": 6, "ties": "0-4,1-5,2-3"})
    assert sorted(t.stages for t in ties) == [(0, 4), (0, 5), (1, 5), (2, 3)]


def test_tied_interleaved_two_chunks_of_one_worker(tmp_path, task_file):
    """Blocks 1 and 3 tied: stages 1 and 3 are both on worker 1 (each steps its own copy once,
    with the full sum), besides the embedding tie across workers."""
    _, ties = run(tmp_path, task_file, schedule="interleaved-1f1b", stages=one_block_each(4), chunks=2,
                  model_args={"depth": 4, "ties": "1-3"}, weight_grads="batched")
    assert sorted(t.stages for t in ties) == [(0, 3), (1, 3)]


def test_gpt2_tied_lm_head(tmp_path, task_file):
    pytest.importorskip("transformers")
    cfg, ties = run(tmp_path, task_file, factory="gpt2", schedule="1f1b", num_stages=2)
    assert [(t.name, t.stages) for t in ties] == [("lm_head.weight", (0, 1))]  # the model's own name


def test_pipedream_refuses_a_tie_across_workers(task_file):
    sink = ListSink()
    cfg = RunConfig(model=f"{task_file}:make", schedule="pipedream", batch_size=16, microbatches=4,
                    num_stages=3, steps=2, eval_at_end=False)
    with pytest.raises(ConfigError) as err:
        run_training(cfg, sink)
    assert str(err.value) == ("pipedream: parameter 'out.weight' is shared by stages 0 and 2 (tied weights); "
                              "untie it (e.g. tie_word_embeddings=False) or use a synchronous schedule")
    assert not sink.statuses  # failed before any worker started
