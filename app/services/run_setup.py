"""What a job's run is started with: the run file (trainer/runtime/run_config.py's RunConfig from the
job's specification and plan), the `pipeboard train` command that reads it, the environment of
the phases' child processes, and where the job's checkpoints live. The job runner
(app/services/runner.py) and a member host (app/services/member.py) start runs with these.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeboard.app.core.config import get_settings
from pipeboard.app.models import Job
from pipeboard.app.schemas import JobSpec
from pipeboard.app.schemas.jobspec import run_fields, stored


def child_env() -> dict[str, str]:
    """The worker's settings, passed on explicitly so the run writes where the worker reads."""
    st = get_settings()
    env = dict(os.environ)
    env.update(
        PIPEBOARD_DATA_DIR=str(st.data_dir),
        PIPEBOARD_DATABASE_URL=st.database_url,
        PIPEBOARD_BROKER_URL=st.broker_url,
        PIPEBOARD_RESULT_BACKEND=st.result_backend,
        PIPEBOARD_REDIS_URL=st.redis_url,
        PIPEBOARD_RUN_GROUP="1",  # tells DbSink it may end its own process group on cancel
        PIPEBOARD_PARENT_PID=str(os.getpid()),  # a run ends when this worker dies (app/core/lifetime.py)
        PIPEBOARD_NODE_NAME=st.node_name,  # the host the run's workers report (timelines say it)
        PYTHONUNBUFFERED="1",
        # `python -m` runs in the job's code context: the folder must not come first on sys.path,
        # where a project's `profile.py` would replace the standard library's (it goes last).
        PYTHONSAFEPATH="1",
    )
    return env


def pipeboard_command() -> list[str]:
    script = Path(sys.executable).with_name("pipeboard")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from pipeboard.app.cli import main; main()"]


def spec_of(job: Job) -> JobSpec:
    """The job's specification, typed (rows are version 2: migration 0005 converted older ones)."""
    return stored(job.spec)


def checkpoint_dir(job_id: int) -> Path:
    """Where a job's checkpoints live, across its attempts: under the data folder."""
    return get_settings().data_dir / "jobs" / str(job_id) / "checkpoints"


# the run trains "forever" under a time rule: the runner stops it at the limit
EPOCHS_UNDER_A_TIME_RULE = 100000.0


def run_config(spec: JobSpec, plan: dict[str, Any], source: str | None = None,
               default_args: dict[str, Any] | None = None, *, checkpoint_dir: Path | None = None,
               recorded: int | None = None) -> dict[str, Any]:
    """The run's configuration (trainer/runtime/run_config.py's RunConfig, plain) from the job's
    specification and its plan: every field of the specification that concerns the run goes here,
    and nowhere else (tests/app/test_jobspec.py fails for one that does not arrive). ``source`` is
    the model's task factory (a registered model's; default the zoo name), with its registered
    arguments under the job's own; with ``checkpoint_dir`` the run checkpoints every
    ``checkpoints.every`` steps and resumes from the newest complete checkpoint at or before
    ``recorded``, the last step the job has measurements of (a lost run may have checkpointed steps
    it never reported: those are trained again)."""
    from pipeboard.trainer.plan.plan_format import Plan
    from pipeboard.trainer.runtime.run_config import RunConfig

    given: dict[str, Any] = {}
    for section_name in type(spec).model_fields:  # every field marked Run(...) goes as it is
        section = getattr(spec, section_name)
        if isinstance(section, BaseModel):
            given.update({run: getattr(section, name) for name, run in run_fields(type(section)).items()})
    if spec.length.time_s is not None:
        given["epochs"] = EPOCHS_UNDER_A_TIME_RULE
    # the model: a registered model's task factory, its registered arguments under the job's own
    if spec.layout.schedule_file is not None:  # the job's own file, named by its content; the run
        # registers it from schedule_csv (runtime/run_config.py), so writing the run file registers nothing here
        from pipeboard.trainer.schedule.torchcsv import text_schedule_name

        given["schedule"] = text_schedule_name(spec.layout.schedule_file)
    cfg = RunConfig(**given, model=source or spec.model.name, model_args={**(default_args or {}), **spec.model.args})
    if checkpoint_dir is not None:
        cfg = cfg.with_(checkpoint_dir=str(checkpoint_dir), checkpoint_keep=get_settings().checkpoint_keep,
                        resume=True, resume_at_most=recorded)
    return cfg.with_plan(Plan.from_dict(plan)).to_dict()


def write_run_file(path: Path, spec: JobSpec, plan: dict[str, Any], source: str | None = None,
                   default_args: dict[str, Any] | None = None, **checkpoints: Any) -> Path:
    """The run's whole configuration as one file, for ``pipeboard train --config``."""
    path.write_text(json.dumps(run_config(spec, plan, source, default_args, **checkpoints), indent=1))
    return path


def train_command(job_id: int, run_path: Path, *, attempt: int = 1) -> list[str]:
    """``pipeboard train`` for the job's attempt: the run file says what to train, the rest whom to report to."""
    return pipeboard_command() + ["train", "--config", str(run_path), "--job-id", str(job_id),
                                  "--attempt", str(attempt), "--json"]
