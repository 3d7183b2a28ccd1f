"""The job specification (app/schemas/jobspec.py): every field reaches the run's configuration or
is named as the service's own, and what the specification cannot be is a 422 naming the field,
with nothing queued."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from pipeboard.app.models import Job, WorkerHeartbeat
from pipeboard.app.schemas import JobSpec
from pipeboard.app.schemas.jobspec import Section
from pipeboard.app.services import planning, runner
from pipeboard.trainer.runtime.run_config import ConfigError, RunConfig
from pipeboard.trainer.schedule.torchcsv import dumps
from tests.app.test_services_planning import calibrated_chain
from pipeboard.trainer.schedule.torch_reference import torch_rows

BASE = {"version": 2, "model": {"name": "mlp-digits", "batch_size": 32},
        "layout": {"workers": 2, "schedule": "1f1b", "microbatches": 4}, "length": {"steps": 20}}

# torch's own ZBV on 2 workers x 2 chunks, 4 microbatches, as its _dump_csv writes it
TORCH_ZBV = dumps(torch_rows("zbv", 2, 4))
CUSTOM = {"schedule": "custom", "schedule_file": TORCH_ZBV, "chunks": 2, "microbatches": 4}
DEADLOCKED = "0F0,0B0,0F1,0B1\n1B0,1F0,1F1,1B1\n"  # rank 1 runs 1B0 before the 1F0 it needs

# field -> (a specification's sections changed, the RunConfig field it must set, the value there)
REACHES_THE_RUN: dict[str, tuple[dict[str, Any], str, Any]] = {
    "model.name": ({"model": {"name": "cnn-digits"}}, "model", "cnn-digits"),
    "model.args": ({"model": {"args": {"hidden": 24}}}, "model_args", {"hidden": 24}),
    "model.data": ({"model": {"data": "/srv/digits"}}, "data", "/srv/digits"),
    "model.batch_size": ({"model": {"batch_size": 64}}, "batch_size", 64),
    "model.loader_workers": ({"model": {"loader_workers": 3}}, "loader_workers", 3),
    "layout.schedule": ({"layout": {"schedule": "gpipe"}}, "schedule", "gpipe"),
    "layout.microbatches": ({"layout": {"microbatches": 8}}, "microbatches", 8),
    "layout.chunks": ({"layout": {"schedule": "interleaved-1f1b", "chunks": 2}}, "chunks", 2),
    "layout.vertical_sync": ({"layout": {"schedule": "pipedream", "vertical_sync": True}}, "vertical_sync", True),
    "layout.weight_grads": ({"layout": {"weight_grads": "immediate"}}, "weight_grads", "immediate"),
    "layout.schedule_file": ({"layout": CUSTOM}, "schedule_csv", TORCH_ZBV),
    "layout.recompute": ({"layout": {"recompute": [1]}}, "recompute", [1]),
    "length.epochs": ({"length": {"epochs": 1.5}}, "epochs", 1.5),
    "length.steps": ({"length": {"steps": 7}}, "steps", 7),
    "length.target": ({"length": {"target": 0.9}}, "target", 0.9),
    # a time rule: the run trains on and the runner stops it at the limit
    "length.time_s": ({"length": {"time_s": 30}}, "epochs", runner.EPOCHS_UNDER_A_TIME_RULE),
    "length.eval_every": ({"length": {"target": 0.9, "eval_every": 5}}, "eval_every", 5),
    "optimizer.name": ({"optimizer": {"name": "sgd"}}, "optimizer", "sgd"),
    "optimizer.lr": ({"optimizer": {"lr": 0.05}}, "lr", 0.05),
    "optimizer.seed": ({"optimizer": {"seed": 11}}, "seed", 11),
    "machine.device": ({"machine": {"device": "cuda"}}, "device", "cuda"),
    "machine.precision": ({"machine": {"precision": "bf16"}}, "precision", "bf16"),
    "checkpoints.every": ({"checkpoints": {"every": 7}}, "checkpoint_every", 7),
}
# the fields the service itself acts on, and how
THE_SERVICES_OWN = {
    "version": "which specification this is",
    "name": "the job's name in listings",
    "priority": "the queue's order",
    "layout.workers": "the planner's input: the run gets the plan's stages and replicas",
    "layout.levels": "the planner's input, as workers",
    "layout.memory_bytes": "the planner's memory constraint",
    "layout.method": "the planner's method",
    "layout.split": "the job's plan when given (the planner does not run): the run gets its stages and replicas",
    "layout.nodes": "how many hosts' agents the runner starts (torchrun)",
    "checkpoints.max_attempts": "how often the service retries a lost attempt",
    "machine.gpus_per_host": "placement's GPU request: the run sees those GPUs (CUDA_VISIBLE_DEVICES) and packs its stages on them",
}


def leaf_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, Section):
            out += leaf_fields(kind, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def merged(changes: dict[str, Any]) -> dict[str, Any]:
    return {k: ({**BASE.get(k, {}), **v} if isinstance(v, dict) and k in BASE and k != "length" else v)
            for k, v in {**BASE, **changes}.items()}


def plan_for(spec: JobSpec) -> dict[str, Any]:
    levels = planning.levels_of(None, spec.layout.workers)
    return planning.make_plan(calibrated_chain(), levels, memory_bytes=None, method="uniform").to_dict()


def run_file_config(spec: JobSpec, tmp_path: Path) -> RunConfig:
    path = runner.write_run_file(tmp_path / "run.json", spec, plan_for(spec), checkpoint_dir=tmp_path / "ckpt",
                                 recorded=3)
    return RunConfig.load(path)


def test_every_field_of_the_specification_reaches_the_run_or_is_the_services_own():
    fields = leaf_fields(JobSpec)
    unclassified = [f for f in fields if f not in REACHES_THE_RUN and f not in THE_SERVICES_OWN]
    assert not unclassified, f"say where these go (REACHES_THE_RUN or THE_SERVICES_OWN): {unclassified}"
    assert not set(REACHES_THE_RUN) & set(THE_SERVICES_OWN)
    assert set(REACHES_THE_RUN) | set(THE_SERVICES_OWN) == set(fields)


@pytest.mark.parametrize("field", sorted(REACHES_THE_RUN))
def test_a_field_of_the_specification_reaches_the_runs_configuration(field, tmp_path):
    changes, attribute, expected = REACHES_THE_RUN[field]
    spec = JobSpec.model_validate(merged(changes))
    (tmp_path / "base").mkdir()
    base = run_file_config(JobSpec.model_validate(BASE), tmp_path / "base")
    cfg = run_file_config(spec, tmp_path)
    assert getattr(cfg, attribute) == expected
    assert getattr(base, attribute) != expected, "the case must change the field from the base specification"


def test_the_run_file_is_a_valid_run_with_the_plans_layout(tmp_path):
    spec = JobSpec.model_validate(BASE)
    cfg = run_file_config(spec, tmp_path)
    cfg.validate()
    plan = plan_for(spec)
    assert cfg.stages == [s["layers"] for s in plan["stages"]] and cfg.replicas == [s["replicas"] for s in plan["stages"]]
    assert cfg.checkpoint_dir == str(tmp_path / "ckpt") and cfg.resume and cfg.resume_at_most == 3
    command = runner.train_command(5, tmp_path / "run.json", attempt=2)
    assert command[-7:] == ["--config", str(tmp_path / "run.json"), "--job-id", "5", "--attempt", "2", "--json"]


def test_a_jobs_own_schedule_file_reaches_a_fresh_process_through_the_run_file(tmp_path):
    """A stage process started afresh (spawned, or on another host) has only the run file: the
    schedule is built there from the file's text, as torch wrote it."""
    import subprocess
    import sys

    spec = JobSpec.model_validate(merged({"layout": CUSTOM}))
    assert spec.problems() == []
    run_file_config(spec, tmp_path)
    probe = ("import sys; from pipeboard.trainer.runtime.run_config import RunConfig; "
             "from pipeboard.trainer.schedule import build; from pipeboard.trainer.schedule.torchcsv import export_rows, dumps; "
             "cfg = RunConfig.load(sys.argv[1]); cfg.validate(); "
             "print(dumps(export_rows(build(cfg.schedule, 2, cfg.microbatches, chunks=cfg.chunks))), end='')")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "run.json")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == TORCH_ZBV.splitlines()


def test_a_jobs_own_schedule_file_is_never_listed_in_the_process_that_checks_or_runs_it(tmp_path):
    """Checking the job and writing its run file register nothing; the schedule the run registers
    from the file is found by its name but listed nowhere (GET /schedules, the OpenAPI enums, the
    capability queries), and a request cannot name it: a job names `custom` with its file."""
    from pipeboard.trainer.schedule import registry
    from pipeboard.trainer.schedule.torchcsv import register_text, text_schedule_name

    before = registry.names()
    spec = JobSpec.model_validate(merged({"layout": CUSTOM}))
    assert spec.problems() == []
    name = run_file_config(spec, tmp_path).schedule
    assert name == text_schedule_name(TORCH_ZBV) and registry.names() == before and not registry.known(name)
    try:
        assert register_text(TORCH_ZBV).name == name and registry.get(name).chunks and registry.known(name)
        assert registry.names() == before and name not in registry.having(chunks=True)
        assert not registry.listed(name)
        with pytest.raises(Exception, match="layout.schedule"):
            JobSpec.model_validate(merged({"layout": {"schedule": name}}))
    finally:
        registry.unregister(name)
    assert not registry.known(name) and register_text(TORCH_ZBV).name == name  # registered again after removal
    registry.unregister(name)


def test_a_run_file_with_a_key_the_run_does_not_have_is_refused_by_name(tmp_path):
    cfg = run_file_config(JobSpec.model_validate(BASE), tmp_path).to_dict()
    with pytest.raises(ConfigError, match="^devices: not a field of the run configuration"):
        RunConfig.from_dict({**cfg, "devices": "cuda"})
    del cfg["schedule"]
    with pytest.raises(ConfigError, match="^schedule: the run configuration needs it"):
        RunConfig.from_dict(cfg)


def test_pipeboard_train_reads_the_run_file_and_refuses_flags_beside_it(tmp_path):
    from typer.testing import CliRunner

    from pipeboard.app.cli import cli as cli_app

    path = tmp_path / "run.json"
    path.write_text(json.dumps({**run_file_config(JobSpec.model_validate(BASE), tmp_path).to_dict(), "colour": 1}))
    refused = CliRunner().invoke(cli_app, ["train", "--config", str(path)])
    assert refused.exit_code == 2 and "colour: not a field of the run configuration" in refused.output
    both = CliRunner().invoke(cli_app, ["train", "--config", str(path), "--steps", "3"])
    assert both.exit_code == 2 and "--steps: with --config the run file gives every run option" in both.output


def test_the_flat_version_1_body_is_stored_as_version_2():
    flat = {"model": "mlp-digits", "model_args": {"hidden": 8}, "schedule": "1f1b", "microbatches": 2, "batch_size": 16,
            "stop": {"target": 0.9}, "hyperparameters": {"lr": 0.1, "optimizer": "sgd", "eval_every": 4, "chunks": 1},
            "checkpoint_every": 5, "max_attempts": 3, "nodes": 1, "priority": 2}
    spec = JobSpec.model_validate(flat)
    assert spec.model.args == {"hidden": 8} and spec.length.target == 0.9 and spec.length.eval_every == 4
    assert spec.optimizer.name == "sgd" and spec.checkpoints.every == 5 and spec.checkpoints.max_attempts == 3
    assert spec.priority == 2 and spec.version == 2


# --- the door: what a probe of the API found, each a 422 naming the field, nothing queued --------


def post(client, body: Any, raw: str | None = None):
    if raw is not None:
        return client.post("/api/v1/jobs", content=raw, headers={"Content-Type": "application/json"})
    return client.post("/api/v1/jobs", json=body)


REFUSED = [
    ("cuda without a GPU worker", merged({"machine": {"device": "cuda"}}), None,
     "machine.device: device cuda: no live worker reports a GPU"),
    ("a top-level device (version 1)", {"model": "mlp-digits", "device": "cuda"}, None,
     "device: Extra inputs are not permitted"),
    ("an unknown field in a section", merged({"layout": {"workers": 2, "gpus": 1}}), None,
     "layout.gpus: Extra inputs are not permitted"),
    ("memory_bytes: Infinity", None, json.dumps(merged({"layout": {"memory_bytes": float("inf")}})),
     "layout.memory_bytes: Input should be a finite number"),
    ("length.target: NaN", None, json.dumps(merged({"length": {"target": float("nan")}})),
     "length.target: Input should be a finite number"),
    ("length.target: \"nan\"", merged({"length": {"target": "nan"}}), None,
     "length.target: Input should be a finite number"),
    ("microbatches 64, batch 32", merged({"layout": {"microbatches": 64}}), None,
     "layout.microbatches: 64 microbatches do not divide model.batch_size 32 evenly"),
    ("chunks 16 under 1f1b", merged({"layout": {"chunks": 16}}), None,
     "layout.chunks: 1f1b runs one chunk per worker"),
    ("vertical sync under 1f1b", merged({"layout": {"vertical_sync": True}}), None,
     "layout.vertical_sync: 1f1b has no vertical sync"),
    ("a deadlocked schedule file", merged({"layout": {"schedule": "custom", "schedule_file": DEADLOCKED}}), None,
     "layout.schedule_file: deadlock: rank 1 waits at 1B0 for 1F0, which it runs only later"),
    ("a schedule file missing an action", merged({"layout": {"schedule": "custom", "schedule_file": "0F0,0B0\n1F0\n"}}),
     None, "layout.schedule_file: rank 1: 1B0 is missing"),
    ("a schedule file for another layout", merged({"layout": {**CUSTOM, "microbatches": 2}}), None,
     "layout.schedule_file: written for 2 workers x 2 chunks and 4 microbatches; the job has layout.workers 2, "
     "layout.chunks 2, layout.microbatches 2"),
    ("custom without a schedule file", merged({"layout": {"schedule": "custom"}}), None,
     "layout: schedule 'custom' and schedule_file go together"),
    ("nodes 2 on one host", merged({"layout": {"workers": 2, "nodes": 2}}), None,
     "layout.nodes: the job needs 2 hosts; 1 host(s) have a live worker (host-a)"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_what_the_specification_cannot_be_is_a_422_naming_the_field(case, client, session):
    _, body, raw, message = case
    session.add(WorkerHeartbeat(hostname="celery@host-a", pid=1, host="host-a", pool="prefork", concurrency=1,
                                seen_at=datetime.now(timezone.utc)))
    session.flush()
    before = session.query(Job).count()
    answer = post(client, body, raw)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith(message), answer.json()["detail"]
    assert session.query(Job).count() == before


def test_a_profile_job_keeps_its_device_and_repeats(client):
    answer = client.post("/api/v1/profiles", json={"model": "mlp-digits", "batch_size": 8, "repeats": 2})
    assert answer.status_code == 202, answer.text
    spec = answer.json()["spec"]
    assert spec["repeats"] == 2 and spec["machine"]["device"] == "cpu" and spec["model"]["batch_size"] == 8
