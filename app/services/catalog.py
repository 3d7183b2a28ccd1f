"""Models: the zoo (always available) plus user models registered by import path.

Registering traces the model with torch.fx first, so a model the profiler and the partitioner
cannot handle is refused at the door with the failing op named, not at 2 a.m. in a job.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Model
from app.schemas import ModelCreate, ModelPublic
from app.services.errors import NotFound, ServiceError
from app.services.tx import begin_write


@lru_cache(maxsize=1)
def _zoo_public() -> tuple[ModelPublic, ...]:
    from trainer import zoo

    return tuple(
        ModelPublic(id=None, name=d["name"], source=d["name"], kind="zoo", description=d.get("description", ""),
                    config={k: v for k, v in (d.get("args") or {}).items() if _plain(v)})
        for d in zoo.describe()
    )


def zoo_public() -> list[ModelPublic]:
    """The zoo does not change while the server runs; describing it imports sklearn and more."""
    return [m.model_copy() for m in _zoo_public()]


def _plain(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool)) or v is None


def to_public(row: Model) -> ModelPublic:
    return ModelPublic(id=row.id, name=row.name, source=row.source, kind=row.kind, description=row.description or "",
                       config=row.config or {}, created_at=row.created_at)


def list_models(session: Session, offset: int, limit: int) -> tuple[list[ModelPublic], int]:
    registered = [to_public(r) for r in session.scalars(select(Model).order_by(Model.id)).all()]
    names = {m.name for m in registered}
    everything = [m for m in zoo_public() if m.name not in names] + registered
    return everything[offset : offset + limit], len(everything)


def get(session: Session, ref: str) -> ModelPublic:
    row = session.get(Model, int(ref)) if ref.isdigit() and len(ref) < 12 else session.scalar(select(Model).where(Model.name == ref))
    if row is not None:
        return to_public(row)
    for m in zoo_public():
        if m.name == ref:
            return m
    raise NotFound("model", ref)


def trace_check(source: str, config: dict[str, Any]) -> int:
    """Import, build and fx-trace the model; the number of traced layers, or 422 naming `source`."""
    module_name, _, attr = source.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ServiceError(f"source: cannot import {source!r}: {exc}", status=422, field="source") from None
    try:
        built = factory(**config)
    except Exception as exc:
        raise ServiceError(f"source: {source}(**config) raised {type(exc).__name__}: {exc}", status=422, field="source") from None
    if not (isinstance(built, tuple) and len(built) == 2):
        raise ServiceError(f"source: {source} must return (nn.Module, example_input), got {type(built).__name__}", status=422, field="source")
    model, example = built
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ServiceError(f"source: {source} returned {type(model).__name__}, not an nn.Module", status=422, field="source")
    try:
        graph = torch.fx.symbolic_trace(model)
    except Exception as exc:  # fx names the op it could not trace in its message
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ServiceError(f"source: {source} cannot be traced by torch.fx: {first}", status=422, field="source") from None
    try:
        with torch.no_grad():
            graph(*(example if isinstance(example, tuple) else (example,)))
    except Exception as exc:
        raise ServiceError(f"source: the traced model fails on its example input: {type(exc).__name__}: {exc}", status=422, field="source") from None
    return sum(1 for n in graph.graph.nodes if n.op in ("call_module", "call_function", "call_method"))


def register(session: Session, body: ModelCreate) -> ModelPublic:
    from trainer import zoo

    if body.name in zoo.names() or session.scalar(select(Model.id).where(Model.name == body.name)) is not None:
        raise ServiceError(f"name: a model named {body.name!r} already exists", status=409, field="name")
    layers = trace_check(body.source, body.config)
    begin_write(session)
    row = Model(name=body.name, source=body.source, kind="import", config=body.config,
                description=f"registered from {body.source} ({layers} traced ops)")
    session.add(row)
    session.commit()
    return to_public(row)
