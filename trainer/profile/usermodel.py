"""Resolve what to profile: a zoo name or a user model given as ``package.module:factory``.

A factory is any callable returning ``(nn.Module, example_input)`` where the example input is a
tensor or a tuple of tensors; model arguments are passed to it as keyword arguments.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


class ModelSpecError(ValueError):
    """A model name or import path that does not give a model; the message says why."""


@dataclass
class ResolvedModel:
    name: str
    model: nn.Module
    example_input: Any
    batch_size: int
    optimizer: str = "adam"


def is_import_path(spec: str) -> bool:
    return ":" in spec


def load_factory(spec: str, **model_args: Any) -> tuple[nn.Module, Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ModelSpecError(f"model {spec!r}: an import path must look like 'package.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever the module raises while importing
        raise ModelSpecError(f"model {spec!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelSpecError(f"model {spec!r}: module {module_name!r} has no callable {attr!r}")
    try:
        result = factory(**model_args)
    except TypeError as exc:
        raise ModelSpecError(f"model {spec!r}: calling {attr}(**{model_args}) failed: {exc}") from None
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)):
        raise ModelSpecError(f"model {spec!r}: {attr}() must return (nn.Module, example_input), got {type(result).__name__}")
    example = result[1]
    items = example if isinstance(example, (tuple, list)) else (example,)
    if not items or not all(isinstance(t, torch.Tensor) for t in items):
        raise ModelSpecError(f"model {spec!r}: the example input must be a tensor or a tuple of tensors")
    return result[0], example


def resolve_model(spec: str, batch_size: int | None = None, model_args: dict[str, Any] | None = None) -> ResolvedModel:
    """A zoo model (``batch_size`` samples of its real data) or a user factory's model and example
    (whose batch size is the example's leading dimension)."""
    model_args = dict(model_args or {})
    if is_import_path(spec):
        model, example = load_factory(spec, **model_args)
        first = example[0] if isinstance(example, (tuple, list)) else example
        return ResolvedModel(spec, model, example, int(first.shape[0]) if first.dim() else 1)
    from trainer import zoo

    try:
        entry = zoo.get(spec, **model_args)
    except (KeyError, ValueError) as exc:
        raise ModelSpecError(f"{exc}; or give an import path 'package.module:factory'" if spec not in zoo.names() else str(exc)) from None
    bs = batch_size or entry.default_batch_size
    return ResolvedModel(spec, entry.model, entry.example_input(bs), bs, entry.optimizer)
