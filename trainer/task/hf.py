"""Hugging Face transformers models, made splittable into pipeline stages.

fx cannot trace a whole transformers model (its forwards branch in Python on arguments, caches
and configs; transformers 5 ships no fx tracer of its own). So, as torchtitan does, we split at
module boundaries: :func:`splittable` returns a thin wrapper whose ``forward`` is a straight-line
chain of the model's own submodules (embeddings, each decoder block or residual block, final
norm, head), each marked as an fx leaf (:func:`pipeboard.trainer.profile.fxgraph.mark_leaf`), so each is one
layer of the profile and a stage boundary can fall between any two of them.

Why not ``torch.export``: it lowers to ATen ops, hundreds of nodes per decoder block, so the
profile would be op-level layers where the planner works at block granularity, and it wants
static shapes and strict tracing. One layer per block is the granularity the planner needs.

The wrapper holds references to the model's submodules: parameters (a tied embedding and LM head
included: one Parameter in two modules) are shared, not copied, and its logits equal
``model(x).logits``. Each block layer rebuilds what the model's forward would hand it (position
ids ``arange(seq_len)``, the causal mask from transformers' own mask function for the config's
attention implementation, Llama's rotary cos/sin): those are cheap next to the block, and so the
only tensor crossing a stage boundary is the hidden state (a mask is ``seq_len**2`` per sample,
and cos/sin would be a tuple-valued layer read by every later stage).

transformers is imported only inside functions: importing this module stays cheap.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from pipeboard.trainer.profile.fxgraph import mark_leaf

# Families whose base model is laid out as Llama's (model.embed_tokens, .layers, .norm,
# .rotary_emb; lm_head) *and* whose forwards do nothing else between those modules (checked in
# transformers 5.24). Gemma (scaled embeddings), Cohere (logit scale) and others share the layout
# but not the arithmetic, so a layout alone is not enough to accept a model_type.
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED = "GPT-2 (GPT2LMHeadModel), Llama-layout causal LMs (" + ", ".join(LLAMA_LIKE) + \
    "; *ForCausalLM) and ResNet (ResNetForImageClassification)"


def is_transformers_model(model: nn.Module) -> bool:
    """Whether ``model`` is a transformers ``PreTrainedModel`` (imports nothing: if transformers'
    modeling code is not loaded, no such model can exist)."""
    modeling = sys.modules.get("transformers.modeling_utils")
    return modeling is not None and isinstance(model, modeling.PreTrainedModel)


def _has(obj, *paths: str) -> bool:
    for path in paths:
        o = obj
        for part in path.split("."):
            o = getattr(o, part, None)
            if o is None:
                return False
    return True


def family(model: nn.Module) -> str | None:
    """``"gpt2"``, ``"llama"`` (Llama layout) or ``"resnet"`` for a supported transformers model,
    else None. Decided by ``config.model_type`` and the submodules the wrapper will call."""
    if not is_transformers_model(model):
        return None
    kind = getattr(model.config, "model_type", None)
    if kind == "gpt2" and _has(model, "transformer.wte", "transformer.wpe", "transformer.h",
                               "transformer.ln_f", "lm_head"):
        return "gpt2"
    if kind in LLAMA_LIKE and _has(model, "model.embed_tokens", "model.layers", "model.norm",
                                   "model.rotary_emb", "lm_head"):
        return "llama"
    if kind == "resnet" and _has(model, "resnet.embedder", "resnet.encoder.stages", "resnet.pooler",
                                 "classifier"):
        return "resnet"
    return None


def splittable(model: nn.Module, strict: bool = False) -> nn.Module:
    """A module-boundary wrapper of a supported transformers model (see the module docstring);
    any other module is returned unchanged (fx traces it as it is, or says which op it cannot).

    ``strict``: a transformers model of an unsupported family raises ValueError naming its class
    (without: it is returned unchanged and fails in fx with fx's own message)."""
    kind = family(model)
    if kind is None:
        if strict and is_transformers_model(model):
            raise ValueError(
                f"{type(model).__name__} (model_type {getattr(model.config, 'model_type', None)!r}) is "
                f"not a transformers family pipeboard can split; supported: {SUPPORTED}")
        return model
    wrapper = {"gpt2": _gpt2, "llama": _llama, "resnet": _resnet}[kind](model)
    wrapper.config = model.config
    wrapper.training = model.training  # this module's own flag; the shared submodules keep theirs
    return wrapper


def _positions(x: torch.Tensor) -> torch.Tensor:
    """Position ids ``[[0, ..., seq_len - 1]]`` of a (batch, seq, ...) tensor, as HF's forward
    makes them when no cache and no position_ids are given."""
    return torch.arange(x.shape[1], device=x.device).unsqueeze(0)


class Chain(nn.Module):
    """``embed``, every module of ``blocks``, then the ``tail`` modules in order (e.g. ``norm``,
    ``head``): each one fx leaf, so one layer, named ``embed``, ``blocks_0``, ..., then the tail's
    names."""

    def __init__(self, embed: nn.Module, blocks: list[nn.Module], tail: dict[str, nn.Module]):
        super().__init__()
        self.embed = mark_leaf(embed)
        self.blocks = nn.ModuleList([mark_leaf(b) for b in blocks])
        for name, module in tail.items():
            self.add_module(name, mark_leaf(module))
        self.tail = list(tail)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        for name in self.tail:
            h = getattr(self, name)(h)
        return h


class CausalLM(Chain):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits (batch, seq, vocab) of ``input_ids`` (batch, seq)."""
        return self._run(input_ids)


class ImageClassifier(Chain):
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Logits (batch, num_labels) of ``pixel_values`` (batch, channels, height, width)."""
        return self._run(pixel_values)


class GPT2Embeddings(nn.Module):
    """GPT-2's token plus learned position embeddings and embedding dropout, as GPT2Model does
    them: one layer, the positions made inside from the ids' shape (an ``arange`` in the
    wrapper's own forward would be a tensor-valued fx node, i.e. a layer of its own)."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module):
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.wte(input_ids) + self.wpe(_positions(input_ids)))


class DecoderBlock(nn.Module):
    """One transformers decoder block as one layer, hidden states in and out.

    It makes the block's other arguments itself, exactly as the model's forward does without a
    cache or padding mask: position ids, the mask from transformers' own ``create_causal_mask``
    (``create_sliding_window_causal_mask`` for a sliding-window layer) for the config's current
    attention implementation, and for rotary models the (cos, sin) of ``rotary_emb``. Causality
    therefore matches the model whatever ``config._attn_implementation`` is: ``eager`` gets the
    materialised additive mask (eager attention adds whatever mask it is given, and would not be
    causal given None), ``sdpa`` gets None and infers ``is_causal`` as the model does.
    """

    def __init__(self, block: nn.Module, config, layer_idx: int, rotary: nn.Module | None = None):
        super().__init__()
        from transformers import masking_utils

        self.block = block
        self.rotary = rotary  # shared by every block; it has no parameters
        self.config = config
        self.layer_idx = layer_idx
        types = getattr(config, "layer_types", None)
        if types is not None:  # Qwen2/3: per layer, as their forward picks the mask per layer
            sliding = types[layer_idx] == "sliding_attention"
        else:  # Mistral: every layer, when a window is set
            sliding = getattr(config, "sliding_window", None) is not None
        self._mask = (masking_utils.create_sliding_window_causal_mask if sliding
                      else masking_utils.create_causal_mask)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        pos = _positions(hidden_states)
        mask = self._mask(config=self.config, inputs_embeds=hidden_states, attention_mask=None,
                          cache=None, position_ids=pos)
        if self.rotary is None:  # GPT-2: (hidden, cache, mask, ...) as GPT2Model calls it
            out = self.block(hidden_states, None, mask, position_ids=pos, use_cache=False)
        else:
            out = self.block(hidden_states, attention_mask=mask, position_ids=pos, cache=None, use_cache=False,
                             position_embeddings=self.rotary(hidden_states, position_ids=pos))
        return out[0] if isinstance(out, tuple) else out  # some versions' blocks return a tuple

    def extra_repr(self) -> str:
        return f"layer_idx={self.layer_idx}, mask={self._mask.__name__}"


def _gpt2(model: nn.Module) -> CausalLM:
    t = model.transformer
    blocks = [DecoderBlock(b, model.config, i) for i, b in enumerate(t.h)]
    return CausalLM(GPT2Embeddings(t.wte, t.wpe, t.drop), blocks, {"norm": t.ln_f, "head": model.lm_head})


def _llama(model: nn.Module) -> CausalLM:
    m = model.model
    layers = list(m.layers)[: model.config.num_hidden_layers]  # as LlamaModel.forward slices them
    blocks = [DecoderBlock(b, model.config, i, m.rotary_emb) for i, b in enumerate(layers)]
    return CausalLM(m.embed_tokens, blocks, {"norm": m.norm, "head": model.lm_head})


def _resnet(model: nn.Module) -> ImageClassifier:
    r = model.resnet
    # ResNetModel: embedder, then each stage's layers in order (ResNetStage and ResNetEncoder only
    # loop over them), then the pooler; the classifier (Flatten, Linear) is one layer.
    blocks = [layer for stage in r.encoder.stages for layer in stage.layers]
    return ImageClassifier(r.embedder, blocks, {"pool": r.pooler, "head": model.classifier})
