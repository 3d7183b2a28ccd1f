"""A small byte-level Transformer language model on Python's own standard-library sources.

The corpus is a fixed list of stdlib modules, read from the running interpreter's installation
(nothing is downloaded). It is cut into windows of ``seq_len + 1`` bytes; the target is the input
shifted by one. Every tenth window is held out for validation, so the split is fixed.
"""

from __future__ import annotations

import sysconfig
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from torch.utils.data import TensorDataset

from pipeboard.trainer.task import Task
from pipeboard.trainer.task.metrics import token_cross_entropy

CORPUS_FILES = (
    "textwrap.py", "string.py", "heapq.py", "bisect.py", "fnmatch.py", "glob.py", "shlex.py",
    "calendar.py", "fractions.py", "copy.py", "random.py", "functools.py",
)
VOCAB = 256  # bytes
VAL_EVERY = 10


@lru_cache(maxsize=1)
def corpus_bytes() -> bytes:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    missing = [f for f in CORPUS_FILES if not (stdlib / f).is_file()]
    if missing:
        raise FileNotFoundError(f"transformer-text corpus: {missing} not found under {stdlib}")
    return b"\n".join((stdlib / f).read_bytes() for f in CORPUS_FILES)


class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention then an MLP, each with a residual add."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        b, n, d = t.shape
        return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x):
        h = self.ln1(x)
        q, k, v = self._heads(self.q(h)), self._heads(self.k(h)), self._heads(self.v(h))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        b, _, n, _ = a.shape
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, -1))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, dim: int = 128, layers: int = 2, heads: int = 4, seq_len: int = 64):
        super().__init__()
        if dim % heads:
            raise ValueError(f"model arg 'dim' ({dim}) must be a multiple of 'heads' ({heads})")
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        return self.head(self.ln(self.blocks(x)))


def _windows(seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    data = torch.frombuffer(bytearray(corpus_bytes()), dtype=torch.uint8).long()
    n = len(data) // (seq_len + 1)
    win = data[: n * (seq_len + 1)].view(n, seq_len + 1)
    is_val = torch.arange(n) % VAL_EVERY == VAL_EVERY - 1
    train, val = win[~is_val], win[is_val]
    return train[:, :-1].contiguous(), train[:, 1:].contiguous(), val[:, :-1].contiguous(), val[:, 1:].contiguous()


def transformer_text(dim: int = 128, layers: int = 2, heads: int = 4, seq_len: int = 64) -> Task:
    train_x, train_y, val_x, val_y = _windows(seq_len)
    return Task(
        model=TinyLM(dim, layers, heads, seq_len),
        train_data=TensorDataset(train_x, train_y), val_data=TensorDataset(val_x, val_y),
        loss=token_cross_entropy, metric="perplexity", target=TARGET_PERPLEXITY, optimizer="adam", lr=3e-3,
        batch_size=32, loader_workers=0, name="transformer-text",
        description="byte-level Transformer LM on Python standard-library sources",
    )


TARGET_PERPLEXITY = 6.0
