"""A user's project from CI, end to end on the embedded deployment and on PostgreSQL plus Redis: `pipeboard submit --context DIR
--wait` packs README's example project, uploads it once, a real worker validates it in a
subprocess, the job trains it in its work folder to its target; broken projects end as failed
registrations with their message while the API keeps answering."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.app.test_e2e_support import Deployment, embedded_env, redis_env
from tests.conftest import private_schema, require_postgres, require_redis
from tests.trainer.test_task_package_names import write_project_with_own_packages
from tests.trainer.test_task_user_project import _readme_blocks

pytestmark = pytest.mark.slow
PIPEBOARD = [sys.executable, "-c", "from pipeboard.app.cli import main; main()"]
JOB = {"model": "my_task.py:make_task", "data": "tokens.txt", "workers": 2, "method": "time", "schedule": "1f1b",
       "microbatches": 4, "batch_size": 64, "stop": {"target": 0.9}}


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """The embedded default: SQLite database and broker."""
    workdir = tmp_path_factory.mktemp("e2e-contexts-embedded")
    with Deployment(embedded_env(workdir), workdir).running() as dep:
        yield dep


@pytest.fixture(scope="module")
def postgres_redis(tmp_path_factory):
    """PostgreSQL (a schema of its own) with Redis as broker."""
    workdir = tmp_path_factory.mktemp("e2e-contexts-postgres")
    database, drop = private_schema(require_postgres())
    try:
        with Deployment({**redis_env(workdir, require_redis()), "PIPEBOARD_DATABASE_URL": database}, workdir).running() as dep:
            yield dep
    finally:
        drop()


def write_project(where: Path) -> Path:
    task_file, data_script, _ = _readme_blocks()
    where.mkdir(parents=True)
    (where / "my_task.py").write_text(task_file)
    code = data_script.strip().removeprefix("python3 -c ").strip().strip('"')
    subprocess.run([sys.executable, "-c", code], cwd=where, check=True)
    return where


def submit(deployment: Deployment, project: Path, spec: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(spec))
    return subprocess.run([*PIPEBOARD, "submit", str(job_file), "--context", str(project), "--wait", "--url", deployment.url],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **deployment.env},
                          cwd=tmp_path)  # not the project: the context carries it


@pytest.mark.parametrize("where", ["embedded", pytest.param("postgres_redis", marks=[pytest.mark.postgres, pytest.mark.redis])])
def test_a_users_project_trains_to_its_target_from_ci(request, where, tmp_path):
    deployment = request.getfixturevalue(where)
    project = write_project(tmp_path / "project")
    done = submit(deployment, project, JOB, tmp_path)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{deployment.logs()}"
    assert "succeeded" in done.stdout.splitlines()[-1] and "uploaded" in done.stderr
    job = deployment.api("GET", f"/jobs/{int(done.stdout.split()[1])}")
    assert job["summary"]["reached_target"] is True and job["summary"]["best_metric"] >= 0.9, job["summary"]
    if where != "embedded":
        return
    # the same project again: the context is reused, the model too
    again = submit(deployment, project, {**JOB, "stop": {"steps": 2}}, tmp_path)
    assert again.returncode == 0 and "already on the server" in again.stderr, again.stderr
    models = [m for m in deployment.api("GET", "/models")["data"] if m["kind"] == "context"]
    assert len(models) == 1 and models[0]["status"] == "ready"


def test_broken_projects_fail_registration_with_their_message(embedded, tmp_path):
    deployment = embedded
    project = write_project(tmp_path / "broken")
    (project / "my_task.py").write_text((project / "my_task.py").read_text()
                                        + "\n\ndef make_broken(data=None):\n    raise ValueError('tokens file is corrupt')\n")
    raised = submit(deployment, project, {**JOB, "model": "my_task.py:make_broken"}, tmp_path)
    assert raised.returncode == 2 and "failed validation" in raised.stderr and "tokens file is corrupt" in raised.stderr
    missing = submit(deployment, project, {**JOB, "model": "no_such_file.py:make_task"}, tmp_path)
    assert missing.returncode == 2 and "source: 'no_such_file.py:make_task' must name a .py file inside" in missing.stderr, missing.stderr
    assert deployment.api("GET", "/health")["database"] == "ok"  # the API answered throughout


def test_a_project_with_its_own_trainer_and_app_packages_trains(embedded, tmp_path):
    """pipeboard's own packages are pipeboard.trainer and pipeboard.app: a project's top-level
    `trainer` and `app` are its own in validation, profiling and every stage process."""
    project = write_project_with_own_packages(tmp_path / "own-packages")
    job = {"model": "my_task.py:make_task", "workers": 2, "schedule": "1f1b", "microbatches": 2, "batch_size": 16,
           "stop": {"steps": 2}}
    done = submit(embedded, project, job, tmp_path)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{embedded.logs()}"
    model = next(m for m in embedded.api("GET", "/models")["data"] if m["source"] == "my_task.py:make_task"
                 and m["kind"] == "context" and m["status"] == "ready" and m.get("layers") == 3)
    assert model["name"].startswith("ctx-")
