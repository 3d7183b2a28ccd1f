"""The capture itself: a widely copied GPT file with an `assert` on its input's length captures and
splits exactly; named granularity; a missing module is named; train/eval follows the model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeboard.trainer.partition import layer_names, run_stages, split_model, uniform_stages
from pipeboard.trainer.profile.capture import UntraceableModelError

pytestmark = pytest.mark.usefixtures("one_thread")


class CausalSelfAttention(nn.Module):
    """As the widely copied minimal GPT files write it (one fused qkv projection, a registered
    causal mask buffer, shapes read off the input in forward)."""

    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(n_embd, 4 * n_embd), c_proj=nn.Linear(4 * n_embd, n_embd),
                                      act=nn.GELU()))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        m = self.mlp
        return x + m.c_proj(m.act(m.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=50, block_size=16, n_layer=3, n_head=2, n_embd=16):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd), wpe=nn.Embedding(block_size, n_embd), drop=nn.Dropout(0.1),
            h=nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx):
        b, t = idx.size()
        assert t <= self.block_size, f"Cannot forward sequence of length {t}, block size is only {self.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def tokens(batch=4, t=10):
    return torch.randint(0, 50, (batch, t), generator=torch.Generator().manual_seed(0))


def test_the_copied_gpt_file_with_its_assert_captures_and_splits_exactly():
    torch.manual_seed(0)
    model, x = GPT().eval(), tokens()
    names = layer_names(model, x)
    assert names == ["idx", "transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h.0",
                     "transformer.h.1", "transformer.h.2", "transformer.ln_f", "lm_head"]
    for k in (2, 4):
        stages = split_model(model, x, uniform_stages(names, k))
        for s in stages:
            s.eval()
        (out,) = run_stages(stages, x)
        assert torch.allclose(out, model(x), atol=1e-6)
    # the tie (embedding and head) stays one Parameter object in both stages that use it
    stages = split_model(model, x, uniform_stages(names, 2))
    head = model.lm_head.weight
    assert all(any(p is head for p in s.parameters()) for s in stages)


def test_dropout_follows_train_and_eval_as_the_model_does():
    torch.manual_seed(0)
    model, x = GPT(), tokens()
    stages = split_model(model, x, uniform_stages(layer_names(model, x), 2))
    for s in stages:
        s.eval()
    model.eval()
    assert torch.equal(run_stages(stages, x)[0], run_stages(stages, x)[0])  # no dropout drawn in eval
    for s in stages:
        s.train()
    assert not torch.equal(run_stages(stages, x)[0], run_stages(stages, x)[0])


def test_granularity_by_named_module_paths():
    model, x = GPT(), tokens()
    coarse = ["transformer.wte", "transformer.h.0", "transformer.h.1", "transformer.h.2", "lm_head"]
    names = layer_names(model, x, coarse)
    # wpe, drop and ln_f are in no listed module: each runs in the layer of its first reader
    assert names == ["idx", *coarse]
    model.eval()
    stages = split_model(model, x, uniform_stages(names, 3), coarse)
    for s in stages:
        s.eval()
    assert torch.allclose(run_stages(stages, x)[0], model(x), atol=1e-6)


@pytest.mark.parametrize("layers,match", [
    (["transformer.h.0", "transformer.h.7"], "layers: GPT has no module 'transformer.h.7'"),
    (["transformer.h.0", "transformer.h.0.attn"], "layers: module 'transformer.h.0.attn' runs no op"),
    ([], "layers: must be a non-empty list"),
])
def test_a_granularity_naming_a_missing_module_names_it(layers, match):
    with pytest.raises(UntraceableModelError, match=match) as info:
        layer_names(GPT(), tokens(), layers)
    assert "\n" not in str(info.value)


def test_an_input_longer_than_the_assert_allows_names_the_assert():
    with pytest.raises(UntraceableModelError) as info:
        layer_names(GPT(block_size=8), tokens(t=10))
    message = str(info.value)
    assert "test_profile_capture.py:" in message and "assert t <= self.block_size" in message
    assert "\n" not in message


TASK_FILE = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset
from pipeboard.trainer import Task


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x))
        return x


class Branchy(Net):
    def forward(self, x):
        if x.sum() > 0:
            x = -x
        return super().forward(x)


def _task(model, layers=None):
    return Task(model=model, train_data=TensorDataset(torch.randn(32, 4), torch.randn(32, 4)),
                loss=nn.functional.mse_loss, layers=layers, batch_size=8, loader_workers=0)


def bad_layers():
    return _task(Net(), ["blocks.0", "blocks.5"])


def untraceable():
    return _task(Branchy())
'''


@pytest.mark.parametrize("factory,expected", [
    ("bad_layers", "layers: Net has no module 'blocks.5'"),
    ("untraceable", "cannot capture Branchy with torch.export in module '(the model itself)' (Branchy) at "
                    "user_task.py:"),
])
def test_train_from_the_cli_stops_in_one_line_with_exit_2(tmp_path, factory, expected):
    import subprocess
    import sys

    (tmp_path / "user_task.py").write_text(TASK_FILE)
    out = subprocess.run([sys.executable, "-c", "from pipeboard.app.cli import main; main()", "train", "--model",
                          f"user_task.py:{factory}", "--stages", "2", "--schedule", "1f1b", "--batch-size", "8",
                          "--microbatches", "2", "--steps", "2"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, lines
    assert expected in lines[0]
