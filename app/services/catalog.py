"""Models: the zoo (always available) plus user task factories registered by import path.

Registering builds and checks the task and traces its model with torch.fx first, so a model the profiler and the partitioner
cannot handle is refused at the door with the failing op named, not at 2 a.m. in a job.
"""

from __future__ import annotations

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
    """Build the task factory's task, check it, and split its model with torch.fx: the number of
    layers, or 422 naming `source`."""
    from trainer.profile.fxgraph import UntraceableModelError, trace_layers
    from trainer.spec import load_task
    from trainer.task import TaskError, check_task

    if ":" not in source:
        raise ServiceError(f"source: {source!r} is not a task factory 'package.module:function'", status=422, field="source")
    try:
        task = load_task(source, config)
        check_task(task)
        graph = trace_layers(task.model, task.example_input(2))
    except UntraceableModelError as exc:
        raise ServiceError(f"source: {source} cannot be split by torch.fx: {exc}", status=422, field="source") from None
    except TaskError as exc:
        raise ServiceError(f"source: {exc}", status=422, field="source") from None
    return sum(1 for layer in graph.layers if layer.kind == "layer")


def register(session: Session, body: ModelCreate) -> ModelPublic:
    from trainer import zoo

    if body.name in zoo.names() or session.scalar(select(Model.id).where(Model.name == body.name)) is not None:
        raise ServiceError(f"name: a model named {body.name!r} already exists", status=409, field="name")
    layers = trace_check(body.source, body.config)
    begin_write(session)
    row = Model(name=body.name, source=body.source, kind="import", config=body.config,
                description=f"registered from {body.source} ({layers} traced layers)")
    session.add(row)
    session.commit()
    return to_public(row)
