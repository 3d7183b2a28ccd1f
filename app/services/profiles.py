"""Profiles: stored per-layer measurements, the cache behind jobs and the plan what-if, uploads.

A profile made by profiling gets a canonical name (model, arguments, batch size, device) so
the next job or what-if for the same model reuses it instead of measuring again.
"""

from __future__ import annotations

import json
import os
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from pipeboard.app.core.config import get_settings
from pipeboard.app.models import Model, Profile
from pipeboard.app.schemas import LayerRow, ProfilePublic
from pipeboard.app.services.errors import NotFound, ServiceError
from pipeboard.app.services.tx import begin_write
from pipeboard.trainer import cpu_matmul
from pipeboard.trainer.hostinfo import usable_cores
from pipeboard.trainer.profile.schema import CAPTURE_VERSION


def cache_key(model: str, model_args: dict[str, Any], batch_size: int, device: str = "cpu",
              calibration: list[str] | None = None) -> str:
    """The canonical name; a job's profile also names how it was calibrated (``calibration``:
    calibration_args' flags; threads, the batch its weight gradients were timed at, optimizer), so a
    different run does not reuse it. ``--calibrate`` itself, in every such list, is left out. A
    profile measured with other matrix-product kernels than the default (``PIPEBOARD_CPU_MATMUL``,
    which the profiling child and the runs read; trainer/cpu_matmul.py) says so too: its layer
    times differ (up to 2x on some AMD processors)."""
    args = json.dumps(model_args, sort_keys=True, separators=(",", ":")) if model_args else ""
    named = []
    matmul = os.environ.get(cpu_matmul.ENV) or "default"
    if device == "cpu" and matmul != "default":  # before the calibration: `cached` matches on the start
        named.append(f"matmul={matmul}")
    named += [a.lstrip("-") for a in calibration or [] if a != "--calibrate"]
    extra = (" " + " ".join(named)) if named else ""
    # the capture's version: a profile whose layers another capture named is never reused
    return f"{model}{args} bs={batch_size} {device} {CAPTURE_VERSION}{extra}"[:200]


def worker_threads(workers: int) -> int:
    """Torch threads each of ``workers`` local worker processes gets (as the runtime's
    threads_per_worker shares this machine's cores among them)."""
    return max(1, usable_cores() // max(1, workers))


def concurrent_workers(workers: int) -> int:
    """Processes that train beside the profiled one in a run of ``workers`` local workers: the
    other workers, as many as there are other cores for them."""
    return max(0, min(workers, usable_cores()) - 1)


def calibration_args(workers: int, batch_size: int, weight_grads: str, optimizer: str | None = None,
                     microbatches: int | None = None) -> list[str]:
    """profile_run's flags that calibrate a profile for runs on ``workers`` local processes of
    ``batch_size`` samples per step: the link and the runtime's per-action overhead, the torch
    threads each worker will have, loading a batch, the other workers training meanwhile
    (``concurrent_workers``), and (batched weight gradients) the layers' weight gradients at the
    whole batch; with ``microbatches``, the pilot runs at the run's batch in that many
    microbatches (pipeboard.trainer.runtime.pilot)."""
    args = ["--calibrate", "--threads", str(worker_threads(workers)), "--run-batch-size", str(batch_size),
            "--concurrent", str(concurrent_workers(workers))]
    if microbatches:
        args += ["--pilot-workers", str(workers), "--pilot-microbatches", str(microbatches)]
    if weight_grads == "batched":
        args += ["--weight-batch-size", str(batch_size)]
    if optimizer:
        args += ["--optimizer", optimizer]
    return args


def machine_cache_args(calibration: list[str]) -> list[str]:
    """With ``calibration`` (calibration_args): profile_run's flags that reuse this machine's kept
    link and overhead figures (settings CALIBRATION_DIR, CALIBRATION_MAX_AGE_S). Not part of the
    cache key: where the machine's figures come from does not change what they are."""
    if "--calibrate" not in calibration:
        return []
    settings = get_settings()
    return ["--machine-cache", str(settings.calibration_dir), "--machine-max-age", str(settings.calibration_max_age_s)]


def cached(session: Session, key: str, *, calibrated_too: bool = False) -> Profile | None:
    """The newest profiled profile named ``key``; ``calibrated_too``: or one of the same model,
    arguments, batch size and device that a job also calibrated (its name is ``key`` and the
    calibration), which holds every plain measurement too."""
    match = Profile.name == key
    if calibrated_too:
        match = match | Profile.name.startswith(key + " ", autoescape=True)
    return session.scalar(select(Profile).where(match, Profile.origin == "profiled").order_by(Profile.id.desc()).limit(1))


def store(session: Session, data: dict[str, Any], *, name: str, origin: str, model_id: int | None = None) -> Profile:
    begin_write(session)
    row = Profile(name=name, origin=origin, data=data, batch_size=data.get("batch_size"), model_id=model_id)
    session.add(row)
    session.flush()
    return row


def resolve_model(session: Session, name: str, *, check_zoo: bool = True) -> tuple[str, str, dict[str, Any], int | None]:
    """(source, kind, default args, model id) of a zoo name or a registered model's name.

    ``check_zoo=False`` trusts a name the API already validated: listing the zoo imports torch,
    which a worker need not pay for just to pass a name on to the profiling subprocess.
    """
    row = session.scalar(select(Model).where(Model.name == name))
    if row is not None:
        return row.source, row.kind, dict(row.config or {}), row.id
    if not check_zoo:
        return name, "zoo", {}, None
    from pipeboard.trainer import zoo

    if name in zoo.names():
        return name, "zoo", {}, None
    raise ServiceError(f"model: unknown model {name!r} (GET /api/v1/models lists them)", status=422, field="model")


def parse_upload(content: bytes, filename: str, max_bytes: int) -> dict[str, Any]:
    """A graph.txt or profile JSON upload, as profile JSON; 413/422 naming the field."""
    from pipeboard.trainer.profile.graphtxt import parse_graph_txt
    from pipeboard.trainer.profile.schema import Profile as TrainerProfile
    from pipeboard.trainer.profile.schema import ProfileError

    if len(content) > max_bytes:
        raise ServiceError(f"file: upload of {len(content)} bytes exceeds the limit of {max_bytes} bytes", status=413, field="file")
    if not content.strip():
        raise ServiceError("file: the upload is empty", status=422, field="file")
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise ServiceError("file: the upload is not UTF-8 text (expected graph.txt or profile JSON)", status=422, field="file") from None
    try:
        if text.lstrip().startswith("{"):
            prof = TrainerProfile.from_json(text)
        else:
            stem = filename.rsplit("/", 1)[-1].rsplit(".", 1)[0] if filename else "upload"
            prof = parse_graph_txt(text, model=stem)
    except ProfileError as exc:
        raise ServiceError(f"file: {exc}", status=422, field="file") from None
    return prof.to_dict()


def get(session: Session, profile_id: int) -> Profile:
    row = session.get(Profile, profile_id)
    if row is None:
        raise NotFound("profile", profile_id)
    return row


def to_public(row: Profile, *, include_data: bool = False) -> ProfilePublic:
    layers = []
    fwd = bwd = 0.0
    for layer in row.data.get("layers", []):
        act = layer.get("activation_bytes", 0.0)
        act_total = float(sum(act)) if isinstance(act, list) else float(act or 0.0)
        lr = LayerRow(
            name=layer["name"],
            desc=layer.get("desc", ""),
            forward_ms=float(layer.get("forward_ms", 0.0)),
            backward_ms=float(layer.get("backward_ms", 0.0)),
            activation_bytes=act_total,
            parameter_bytes=float(layer.get("parameter_bytes", 0.0)),
        )
        fwd += lr.forward_ms
        bwd += lr.backward_ms
        layers.append(lr)
    return ProfilePublic(
        id=row.id,
        name=row.name,
        model_id=row.model_id,
        batch_size=row.batch_size,
        status="ready",
        created_at=row.created_at,
        total_forward_ms=fwd,
        total_backward_ms=bwd,
        layers=layers,
        lengths=assumed_lengths(row.data),
        data=row.data if include_data else None,
    )


def assumed_lengths(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """The lengths a stored profile was measured at (its ``lengths`` less the per-layer costs)."""
    raw = (data or {}).get("lengths")
    if not isinstance(raw, dict):
        return None
    return {k: raw[k] for k in ("dim", "measured", "batch_size", "histogram") if k in raw}
