"""The CI command line: token creation, spec checking, one-line errors and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT

CLI = [sys.executable, "-c", "from pipeboard.app.cli import main; main()"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, **(env or {})})


def test_example_job_spec_is_valid():
    from pipeboard.app.schemas import JobSpec

    spec = JobSpec.model_validate(yaml.safe_load((ROOT / "examples" / "job.yaml").read_text()))
    assert spec.model.name == "mlp-digits" and spec.length.steps == 40 and spec.problems() == []


def test_bad_specs_fail_offline_with_one_line(tmp_path: Path):
    missing = run("submit", str(tmp_path / "nope.yaml"), "--url", "http://127.0.0.1:9")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "nope.yaml" in missing.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: mlp-digits\nstop: {steps: 1, epochs: 2}\n")
    rule = run("submit", str(bad), "--url", "http://127.0.0.1:9")
    assert rule.returncode == 2 and "length: give exactly one" in rule.stderr and "Traceback" not in rule.stderr
    bad.write_text("version: 2\nmodel: {name: mlp-digits, batch_size: 32}\nlayout: {microbatches: 64}\n")
    uneven = run("submit", str(bad), "--url", "http://127.0.0.1:9")
    assert uneven.returncode == 2 and "layout.microbatches: 64 microbatches do not divide" in uneven.stderr
    bad.write_text("model: [unclosed\n")
    assert run("submit", str(bad)).returncode == 2


def test_unreachable_server_is_one_line(tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text("model: mlp-digits\n")
    down = run("jobs", "list", "--url", "http://127.0.0.1:9")
    assert down.returncode == 1 and down.stderr.startswith("error: cannot reach") and "Traceback" not in down.stderr
    via_env = run("submit", str(spec), env={"PIPEBOARD_URL": "http://127.0.0.1:9"})
    assert via_env.returncode == 1 and "127.0.0.1:9" in via_env.stderr


def test_token_create_prints_the_secret_once(tmp_path: Path):
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from pipeboard.app.core.db import make_engine
    from pipeboard.app.models import ApiToken, Base
    from pipeboard.app.services.tokens import hash_token

    url = f"sqlite:///{tmp_path}/t.sqlite"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    env = {"PIPEBOARD_DATABASE_URL": url}
    made = run("token", "create", "ci", "--scope", "write", "--expires-in", "30d", env=env)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("pb_") and secret not in made.stderr and "expires" in made.stderr
    with Session(engine) as s:
        row = s.scalar(select(ApiToken))
        assert row.name == "ci" and row.scope.value == "write" and row.token_hash == hash_token(secret)
        now = datetime.now(timezone.utc)
        assert now + timedelta(days=29) < row.expires_at <= now + timedelta(days=30)
    admin = run("token", "create", "--name", "ops", "--scope", "admin", env=env)  # --name, as before
    assert admin.returncode == 0, admin.stderr
    with Session(engine) as s:
        assert s.scalar(select(ApiToken).where(ApiToken.name == "ops")).scope.value == "admin"
    for bad, naming in ((["x", "--scope", "root"], "--scope"), (["x", "--expires-in", "soon"], "--expires-in"),
                        (["x", "--expires-in", "0d"], "--expires-in"), ([], "NAME"), (["bad/name"], "NAME")):
        refused = run("token", "create", *bad, env=env)
        assert refused.returncode == 2 and naming in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    engine.dispose()


def test_jobs_commands_against_a_server(tmp_path: Path):
    """list/show/cancel/retry over HTTP with a token from the environment (no worker: jobs stay queued)."""
    import json

    from sqlalchemy.orm import Session

    from pipeboard.app.core.db import make_engine
    from pipeboard.app.services.tokens import create_token
    from tests.app.test_e2e_support import Deployment, embedded_env
    from tests.conftest import settings_from_env

    dep = Deployment(embedded_env(tmp_path), tmp_path)
    try:
        engine = make_engine(settings_from_env(dep.env).database_url)
        with Session(engine) as s:
            _, write = create_token(s, "ci", "write")
            _, read = create_token(s, "viewer", "read")
            s.commit()
        engine.dispose()
        dep.start_server()
        env = {**dep.env, "PIPEBOARD_URL": dep.url, "PIPEBOARD_TOKEN": write}
        spec = tmp_path / "job.yaml"
        spec.write_text("model: mlp-digits\nstop: {steps: 2}\npriority: 3\n")
        submitted = run("submit", str(spec), env=env)
        assert submitted.returncode == 0 and "queued (position 1)" in submitted.stdout, submitted.stderr
        job_id = submitted.stdout.split()[1]
        listed = json.loads(run("jobs", "list", "--json", env=env).stdout)
        assert listed["count"] == 1 and listed["data"][0]["priority"] == 3
        assert json.loads(run("jobs", "show", job_id, env=env).stdout)["status"] == "queued"
        denied = run("jobs", "cancel", job_id, "--token", read, env=env)
        assert denied.returncode == 1 and "403" in denied.stderr and "write token" in denied.stderr
        assert f"job {job_id} cancelled" in run("jobs", "cancel", job_id, env=env).stdout
        again = run("jobs", "cancel", job_id, env=env)
        assert again.returncode == 2 and "already cancelled" in again.stderr
        assert "queued (attempt 2)" in run("jobs", "retry", job_id, env=env).stdout
    finally:
        dep.close()
