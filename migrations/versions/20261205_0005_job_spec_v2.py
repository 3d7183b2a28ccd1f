"""jobs' specifications as version 2 (app/schemas/jobspec.py): the flat version-1 fields moved into
their sections (model, layout, length, optimizer, machine, checkpoints)

A row's spec that holds a non-finite number (NaN, an infinity: version 1 let them in) cannot be a
version-2 specification: the number is dropped (a length left without a rule gets version 1's
default, 50 steps) and, if the job had not ended, it is failed with the reason.

The conversion is written out here, not imported, so that it stays what it was when this
revision was made. Downgrade writes version 1's flat fields back (device, precision and the other
fields version 1 did not have are dropped).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05 12:00:00

"""
import json
import math
from typing import Any, Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0005'
down_revision: Union[str, Sequence[str], None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

FIELDS = {
    "model": ("model", "name"), "model_args": ("model", "args"), "data": ("model", "data"),
    "batch_size": ("model", "batch_size"),
    **{k: ("layout", k) for k in ("workers", "levels", "memory_bytes", "method", "schedule", "microbatches",
                                  "weight_grads", "nodes")},
    "checkpoint_every": ("checkpoints", "every"), "max_attempts": ("checkpoints", "max_attempts"),
    "device": ("machine", "device"),  # profiling jobs' rows had it
}
HYPERPARAMETERS = {"lr": ("optimizer", "lr"), "optimizer": ("optimizer", "name"), "seed": ("optimizer", "seed"),
                   "eval_every": ("length", "eval_every"), "chunks": ("layout", "chunks"),
                   "vertical_sync": ("layout", "vertical_sync")}
STOP = ("epochs", "steps", "target", "time_s")
TOP = ("name", "priority", "repeats")
# version 2's defaults when this revision was made: rows are stored whole, as the API stores them
DEFAULTS = {
    "model": {"args": {}, "data": None, "batch_size": 32},
    "layout": {"workers": None, "levels": None, "memory_bytes": None, "method": "pipedream", "schedule": "1f1b",
               "microbatches": 4, "chunks": 1, "vertical_sync": False, "weight_grads": "batched", "nodes": 1},
    "length": {"epochs": None, "steps": None, "target": None, "time_s": None, "eval_every": None},
    "optimizer": {"name": None, "lr": None, "seed": 0},
    "machine": {"device": "cpu", "precision": "fp32"},
    "checkpoints": {"every": 20, "max_attempts": 2},
}
FINAL = ("succeeded", "failed", "cancelled")


def finite(value: Any) -> bool:
    return not (isinstance(value, float) and not math.isfinite(value))


def to_version_2(flat: dict[str, Any], kind: str) -> tuple[dict[str, Any], list[str]]:
    """The row's spec as version 2, and the fields whose non-finite numbers were dropped."""
    out: dict[str, Any] = {"version": 2}
    sections: dict[str, dict[str, Any]] = {}
    dropped: list[str] = []
    if "workers" in flat and "levels" in flat and flat.get("levels") is not None:
        flat = {**flat, "workers": None}

    def put(where: tuple[str, str], value: Any, name: str) -> None:
        if value is None:
            return
        if not finite(value):
            dropped.append(name)
            return
        sections.setdefault(where[0], {})[where[1]] = value

    for key, value in flat.items():
        if key in FIELDS:
            put(FIELDS[key], value, key)
        elif key == "hyperparameters" and isinstance(value, dict):
            for inner, v in value.items():
                if inner in HYPERPARAMETERS:
                    put(HYPERPARAMETERS[inner], v, f"hyperparameters.{inner}")
        elif key == "stop" and isinstance(value, dict):
            for inner in STOP:
                put(("length", inner), value.get(inner), f"stop.{inner}")
        elif key in TOP and value is not None:
            out[key] = value
    length = sections.setdefault("length", {})
    if not any(k in length for k in STOP):
        length["steps"] = 50
    if kind == "profile":  # a profile is measured at the whole batch, in one piece
        sections.setdefault("layout", {}).update(workers=1, microbatches=1)
    whole = {name: {**default, **sections.get(name, {})} for name, default in DEFAULTS.items()}
    if whole["layout"]["workers"] is None and whole["layout"]["levels"] is None:
        whole["layout"]["workers"] = 2
    return {"name": None, "priority": 0, **out, **whole}, dropped


def to_version_1(spec: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {k: spec[k] for k in TOP if k in spec}
    for key, (section, name) in FIELDS.items():
        if key != "device" and name in spec.get(section, {}):
            flat[key] = spec[section][name]
    flat["hyperparameters"] = {k: spec[s][n] for k, (s, n) in HYPERPARAMETERS.items() if n in spec.get(s, {})}
    flat["stop"] = {k: spec.get("length", {}).get(k) for k in STOP}
    if "repeats" in spec:
        flat["device"] = spec.get("machine", {}).get("device", "cpu")
    return flat


def _rows(bind: sa.engine.Connection) -> list[Any]:
    return bind.execute(sa.text("SELECT id, kind, status, spec FROM jobs")).all()


def _spec(value: Any) -> dict[str, Any]:
    return json.loads(value) if isinstance(value, str) else value


def _write(bind: sa.engine.Connection, job_id: int, spec: dict[str, Any]) -> None:
    update = sa.text("UPDATE jobs SET spec = :spec WHERE id = :id").bindparams(sa.bindparam("spec", type_=sa.JSON))
    bind.execute(update, {"spec": spec, "id": job_id})


def upgrade() -> None:
    bind = op.get_bind()
    for job_id, kind, status, raw in _rows(bind):
        spec = _spec(raw)
        if not isinstance(spec, dict) or "version" in spec:
            continue
        new, dropped = to_version_2(spec, kind)
        _write(bind, job_id, new)
        if dropped and status not in FINAL:
            reason = (f"migration 0005: its specification held a non-finite number ({', '.join(dropped)}), which no "
                      "job can run with; submit it again")
            bind.execute(sa.text("UPDATE jobs SET status = 'failed', error = :error WHERE id = :id"),
                         {"error": reason, "id": job_id})
            bind.execute(sa.text("UPDATE job_attempts SET status = 'failed', error = :error WHERE job_id = :id "
                                 "AND status IN ('queued', 'running')"), {"error": reason, "id": job_id})


def downgrade() -> None:
    bind = op.get_bind()
    for job_id, _kind, _status, raw in _rows(bind):
        spec = _spec(raw)
        if isinstance(spec, dict) and spec.get("version") == 2:
            _write(bind, job_id, to_version_1(spec))
