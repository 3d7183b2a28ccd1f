"""A tuner's result (`pipeboard tune --json`) as a run: the fields of the RunConfig that trains
its choice (or any of its candidates), for `pipeboard train --tuned` and ``verify``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeboard.trainer.schedule import registry
from pipeboard.trainer.tune.candidate import Candidate, TuneError

RUN_KEYS = ("model", "model_args", "data", "precision", "workers", "batch_size")


def run_fields(candidate: Candidate, run: dict[str, Any]) -> dict[str, Any]:
    """RunConfig keyword arguments: ``run`` (the tuned model and cluster: model, model_args,
    data, precision, workers) laid out as ``candidate`` says."""
    stages = [list(st["layers"]) for st in candidate.plan["stages"]]
    out = {"model": run["model"], "model_args": dict(run.get("model_args") or {}), "data": run.get("data"),
           "precision": run.get("precision") or "fp32", "schedule": candidate.schedule,
           "batch_size": candidate.batch_size, "microbatches": candidate.microbatches, "chunks": candidate.chunks,
           "weight_grads": "batched"}
    redo = [s for s, on in enumerate(candidate.recompute) if on]
    if registry.is_data_parallel(candidate.schedule):  # the whole model on each of the workers
        out.update(workers=int(candidate.plan["stages"][0]["replicas"]), stages=None, replicas=None)
    else:
        out.update(stages=stages, replicas=[int(st["replicas"]) for st in candidate.plan["stages"]], workers=None)
    out["recompute"] = redo or None
    return out


def load(path: str | Path) -> dict[str, Any]:
    """The RunConfig fields of a tune file's choice; TuneError naming ``--tuned`` when it is not one."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise TuneError(f"--tuned: cannot read {path}: {exc.strerror}", field="tuned") from None
    except ValueError as exc:
        raise TuneError(f"--tuned: {path} is not JSON: {exc}", field="tuned") from None
    return fields_of(doc, "--tuned")


def fields_of(doc: Any, name: str = "tuned") -> dict[str, Any]:
    if not isinstance(doc, dict) or not isinstance(doc.get("choice"), dict) or not isinstance(doc.get("run"), dict):
        raise TuneError(f"{name}: not a `pipeboard tune --json` result (needs 'choice' and 'run')", field="tuned")
    run = doc["run"]
    if not isinstance(run.get("model"), str) or not run["model"]:
        raise TuneError(f"{name}: run.model must name the tuned model", field="tuned")
    try:
        return run_fields(Candidate.from_dict(doc["choice"]), run)
    except (KeyError, TypeError, AttributeError) as exc:
        raise TuneError(f"{name}: choice is not a tuner candidate ({type(exc).__name__}: {exc})", field="tuned") from None


def job_layout(candidate: Candidate, workers: int) -> dict[str, Any]:
    """A job's ``layout`` that trains ``candidate``: its ``split`` (the stages, layers and
    replicas, as the candidate's plan has them: the job trains them, it does not plan again),
    schedule, microbatches, chunks and the stages that recompute."""
    redo = [s for s, on in enumerate(candidate.recompute) if on]
    split = [{"layers": list(st["layers"]), "replicas": int(st["replicas"])} for st in candidate.plan["stages"]]
    return {"workers": workers, "split": split,
            "schedule": candidate.schedule, "microbatches": candidate.microbatches, "chunks": candidate.chunks,
            "recompute": "all" if redo and len(redo) == len(candidate.recompute) else redo or "none"}


def job_spec(doc: Any) -> dict[str, Any]:
    """A job specification (version 2) that trains a tune file's choice: its model, batch and
    ``job_layout``; the service's defaults for the rest (length, optimizer, machine)."""
    fields = fields_of(doc, "tune file")  # checks the file
    choice = Candidate.from_dict(doc["choice"])
    workers = int(doc["run"].get("workers") or sum(int(st["replicas"]) for st in choice.plan["stages"]))
    model = {"name": fields["model"], "args": fields["model_args"], "batch_size": fields["batch_size"]}
    if fields.get("data"):
        model["data"] = fields["data"]
    return {"version": 2, "model": model, "layout": job_layout(choice, workers),
            "machine": {"precision": fields["precision"]}}
