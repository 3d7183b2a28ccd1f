"""Small random transformers models for the capture coverage bench, as task factories.

``make_task(arch=..., wrapped=...)`` builds one architecture from a small config (random init,
every dropout 0, no key/value cache) on synthetic data, either as the model itself (the loss then
gets its ``ModelOutput``) or inside a user's module that returns ``.logits``. The runtime's
workers import this file by path (``bench/capture_models.py:make_task``), so it holds only
factories: the bench itself is ``capture_coverage.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from pipeboard.trainer import Task

VOCAB, SEQ, CLASSES, IMAGE = 64, 8, 10, 32
LM = dict(vocab_size=VOCAB, max_position_embeddings=32, use_cache=False, pad_token_id=0, bos_token_id=1,
          eos_token_id=2)
DECODER = dict(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)


def _configs(t):
    """arch -> (model class, config, kind): kind is "lm" (tokens in, a token out per position),
    "seq2seq" ((input_ids, decoder_input_ids) in) or "image" (pixels in, a class out)."""
    return {
        "gpt2": (t.GPT2LMHeadModel, t.GPT2Config(n_layer=4, n_embd=32, n_head=4, n_positions=32, vocab_size=VOCAB,
                                                 use_cache=False, bos_token_id=1, eos_token_id=2), "lm"),
        "llama": (t.LlamaForCausalLM, t.LlamaConfig(**DECODER, **LM), "lm"),
        "mistral": (t.MistralForCausalLM, t.MistralConfig(**DECODER, sliding_window=4, **LM), "lm"),
        "qwen2": (t.Qwen2ForCausalLM, t.Qwen2Config(**DECODER, **LM), "lm"),
        "gemma": (t.GemmaForCausalLM, t.GemmaConfig(**DECODER, head_dim=8, **LM), "lm"),
        "phi3": (t.Phi3ForCausalLM, t.Phi3Config(**DECODER, **LM), "lm"),
        "mixtral": (t.MixtralForCausalLM, t.MixtralConfig(**DECODER, num_local_experts=4, num_experts_per_tok=2,
                                                          **LM), "lm"),
        "bert": (t.BertForMaskedLM, t.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4,
                                                 num_attention_heads=4, intermediate_size=64,
                                                 max_position_embeddings=32), "lm"),
        "roberta": (t.RobertaForMaskedLM, t.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4,
                                                          num_attention_heads=4, intermediate_size=64,
                                                          max_position_embeddings=40, pad_token_id=0), "lm"),
        "t5": (t.T5ForConditionalGeneration, t.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                        num_decoder_layers=2, num_heads=4, use_cache=False,
                                                        decoder_start_token_id=0), "seq2seq"),
        "bart": (t.BartForConditionalGeneration, t.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2,
                                                              decoder_layers=2, encoder_attention_heads=4,
                                                              decoder_attention_heads=4, encoder_ffn_dim=64,
                                                              decoder_ffn_dim=64, max_position_embeddings=32,
                                                              use_cache=False), "seq2seq"),
        "vit": (t.ViTForImageClassification, t.ViTConfig(image_size=IMAGE, patch_size=4, num_channels=3,
                                                         hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                                         intermediate_size=64, num_labels=CLASSES), "image"),
        "convnext": (t.ConvNextForImageClassification, t.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16, 32, 64],
                                                                        depths=[1, 1, 2, 1], num_labels=CLASSES),
                     "image"),
        "resnet": (t.ResNetForImageClassification, t.ResNetConfig(num_channels=3, embedding_size=8,
                                                                  hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                                                                  layer_type="basic", num_labels=CLASSES), "image"),
    }


ARCHS = ("gpt2", "llama", "mistral", "qwen2", "gemma", "phi3", "mixtral", "bert", "roberta", "t5", "bart", "vit",
         "convnext", "resnet")


class UsersNet(nn.Module):
    """A user's module around a transformers model: the usual ``return self.hf(...).logits``."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, *inputs):
        if len(inputs) == 2:  # an encoder-decoder: (input_ids, decoder_input_ids)
            return self.hf(input_ids=inputs[0], decoder_input_ids=inputs[1]).logits
        return self.hf(inputs[0]).logits


class Seq2Seq(nn.Module):
    """An encoder-decoder as it comes takes its decoder ids by keyword: the smallest module that
    hands them on positionally, returning the model's own ModelOutput."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, input_ids, decoder_input_ids):
        return self.hf(input_ids=input_ids, decoder_input_ids=decoder_input_ids)


def _no_dropout(config) -> None:
    for name, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name or "drop_path" in name):
            setattr(config, name, 0.0)


def _logits_loss(out, target):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def _output_loss(out, target):  # the model as it comes: the loss reads its ModelOutput
    return _logits_loss(out.logits, target)


def _data(kind: str, samples: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    if kind == "image":
        y = torch.randint(0, CLASSES, (samples,), generator=g)
        # a class-dependent mean, so the loss has something to learn
        x = torch.randn(samples, 3, IMAGE, IMAGE, generator=g) + y.view(-1, 1, 1, 1) / CLASSES
        return TensorDataset(x, y)
    x = torch.randint(3, VOCAB, (samples, SEQ), generator=g)
    y = (x * 5 + 1) % VOCAB  # a per-token map: learnable by every architecture
    if kind == "seq2seq":
        dec = torch.cat([torch.zeros(samples, 1, dtype=torch.long), y[:, :-1]], dim=1)
        return TensorDataset(x, dec, y)
    return TensorDataset(x, y)


class _Pairs(torch.utils.data.Dataset):
    """(input, target) items, the input a tuple for an encoder-decoder."""

    def __init__(self, data: TensorDataset):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        item = self.data[i]
        return (tuple(item[:-1]) if len(item) == 3 else item[0]), item[-1]


def make_task(arch: str = "gpt2", wrapped: bool = False, samples: int = 64, tied: bool = True) -> Task:
    """``tied=False`` unties the embedding and the head (pipedream updates each stage on its own
    clock, so it refuses a parameter shared across workers)."""
    import transformers

    cls, config, kind = _configs(transformers)[arch]
    _no_dropout(config)
    if not tied:
        config.tie_word_embeddings = False
    hf = cls(config)
    if wrapped:
        model, loss = UsersNet(hf), _logits_loss
    else:
        model, loss = (Seq2Seq(hf) if kind == "seq2seq" else hf), _output_loss
    return Task(model=model, train_data=_Pairs(_data(kind, samples, 0)), loss=loss, optimizer="sgd", lr=0.05,
                batch_size=8, loader_workers=0, name=f"{arch}{' wrapped' if wrapped else ''}")
