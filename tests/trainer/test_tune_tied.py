"""Tied weights: the profile names the layers that share a parameter, and the tuner offers the
asynchronous schedule (pipedream, which the runtime refuses for a tie across workers) only on
splits that keep each such group on one stage, saying why for the others."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeboard.trainer.profile.profiler import profile_model
from pipeboard.trainer.runtime.run_config import ConfigError, RunConfig
from pipeboard.trainer.runtime.layout import resolve
from pipeboard.trainer.runtime.stage_modules import build_stages
from pipeboard.trainer.runtime import tied
from pipeboard.trainer.tune import search

pytestmark = pytest.mark.usefixtures("one_thread")


class TiedLM(nn.Module):
    """An embedding whose weight is also the output head's, with two layers between them."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(50, 16)
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.b(torch.tanh(self.a(self.tok(tokens))))))


class UntiedLM(TiedLM):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 50, bias=False)


def _profile(model: nn.Module, batch: int):
    torch.manual_seed(0)
    return profile_model(model, torch.randint(0, 50, (batch, 6)), warmup=1, repeats=2, timer="cpu")


def test_the_profile_names_the_layers_that_share_a_parameter():
    assert _profile(TiedLM(), 4).meta["tied"] == [["tok", "head"]]
    assert _profile(UntiedLM(), 4).meta["tied"] == []


def test_pipedream_is_offered_only_where_the_tie_stays_on_one_stage():
    model = TiedLM()
    profiles = [_profile(model, b) for b in (2, 4, 8)]
    result = search(profiles, workers=2, batch_size=8, microbatches=(1, 2, 4), schedules=["pipedream", "1f1b"])
    pipedream = [c for c in result.candidates if c.schedule == "pipedream"]
    refused = [s for s in result.skipped if "tied weights" in s["why"]]
    assert refused and all(s["candidate"].startswith("pipedream ") for s in refused)
    assert "layers tok, head share a parameter (tied weights) and sit on stages 0, 1" in refused[0]["why"]
    assert any(c.schedule == "1f1b" for c in result.candidates)
    for c in pipedream:  # whatever is offered, the runtime's own check accepts
        stage_of = {name: i for i, st in enumerate(c.plan["stages"]) for name in st["layers"]}
        assert stage_of["tok"] == stage_of["head"]
    # a refused split is one the runtime refuses too: the tuner's reason is the runtime's rule
    refused_split = [["tok", "a"], ["b", "head"]]
    modules = build_stages(model, torch.randint(0, 50, (4, 6)), refused_split)
    cfg = RunConfig(model="", schedule="pipedream", batch_size=8, microbatches=2)
    cfg.stages, cfg.replicas = refused_split, [1, 1]
    with pytest.raises(ConfigError, match="tied weights"):
        tied.check(cfg, resolve(cfg), tied.find(modules, model))

def test_an_untied_model_gets_pipedream_on_every_split():
    profiles = [_profile(UntiedLM(), b) for b in (2, 4, 8)]
    result = search(profiles, workers=2, batch_size=8, microbatches=(1, 2, 4), schedules=["pipedream"])
    assert not [s for s in result.skipped if "tied" in s["why"]]
    assert any(c.schedule == "pipedream" for c in result.candidates)
