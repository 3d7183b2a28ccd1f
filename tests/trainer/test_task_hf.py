"""transformers models split at module boundaries: same logits, gradients and causality as the
model itself, one layer per block, and unsupported models refused by name."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from pipeboard.trainer.partition import layer_names, run_stages, split_model, uniform_stages  # noqa: E402
from pipeboard.trainer.profile.fxgraph import UntraceableModelError, is_leaf, mark_leaf, trace_layers  # noqa: E402
from pipeboard.trainer.runtime.stage import Stage  # noqa: E402
from pipeboard.trainer.task.hf import is_transformers_model, splittable  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, SEQ = 97, 12
SMALL_LM = dict(vocab_size=VOCAB, max_position_embeddings=32, bos_token_id=0, eos_token_id=1, pad_token_id=None)


def gpt2(attn="sdpa"):
    cfg = transformers.GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                  eos_token_id=1, attn_implementation=attn)
    return transformers.GPT2LMHeadModel(cfg)


def llama(attn="sdpa"):
    cfg = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, attn_implementation=attn, **SMALL_LM)
    return transformers.LlamaForCausalLM(cfg)


def mistral(attn="sdpa"):  # a sliding window shorter than the sequence: the sliding mask matters
    cfg = transformers.MistralConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                     num_key_value_heads=2, sliding_window=4, attn_implementation=attn, **SMALL_LM)
    return transformers.MistralForCausalLM(cfg)


def qwen2(attn="sdpa"):  # layer 0 full attention, layer 1 sliding (per-layer masks)
    cfg = transformers.Qwen2Config(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                                   max_window_layers=1, attn_implementation=attn, **SMALL_LM)
    return transformers.Qwen2ForCausalLM(cfg)


def resnet():
    cfg = transformers.ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[8, 16, 32, 64],
                                    embedding_size=8, num_labels=10, num_channels=3)
    return transformers.ResNetForImageClassification(cfg)


LMS = {"gpt2": gpt2, "llama": llama, "mistral": mistral, "qwen2": qwen2}


def ids(batch=2):
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(1))


def pixels(batch=3):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(2))


def build(name, attn="sdpa"):
    torch.manual_seed(0)
    if name == "resnet":
        return resnet().eval(), pixels()
    return LMS[name](attn).eval(), ids()


@pytest.mark.parametrize("name, attn", [(n, a) for n in LMS for a in ("eager", "sdpa")] + [("resnet", "sdpa")])
def test_wrapper_and_its_stages_give_the_models_logits(name, attn):
    model, x = build(name, attn)
    wrapper = splittable(model, strict=True)
    with torch.no_grad():
        ref = model(x).logits
        assert torch.allclose(wrapper(x), ref, atol=1e-5)
        names = layer_names(wrapper, x)
        for k in (2, 4):
            stages = split_model(wrapper, x, uniform_stages(names, k))
            assert len(stages) == k
            assert torch.allclose(run_stages(stages, x)[0], ref, atol=1e-5)
            # only the hidden state crosses a boundary (mask, positions, rotary made per block)
            assert all(len(s.input_names) == 1 for s in stages)


def test_layer_names_one_per_block():
    model, x = build("gpt2")
    assert layer_names(splittable(model), x) == ["input_ids", "embed", "blocks_0", "blocks_1", "blocks_2",
                                                 "blocks_3", "norm", "head"]
    model, x = build("llama")
    assert layer_names(splittable(model), x) == ["input_ids", "embed", "blocks_0", "blocks_1", "blocks_2",
                                                 "blocks_3", "norm", "head"]
    model, x = build("resnet")
    assert layer_names(splittable(model), x) == ["pixel_values", "embed", *[f"blocks_{i}" for i in range(8)],
                                                 "pool", "head"]


def test_parameters_are_shared_not_copied():
    model, _ = build("gpt2")
    wrapper = splittable(model)
    assert {id(p) for p in wrapper.parameters()} == {id(p) for p in model.parameters()}
    # the tied LM head: one Parameter, in two modules
    assert wrapper.head.weight is wrapper.embed.wte.weight is model.transformer.wte.weight


def test_mask_kind_follows_the_config():
    assert [b._mask.__name__ for b in splittable(build("llama")[0]).blocks] == ["create_causal_mask"] * 4
    assert {b._mask.__name__ for b in splittable(build("mistral")[0]).blocks} == {"create_sliding_window_causal_mask"}
    assert [b._mask.__name__ for b in splittable(build("qwen2")[0]).blocks] == [
        "create_causal_mask", "create_sliding_window_causal_mask"]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_split_model_stays_causal(name, attn):
    model, x = build(name, attn)
    wrapper = splittable(model)
    stages = split_model(wrapper, x, uniform_stages(layer_names(wrapper, x), 3))
    changed = x.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % VOCAB
    with torch.no_grad():
        a, b = run_stages(stages, x)[0], run_stages(stages, changed)[0]
    assert torch.equal(a[:, :7], b[:, :7])  # earlier positions do not see later tokens
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def _reference_grads(model, x, loss_fn):
    model.zero_grad(set_to_none=True)
    loss_fn(model(x).logits).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def _loss(logits):
    weights = torch.linspace(-1, 1, logits.numel(), dtype=logits.dtype).view_as(logits)
    return (logits * weights).sum()


@pytest.mark.parametrize("name", ["gpt2", "llama", "resnet"])
def test_stagewise_backward_gives_the_models_gradients(name):
    model, x = build(name)
    model.train()  # dropout is 0; ResNet's BatchNorm uses batch statistics in both passes
    ref = _reference_grads(model, x, _loss)
    wrapper = splittable(model)
    stages = split_model(wrapper, x, uniform_stages(layer_names(wrapper, x), 4))
    # as the pipeline runs it: each stage on detached inputs, backward stage by stage
    inputs, saved = [x], []
    for stage in stages:
        ins = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
        outs = stage(*ins)
        saved.append((ins, outs))
        inputs = outs
    grads = None
    for k in reversed(range(len(stages))):
        ins, outs = saved[k]
        if grads is None:
            _loss(outs[0]).backward()
        else:
            torch.autograd.backward([o for o in outs if o.requires_grad], [g for o, g in zip(outs, grads) if o.requires_grad])
        grads = [t.grad for t in ins]
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, ref[n], atol=1e-6, rtol=1e-4), n


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_runtime_stages_with_split_backward(name):
    """pipeboard.trainer.runtime.stage.Stage on two stages, input gradients then weight gradients (its
    hooks on the Linear/Conv1D modules inside the leaf blocks): the model's gradients, the tied
    GPT-2 embedding's included."""
    model, x = build(name)
    model.train()
    target = torch.randint(0, VOCAB, x.shape, generator=torch.Generator().manual_seed(3))
    ce = lambda logits, t: nn.functional.cross_entropy(logits.reshape(-1, VOCAB), t.reshape(-1))  # noqa: E731
    ref = _reference_grads(model, x, lambda logits: ce(logits, target))
    wrapper = splittable(model)
    mods = split_model(wrapper, x, uniform_stages(layer_names(wrapper, x), 2))
    stages = [Stage(k, m, torch.optim.SGD(m.parameters(), lr=0.0), is_first=k == 0, is_last=k == 1,
                    loss_fn=ce if k == 1 else None, stash=False, loss_scale=1.0) for k, m in enumerate(mods)]
    hidden = stages[0].forward(0, 0, [x], None)
    stages[1].forward(0, 0, list(hidden), target)
    g = stages[1].backward(0, None, weights=False)
    stages[0].backward(0, g, weights=False)
    for s in stages:
        s.backward_weight(0)
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, ref[n], atol=1e-6, rtol=1e-4), n


@pytest.mark.parametrize("name", ["gpt2", "llama", "resnet"])
def test_bf16_autocast(name):
    model, x = build(name)
    wrapper = splittable(model)
    stages = split_model(wrapper, x, uniform_stages(layer_names(wrapper, x), 2))
    with torch.no_grad():
        fp32 = model(x).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ref = model(x).logits
            out = run_stages(stages, x)[0]
    assert torch.allclose(out.float(), ref.float(), atol=1e-5)
    assert torch.allclose(out.float(), fp32, atol=0.05 * fp32.abs().max().item())


def test_unsupported_models():
    torch.manual_seed(0)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32))
    assert is_transformers_model(bert)
    with pytest.raises(ValueError, match="BertForMaskedLM") as info:
        splittable(bert, strict=True)
    assert "\n" not in str(info.value)
    assert splittable(bert) is bert  # not strict: unchanged (fx gives its own error then)
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    assert not is_transformers_model(seq)
    assert splittable(seq, strict=True) is seq
    assert layer_names(seq, torch.randn(2, 4))[1:] == ["_0", "_1"]
    # a GPT-2 with a sequence-classification head is not a causal LM the wrapper knows
    cls = transformers.GPT2ForSequenceClassification(gpt2().config)
    with pytest.raises(ValueError, match="GPT2ForSequenceClassification"):
        splittable(cls, strict=True)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # fx cannot trace this, but as a leaf it is never traced inside
            return self.lin(x)
        return -self.lin(x)


class AlwaysLeaf(Branchy):
    _pipeboard_leaf = True


class Outer(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.out = inner, nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.inner(x))


def test_leaf_modules_in_fxgraph():
    with pytest.raises(UntraceableModelError, match="x.sum"):
        trace_layers(Outer(Branchy()), torch.randn(3, 4))
    for inner in (mark_leaf(Branchy()), AlwaysLeaf()):
        assert is_leaf(inner)
        model = Outer(inner)
        lg = trace_layers(model, torch.randn(3, 4))
        assert lg.names() == ["x", "inner", "out"]
        x = torch.randn(3, 4)
        assert torch.equal(run_stages(split_model(model, x, [["inner"], ["out"]]), x)[0], model(x))
    assert not is_leaf(Branchy())


def test_import_is_cheap():
    code = "import sys, pipeboard.trainer.task.hf; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
