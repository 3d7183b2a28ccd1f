"""Profiling a model whose inputs vary in length at the lengths its data has.

``profile_at_lengths(model, batches, dim, microbatch_size)`` reads the per-batch padded length
of every given batch (the collated inputs, in the run's order), chooses a few of those lengths
(``lengths.choose_lengths``), profiles the model at each on a microbatch cut from a real batch of
that length, and returns one profile: its layers hold the expected costs over the batches'
length histogram (what the planner divides among stages), its ``lengths`` the costs at each
measured length (what a step of a given length is predicted from, ``Profile.at_length``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Iterable, Sequence

import torch

from pipeboard.trainer.profile.lengths import BANDS, POINTS, VARYING, LengthCosts, choose_lengths, histogram
from pipeboard.trainer.profile.profiler import profile_model
from pipeboard.trainer.profile.schema import Profile, ProfileError


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in (x if isinstance(x, (tuple, list)) else [x]) if isinstance(t, torch.Tensor)]


def batch_length(x: Any, dim: int) -> int:
    """A batch's size in input dimension ``dim``: that of its first input tensor that has it."""
    for t in _tensors(x):
        if t.dim() > dim:
            return int(t.shape[dim])
    raise ValueError(f"no input tensor has dimension {dim}")


def padded_lengths(batches: Iterable[Any], dim: int) -> list[int]:
    """Each batch's padded length in ``dim``."""
    return [batch_length(x, dim) for x in batches]


def _rows(x: Any, n: int) -> Any:
    """The first ``n`` samples of every input tensor."""
    if isinstance(x, torch.Tensor):
        return x[:n]
    return tuple(t[:n] if isinstance(t, torch.Tensor) else t for t in x)


def profile_at_lengths(model: torch.nn.Module, batches: Sequence[Any], dim: int, microbatch_size: int, *,
                       points: int = POINTS, bands: int = BANDS, **profile_kw: Any) -> Profile:
    """Profile ``model`` at ``points`` lengths chosen from ``batches`` (collated inputs, each of
    ``LengthCosts.batch_size`` samples) in input dimension ``dim``, on microbatches of
    ``microbatch_size``; ``profile_kw`` go to ``profile_model``. The returned profile's ``meta``
    is the longest length's measurement, with ``lengths_wall_s`` the whole profiling's time."""
    started = time.perf_counter()
    batches = list(batches)
    lengths = padded_lengths(batches, dim)
    chosen = choose_lengths(lengths, points)
    by_length = {n: x for x, n in zip(batches, lengths)}
    profiles = [profile_model(model, _rows(by_length[n], microbatch_size), batch_size=microbatch_size, **profile_kw)
                for n in chosen]
    names = profiles[-1].layer_names()
    for n, p in zip(chosen, profiles):
        if p.layer_names() != names:  # a capture at this length grouped the ops into other layers
            raise ProfileError(f"profile at length {n} has layers {p.layer_names()[:4]}..., "
                               f"at length {chosen[-1]} {names[:4]}...: not one layer graph")
    per_layer = {layer.name: {f: [getattr(p.layers[i], f) for p in profiles] for f in VARYING}
                 for i, layer in enumerate(profiles[-1].layers)}
    edges, counts = histogram(lengths, bands)
    costs = LengthCosts(dim=dim, measured=chosen, layers=per_layer, edges=edges, counts=counts,
                        batch_size=_leading(batches[0]))
    expected = costs.expected()
    longest = profiles[-1]
    layers = [replace(layer, **expected[layer.name]) for layer in longest.layers]
    meta = {**longest.meta, "lengths_wall_s": time.perf_counter() - started}
    return replace(longest, layers=layers, meta=meta, lengths=costs)


def _leading(x: Any) -> int:
    t = _tensors(x)[0]
    return int(t.shape[0]) if t.dim() else 1
