"""Models: the zoo (always available) plus users' task factories: import paths installed on the
workers, or paths inside an uploaded code context.

No user code runs here. Registering stores the model as ``validating`` and queues
``pipeboard.validate_model``: a worker builds, checks and splits the task in a subprocess with
time and memory limits (app/services/model_checks.py) and stores ``ready`` or ``failed`` with the
message, so a model the profiler and the partitioner cannot handle is refused before any job, with
the failing op named.
"""

from __future__ import annotations

import posixpath
from functools import lru_cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from pipeboard.app.models import CodeContext, Model, ModelStatus
from pipeboard.app.schemas import ModelCreate, ModelPublic
from pipeboard.app.core.config import get_settings
from pipeboard.app.services.data_paths import check_data_root
from pipeboard.app.services.errors import NotFound, ServiceError
from pipeboard.app.services.tx import begin_write


@lru_cache(maxsize=1)
def _zoo_public() -> tuple[ModelPublic, ...]:
    from pipeboard.trainer import zoo

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
                       config=row.config or {}, context=row.context_sha256, data=row.data,
                       status=ModelStatus(row.status).value, message=row.message or "", layers=row.layers,
                       created_at=row.created_at)


def list_models(session: Session, offset: int, limit: int, owner_id: int | None = None) -> tuple[list[ModelPublic], int]:
    """The zoo, then registered models (only `owner_id`'s when given)."""
    mine = [Model.owner_id == owner_id] if owner_id is not None else []
    registered = [to_public(r) for r in session.scalars(select(Model).where(*mine).order_by(Model.id)).all()]
    names = {m.name for m in registered}
    everything = [m for m in zoo_public() if m.name not in names] + registered
    return everything[offset : offset + limit], len(everything)


def find(session: Session, ref: str) -> Model | None:
    """A registered model by id or name."""
    if ref.isdigit() and len(ref) < 12:
        return session.get(Model, int(ref))
    return session.scalar(select(Model).where(Model.name == ref))


def get(session: Session, ref: str, owner_id: int | None = None) -> ModelPublic:
    """A registered model (only `owner_id`'s when given: another's is not found) or a zoo model."""
    row = find(session, ref)
    if row is not None and (owner_id is None or row.owner_id == owner_id):
        return to_public(row)
    for m in zoo_public():
        if m.name == ref:
            return m
    raise NotFound("model", ref)


def register(session: Session, body: ModelCreate, owner_id: int | None = None) -> Model:
    """Store the model as ``validating`` (`owner_id`'s) and queue its validation; 409 for a taken
    name, 422 for a context that is not stored, a file path without one or outside it."""
    from pipeboard.trainer import zoo

    if body.name in zoo.names() or session.scalar(select(Model.id).where(Model.name == body.name)) is not None:
        raise ServiceError(f"name: a model named {body.name!r} already exists", status=409, field="name")
    path = body.source.rpartition(":")[0]
    if path.endswith(".py") and body.context is None:
        raise ServiceError(f"context: {body.source!r} names a file; upload the project (POST /contexts) and give its "
                           "sha256 as `context`", status=422, field="context")
    context = session.get(CodeContext, body.context) if body.context is not None else None
    if body.context is not None and context is None:
        raise ServiceError(unknown_context(body.context), status=422, field="context")
    if context is not None and path.endswith(".py"):
        check_source_in_context(body.source, context)
    if body.data is not None:
        check_data(body.data, context)
    begin_write(session)
    row = Model(name=body.name, source=body.source, kind="context" if body.context else "import", config=body.config,
                context_sha256=body.context, data=body.data, status=ModelStatus.VALIDATING,
                description=f"task factory {body.source}" + (f" in context {body.context[:12]}" if body.context else ""),
                message="queued for validation on a worker", owner_id=owner_id)
    session.add(row)
    session.commit()
    try:
        enqueue_validation(row.id)
    except Exception as exc:
        begin_write(session)
        row.status, row.message = ModelStatus.FAILED, f"broker: cannot queue the validation ({type(exc).__name__}: {exc})"
        session.commit()
        raise ServiceError(row.message, status=503, field="broker") from None
    return row


def unknown_context(digest: str) -> str:
    """The one answer for a context that is not stored and for one the user may not use."""
    return f"context: no code context {digest} (upload it first: POST /contexts)"


def inside_context(path: str, context: CodeContext, folders: bool = False) -> bool:
    """Whether `path` names a file (or, with `folders`, a folder) of the context's archive: no
    absolute path, no `..` out of it into another user's context unpacked beside it."""
    from pipeboard.app.services import contexts

    wanted = posixpath.normpath(path.replace("\\", "/"))
    if posixpath.isabs(path) or path.startswith("~") or wanted == ".." or wanted.startswith("../"):
        return False
    members = contexts.list_members(bytes(context.content))[1]
    names = {posixpath.normpath(m.name.replace("\\", "/")) for m in members if folders or not m.is_dir}
    return wanted in names or (folders and any(n.startswith(wanted + "/") for n in names))


def check_source_in_context(source: str, context: CodeContext) -> None:
    if not inside_context(source.rpartition(":")[0], context):
        raise ServiceError(f"source: {source!r} must name a .py file inside the model's code context "
                           f"{context.sha256[:12]} (a path relative to the project's top folder)",
                           status=422, field="source")


def check_data(data: str, context: CodeContext | None) -> None:
    """A model's `data`: relative, inside its context; otherwise under the data roots (one answer
    for every path outside them, app/services/data_paths.py)."""
    if context is not None and not (posixpath.isabs(data) or data.startswith("~")):
        if not inside_context(data, context, folders=True):
            raise ServiceError(f"data: {data!r} must name a file or folder inside the model's code context "
                               f"{context.sha256[:12]}", status=422, field="data")
        return
    check_data_root(data, get_settings().data_roots, field="data")


def enqueue_validation(model_id: int) -> None:
    from pipeboard.app.services.jobs import send_task

    send_task("pipeboard.validate_model", model_id)
