"""A transformers GPT-2 inside a module of my own, trained as it comes.

My module calls the Hugging Face model and returns its logits, the usual
`return self.hf(x).logits`; pipeboard captures the whole of it with torch.export and splits it
between GPT-2's blocks (layers named `hf.transformer.h.0`, ...). Data: one sample per line of a
text file of token ids, the model learns to predict each next token.
"""
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from pipeboard.trainer import Task

VOCAB = 32


class TokenLines(Dataset):
    """Lines of space-separated token ids, all of one length: input tokens[:-1], target tokens[1:]."""

    def __init__(self, path):
        with open(path) as f:
            self.rows = [torch.tensor([int(t) for t in line.split()]) for line in f if line.strip()]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        return row[:-1], row[1:]


class MyLM(nn.Module):
    def __init__(self, layers=4, width=64):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=width, n_layer=layers, n_head=4,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                            bos_token_id=0, eos_token_id=1)
        self.hf = GPT2LMHeadModel(config)

    def forward(self, x):
        return self.hf(x).logits


def next_token_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def make_task(data, layers: int = 4, width: int = 64):
    return Task(model=MyLM(layers, width), train_data=TokenLines(data), loss=next_token_loss,
                optimizer="adamw", lr=3e-3, batch_size=32, loader_workers=0)
