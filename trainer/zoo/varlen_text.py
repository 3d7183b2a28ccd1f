"""Text tasks whose batches vary in length: token sequences of lengths drawn from ``lo`` to
``hi`` per sample, padded per batch to the batch's own longest (``padding="batch"``) or all to
``hi`` (``padding="max"``), through a transformers causal LM (GPT-2, next-token loss on the real
tokens) or an encoder (BERT classifying the sequence). Not zoo entries (random tokens have no
accuracy to reach): factories to name by path, ``pipeboard.trainer.zoo.varlen_text:causal_lm``,
for trying and measuring variable shapes (docs/variable-shapes.md)."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from pipeboard.trainer.task import Task

VOCAB = 97
PAD = 0
IGNORE = -100


class Lengths(Dataset):
    """``samples`` random token sequences (ids 1..VOCAB-1) of lengths in ``lo..hi``, with a class;
    lengths uniform, or with ``skew`` most of them short (``lo + (hi - lo) * u**3``, mean a quarter of
    the way), as typical text is."""

    def __init__(self, samples: int, lo: int, hi: int, seed: int = 0, skew: bool = False):
        g = torch.Generator().manual_seed(seed)
        if skew:
            lengths = (lo + (hi - lo) * torch.rand(samples, generator=g) ** 3).round().long()
        else:
            lengths = torch.randint(lo, hi + 1, (samples,), generator=g)
        self.items = [torch.randint(1, VOCAB, (int(n),), generator=g) for n in lengths]
        self.labels = torch.randint(0, 2, (samples,), generator=g)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i], self.labels[i]


def pad(items, to: int | None = None, lm: bool = True):
    """((token ids, attention mask), target) padded to the batch's longest sequence (or ``to``);
    the LM's target is the ids with IGNORE at the padding, the encoder's the class."""
    longest = to or max(len(ids) for ids, _ in items)
    ids = torch.full((len(items), longest), PAD, dtype=torch.long)
    mask = torch.zeros((len(items), longest), dtype=torch.long)
    for k, (seq, _) in enumerate(items):
        ids[k, :len(seq)] = seq
        mask[k, :len(seq)] = 1
    target = ids.masked_fill(mask == 0, IGNORE) if lm else torch.stack([label for _, label in items])
    return (ids, mask), target


class Wrapped(nn.Module):
    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, input_ids, attention_mask):
        return self.hf(input_ids=input_ids, attention_mask=attention_mask).logits


def next_token_loss(logits, target):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1),
                           ignore_index=IGNORE)


def class_loss(logits, target):
    return F.cross_entropy(logits, target)


def _task(model, loss, lm, lo, hi, samples, padding, declare, batch_size, skew):
    collate = partial(pad, to=hi if padding == "max" else None, lm=lm)
    return Task(model=model, train_data=Lengths(samples, lo, hi, skew=skew), loss=loss, collate_fn=collate, optimizer="sgd",
                lr=0.1, batch_size=batch_size, loader_workers=0, dynamic_dims={1: hi} if declare else None)


def causal_lm(lo: int = 4, hi: int = 24, samples: int = 64, layers: int = 2, dim: int = 32, padding: str = "batch",
              declare: bool = True, batch_size: int = 8, skew: bool = False) -> Task:
    import transformers

    cfg = transformers.GPT2Config(n_layer=layers, n_embd=dim, n_head=2, vocab_size=VOCAB, n_positions=hi,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=1,
                                  attn_implementation="sdpa", use_cache=False,
                                  tie_word_embeddings=False)  # pipedream refuses a tie across workers
    return _task(Wrapped(transformers.GPT2LMHeadModel(cfg)), next_token_loss, True, lo, hi, samples, padding,
                 declare, batch_size, skew)


def encoder(lo: int = 4, hi: int = 24, samples: int = 64, layers: int = 2, dim: int = 32, padding: str = "batch",
            declare: bool = True, batch_size: int = 8, skew: bool = False) -> Task:
    import transformers

    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=dim, num_hidden_layers=layers, num_attention_heads=2,
                                  intermediate_size=2 * dim, max_position_embeddings=hi, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, num_labels=2, attn_implementation="sdpa")
    return _task(Wrapped(transformers.BertForSequenceClassification(cfg)), class_loss, False, lo, hi, samples,
                 padding, declare, batch_size, skew)
