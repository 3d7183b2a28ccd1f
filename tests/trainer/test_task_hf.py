"""transformers models as they come, and inside a user's module: captured whole with torch.export,
split at module-path layers, and each split gives the model's own outputs and gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from pipeboard.trainer.partition import layer_names, run_stages, split_model, uniform_stages  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, SEQ = 97, 12
SMALL_LM = dict(vocab_size=VOCAB, max_position_embeddings=32, bos_token_id=0, eos_token_id=1, pad_token_id=None,
                use_cache=False)


def gpt2(attn="sdpa"):
    cfg = transformers.GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                  eos_token_id=1, attn_implementation=attn, use_cache=False)
    return transformers.GPT2LMHeadModel(cfg)


def llama(attn="sdpa"):
    cfg = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, attn_implementation=attn, **SMALL_LM)
    return transformers.LlamaForCausalLM(cfg)


def mistral(attn="sdpa"):  # a sliding window shorter than the sequence: the sliding mask matters
    cfg = transformers.MistralConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                     num_key_value_heads=2, sliding_window=4, attn_implementation=attn, **SMALL_LM)
    return transformers.MistralForCausalLM(cfg)


def bert(attn="sdpa"):  # an encoder (no causal mask) the fx-era hand-built families never took
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, attn_implementation=attn)
    return transformers.BertForMaskedLM(cfg)


def resnet():
    cfg = transformers.ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[8, 16, 32, 64],
                                    embedding_size=8, num_labels=10, num_channels=3)
    return transformers.ResNetForImageClassification(cfg)


LMS = {"gpt2": gpt2, "llama": llama, "mistral": mistral, "bert": bert}


class UsersNet(nn.Module):
    """The usual user's wrapper: ``return self.hf(x).logits``."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, x):
        return self.hf(x).logits


def ids(batch=2):
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(1))


def pixels(batch=3):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(2))


def build(name, attn="sdpa", wrapped=True):
    torch.manual_seed(0)
    model, x = (resnet(), pixels()) if name == "resnet" else (LMS[name](attn), ids())
    return (UsersNet(model) if wrapped else model).eval(), x


@pytest.mark.parametrize("name, attn", [(n, a) for n in LMS for a in ("eager", "sdpa")] + [("resnet", "sdpa")])
def test_every_uniform_split_of_the_wrapped_model_gives_its_logits(name, attn):
    model, x = build(name, attn)
    names = layer_names(model, x)
    expected = model(x)
    for k in (2, 3):
        stages = split_model(model, x, uniform_stages(names, k))
        for s in stages:
            s.eval()
        (out,) = run_stages(stages, x)
        assert torch.allclose(out, expected, atol=1e-6), (name, attn, k)


def test_layer_names_are_module_paths_of_blocks_and_their_neighbours():
    model, x = build("gpt2")
    assert layer_names(model, x) == ["x", "hf.transformer.wte", "hf.transformer.wpe", "hf.transformer.drop",
                                     *[f"hf.transformer.h.{i}" for i in range(4)], "hf.transformer.ln_f",
                                     "hf.lm_head"]
    model, x = build("llama", wrapped=False)
    names = layer_names(model, x)
    assert names[:3] == ["input_ids", "model.embed_tokens", "model.rotary_emb"]
    assert [n for n in names if n.startswith("model.layers.")] == [f"model.layers.{i}" for i in range(4)]
    model, x = build("resnet")  # the outermost repeated stack: the 4 stages
    names = layer_names(model, x)
    assert names == ["x", "hf.resnet.embedder", *[f"hf.resnet.encoder.stages.{i}" for i in range(4)],
                     "hf.resnet.pooler", "hf.classifier"]


def test_the_bare_model_returns_its_model_output_and_the_last_stage_rebuilds_it():
    model, x = build("gpt2", wrapped=False)
    expected = model(x)
    names = layer_names(model, x)
    stages = split_model(model, x, uniform_stages(names, 2))
    for s in stages:
        s.eval()
    out = stages[-1].structure(run_stages(stages, x))
    assert type(out) is type(expected) and torch.allclose(out.logits, expected.logits, atol=1e-6)


def test_parameters_are_the_models_own_and_the_tie_stays_one_object():
    model, x = build("gpt2")
    stages = split_model(model, x, uniform_stages(layer_names(model, x), 2))
    own = {id(p) for p in model.parameters()}
    assert all(id(p) in own for s in stages for p in s.parameters())
    wte = model.hf.transformer.wte.weight
    assert any(p is wte for p in stages[0].parameters()) and any(p is wte for p in stages[1].parameters())


@pytest.mark.parametrize("name", ["gpt2", "llama", "resnet"])
def test_stagewise_backward_gives_the_models_gradients(name):
    model, x = build(name)
    model.train()
    stages = split_model(model, x, uniform_stages(layer_names(model, x), 3))
    model.zero_grad()
    model(x).float().square().mean().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    inputs, outputs, values = [], [], tuple([x])
    for st in stages:
        ins = tuple(v.detach().requires_grad_(v.is_floating_point()) for v in values)
        outputs.append(st(*ins))
        inputs.append(ins)
        values = outputs[-1]
    outputs[-1][0].float().square().mean().backward()
    for k in range(len(stages) - 2, -1, -1):
        sent = [(o, t.grad) for o, t in zip(outputs[k], inputs[k + 1]) if t.grad is not None and o.requires_grad]
        torch.autograd.backward([o for o, _ in sent], [g for _, g in sent])
    for n, p in model.named_parameters():
        if n in expected:
            assert torch.allclose(p.grad, expected[n], rtol=1e-4, atol=1e-6), n


def test_named_granularity_and_a_missing_module():
    from pipeboard.trainer.profile.capture import UntraceableModelError

    model, x = build("llama")
    coarse = ["hf.model.embed_tokens", "hf.model.layers.0", "hf.model.layers.1", "hf.model.layers.2",
              "hf.model.layers.3", "hf.model.norm", "hf.lm_head"]
    names = layer_names(model, x, coarse)
    # the rotary embedding, in no listed module, runs in the layer of its first reader
    assert names == ["x", *coarse]
    stages = split_model(model, x, uniform_stages(names, 2), coarse)
    (out,) = run_stages(stages, x)
    assert torch.allclose(out, model(x), atol=1e-6)
    with pytest.raises(UntraceableModelError, match="layers: UsersNet has no module 'hf.model.layers.9'"):
        layer_names(model, x, coarse + ["hf.model.layers.9"])
