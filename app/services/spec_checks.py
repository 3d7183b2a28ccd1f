"""The checks of a job's specification that need the database, at the door: the model (a zoo
model's arguments, a registered model's validation and its data), the live hosts a job on several
hosts needs, a GPU for `cuda`. A failed check is a 422 naming the field, before anything is queued
(app/services/jobs.py's submit; plans and profiles check model arguments with these too).
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from pipeboard.app.core.config import get_settings
from pipeboard.app.models import Model, ModelStatus, WorkerHeartbeat
from pipeboard.app.schemas import JobSpec
from pipeboard.app.services import data_paths, placement
from pipeboard.app.services.errors import ServiceError


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def validate_model(session: Session, name: str, model_args: dict[str, Any], data: str | None = None) -> None:
    """Jobs train zoo models with arguments they take, or registered models a worker has
    validated; 422 naming `model.name`, `model.args.<key>` or `model.data` otherwise, before anything is queued."""
    from pipeboard.trainer import zoo

    row = session.scalar(select(Model).where(Model.name == name))
    if row is not None:
        status = ModelStatus(row.status)
        if status is ModelStatus.VALIDATING:
            raise ServiceError(f"model.name: {name!r} is still being validated by a worker (GET /api/v1/models/{name})",
                               status=422, field="model.name")
        if status is ModelStatus.FAILED:
            raise ServiceError(f"model.name: {name!r} failed validation: {row.message}", status=422, field="model.name")
        if data is not None and row.context_sha256 and not os.path.isabs(data):
            check_data_in_context(session, row.context_sha256, data)
        elif data is not None:  # one answer for every path outside the data roots (app/services/data_paths.py)
            data_paths.check_data_root(data, get_settings().data_roots)
        return
    names = list(zoo.names())
    if name not in names:
        raise ServiceError(f"model.name: unknown model {name!r}; known: {', '.join(names)}, or a registered model "
                           "(POST /api/v1/models)", status=422, field="model.name")
    validate_model_args(name, model_args)
    if data is not None:
        # zoo tasks read their data on the worker; the embedded default shares this file system
        data_paths.check_data_root(data, get_settings().data_roots)


def check_data_in_context(session: Session, digest: str, data: str) -> None:
    """A relative data location must be a file or folder of the model's code context."""
    from pipeboard.app.services import contexts

    wanted = os.path.normpath(data).replace(os.sep, "/").strip("/")
    if wanted.startswith("..") or wanted == ".":
        raise ServiceError(f"model.data: {data!r} must name a file or folder inside the code context", status=422, field="model.data")
    members = contexts.list_members(bytes(contexts.get(session, digest).content))[1]
    names = {m.name.rstrip("/").removeprefix("./") for m in members}
    if wanted not in names and not any(n.startswith(wanted + "/") for n in names):
        raise ServiceError(f"model.data: {data!r} is not in the model's code context", status=422, field="model.data")


@lru_cache(maxsize=1)
def zoo_args() -> dict[str, frozenset[str]]:
    """Each zoo model's argument names (from pipeboard.trainer.zoo.describe(), which does not change)."""
    from pipeboard.trainer import zoo

    return {d["name"]: frozenset(d.get("args") or {}) for d in zoo.describe()}


def validate_model_args(name: str, model_args: dict[str, Any], where: str = "model.args") -> None:
    """422 naming ``<where>.<key>`` for an argument the zoo model does not take."""
    accepted = zoo_args().get(name, frozenset())
    for key in model_args:
        if key not in accepted:
            takes = ", ".join(sorted(accepted)) or "no arguments"
            raise ServiceError(f"{where}.{key}: {name} does not take {key!r} (it takes: {takes})", status=422,
                               field=f"{where}.{key}")


def live_hosts(session: Session) -> set[str]:
    """Hosts with a worker whose heartbeat is fresh."""
    cutoff = utcnow().timestamp() - get_settings().stale_after_seconds
    rows = session.execute(select(WorkerHeartbeat.host, WorkerHeartbeat.hostname, WorkerHeartbeat.seen_at)).all()
    return {host or node for host, node, seen in rows if seen.timestamp() >= cutoff}


def gpu_workers(session: Session) -> int:
    """Live workers that report a GPU (their heartbeats' inventories, app/services/placement.py)."""
    return placement.gpu_workers(session)


def gpu_request(job_id: int, spec: JobSpec) -> placement.GpuRequest:
    """A cuda job's need on one host: one GPU for each of its processes there, or the
    `machine.gpus_per_host` GPUs they share (the run's launcher packs its stages onto those)."""
    return placement.GpuRequest(job_id, spec.layout.processes // spec.layout.nodes, gpus_per_host=spec.machine.gpus_per_host)


def check_spec(session: Session, spec: JobSpec, kind: str = "train") -> None:
    """The checks of a specification that need the database, at the door: the model (and its
    data), the hosts a job on several hosts needs, a GPU for `cuda`; and the fields against each
    other and the schedule registry (JobSpec.problems). 422 naming the field."""
    for field, why in spec.problems():
        raise ServiceError(f"{field}: {why}", status=422, field=field)
    if kind == "train":
        validate_model(session, spec.model.name, spec.model.args, spec.model.data)
    if spec.machine.device == "cuda":
        why = placement.refusal(gpu_request(0, spec), placement.live_inventories(session))
        if why is not None:
            field = why.split(":", 1)[0]
            raise ServiceError(why, status=422, field=field)
    if spec.layout.nodes > 1:
        hosts = live_hosts(session)
        if spec.layout.nodes > len(hosts):
            raise ServiceError(f"layout.nodes: the job needs {spec.layout.nodes} hosts; {len(hosts)} host(s) have a live "
                               f"worker ({', '.join(sorted(hosts)) or 'none'})", status=422, field="layout.nodes")
