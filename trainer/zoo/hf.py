"""Zoo tasks of Hugging Face transformers models, built from a config with random weights.

Each is a task factory like a user's: the model comes from ``transformers`` (nothing is
downloaded), the data from local files through ``datasets`` (``pipeboard.trainer.task.datasets``), and
the model sits inside a module of the task's own that returns its logits, as a user's does
(``return self.hf(x).logits``); it is captured whole, its layers named by module path
(``hf.transformer.h.0``). ``--data`` points them at a
user's own files; without it they train on data the installed packages ship: the Python
standard-library sources of ``transformer-text`` for the language models, scikit-learn's digits
written as a folder of PNG files for the image classifier.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import nn

from pipeboard.trainer.task import Task
from pipeboard.trainer.task.metrics import token_cross_entropy


def _text(data: str | None, seq_len: int):
    from pipeboard.trainer.task.datasets import text_windows, text_windows_of

    if data is not None:
        return text_windows(data, seq_len)
    from pipeboard.trainer.zoo.text import corpus_bytes

    return text_windows_of(corpus_bytes().decode("utf-8"), seq_len)


class Logits(nn.Module):
    """A transformers model whose forward returns its ``logits`` (the tensor the losses and
    metrics take), the way a user wraps one."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, x):
        return self.hf(x).logits


def _lm_task(name: str, model: nn.Module, train, val, description: str) -> Task:
    return Task(model=model, train_data=train, val_data=val, loss=token_cross_entropy, metric="perplexity",
                target=TARGET_PERPLEXITY, optimizer="adamw", lr=LM_LR, batch_size=32, loader_workers=0,
                name=name, description=description)


def gpt2_text(data: str | None = None, layers: int = 4, dim: int = 64, heads: int = 4, seq_len: int = 64) -> Task:
    """A GPT-2 causal LM (tied embedding and head) on UTF-8 bytes of a text, parquet or JSON file."""
    from transformers import GPT2Config, GPT2LMHeadModel

    train, val = _text(data, seq_len)
    config = GPT2Config(vocab_size=train.vocab_size, n_positions=seq_len, n_embd=dim, n_layer=layers, n_head=heads,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=None, eos_token_id=None)  # GPT-2's 50256 is no byte
    config.use_cache = False  # a training step keeps no key/value cache
    return _lm_task("gpt2-text", Logits(GPT2LMHeadModel(config)), train, val,
                    "transformers GPT-2 causal LM (random init) on a local text/parquet/JSON file (--data)")


def llama_text(data: str | None = None, layers: int = 4, dim: int = 64, heads: int = 4, seq_len: int = 64) -> Task:
    """A Llama causal LM (RMSNorm, rotary positions, SwiGLU, grouped-query attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    train, val = _text(data, seq_len)
    config = LlamaConfig(vocab_size=train.vocab_size, hidden_size=dim, intermediate_size=int(dim * 8 / 3) // 8 * 8,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         max_position_embeddings=seq_len, attention_dropout=0.0)
    config.use_cache = False
    return _lm_task("llama-text", Logits(LlamaForCausalLM(config)), train, val,
                    "transformers Llama causal LM (random init) on a local text/parquet/JSON file (--data)")


class Masked(torch.utils.data.Dataset):
    """A text-window data set as masked language modelling: each window's input with a share of
    its tokens replaced by a mask token (``vocab_size``, one past the text's), the target the
    window itself. The mask of a window is fixed by its index, so every epoch sees the same."""

    def __init__(self, windows, share: float = 0.15):
        self.windows, self.share, self.vocab_size = windows, share, windows.vocab_size + 1

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int):
        x, _ = self.windows[index]
        hide = torch.rand(x.shape, generator=torch.Generator().manual_seed(int(index))) < self.share
        return x.masked_fill(hide, self.vocab_size - 1), x


def bert_text(data: str | None = None, layers: int = 4, dim: int = 64, heads: int = 4, seq_len: int = 64) -> Task:
    """A BERT encoder (bidirectional attention, post-norm, learned positions) with its masked-LM
    head, on UTF-8 bytes of a text, parquet or JSON file, 15% of each window's bytes masked."""
    from transformers import BertConfig, BertForMaskedLM

    train, val = _text(data, seq_len)
    train, val = Masked(train), (Masked(val) if val is not None else None)
    config = BertConfig(vocab_size=train.vocab_size, hidden_size=dim, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * dim, max_position_embeddings=seq_len,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, type_vocab_size=1)
    return _lm_task("bert-text", Logits(BertForMaskedLM(config)), train, val,
                    "transformers BERT encoder, masked LM (random init) on a local text/parquet/JSON file (--data)")


def resnet18_images(data: str | None = None, width: int = 16, size: int = 32) -> Task:
    """A ResNet-18 layout (basic blocks, depths 2-2-2-2) on an ``imagefolder`` tree of images."""
    from transformers import ResNetConfig, ResNetForImageClassification

    from pipeboard.trainer.task.datasets import image_folder

    if data is None:
        from pipeboard.trainer.zoo.pngdigits import write_digits_pngs

        data = str(write_digits_pngs(Path(tempfile.gettempdir()) / f"pipeboard-digits-png-{size}", size=size))
    train, val = image_folder(data, size=size)
    channels = int(train[0][0].shape[0])
    config = ResNetConfig(num_channels=channels, embedding_size=width, hidden_sizes=[width * 2**i for i in range(4)],
                          depths=[2, 2, 2, 2], layer_type="basic", num_labels=len(train.classes),
                          downsample_in_first_stage=False)
    return Task(model=Logits(ResNetForImageClassification(config)), train_data=train, val_data=val,
                loss=nn.functional.cross_entropy, metric="accuracy", target=0.9, optimizer="adam", lr=1e-3,
                batch_size=64, loader_workers=1, name="resnet18-images",
                description="transformers ResNet-18 layout (random init) on an imagefolder tree of PNG/JPEG files "
                            "(--data; default: scikit-learn's digits as PNG files)")


TARGET_PERPLEXITY = 6.0
# AdamW's rate for the language models: at a higher one bf16 training drifted away from fp32's
# (docs/runtime.md, "Mixed precision", has the measurements).
LM_LR = 1e-3
