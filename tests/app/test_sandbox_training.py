"""A job's training in the sandbox: the stage processes, which run the user's factory, find
neither another user's context, nor the database file, nor the token table, nor the worker's
settings; the job's own files and data work; and the run's steps still reach the database, on
SQLite and on PostgreSQL, through the relay outside the sandbox (app/services/run_relay.py)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import textwrap
import uuid

import pytest
from sqlalchemy import func, select, update

from pipeboard.app.core.config import get_settings
from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import Job, JobStatus, MetricPoint
from pipeboard.app.schemas import JobSpec
from pipeboard.app.services import runner, sandbox
from tests.app.test_services_support import live_db, new_job  # noqa: F401  (fixture)

# The factory reports each read as "READ" or the error that stopped it, into its own folder, once
# per process and phase, then builds the zoo's MLP: the job trains.
PROBING_FACTORY = textwrap.dedent('''
    import json, os, sqlite3, sys

    from pipeboard.trainer.zoo import get


    def attempt(read):
        try:
            read()
            return "READ"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"


    def make_task(data=None, hidden=16):
        with open("targets.json") as fh:
            targets = json.load(fh)

        def table():
            with sqlite3.connect(f"file:{targets['database']}?mode=ro", uri=True) as db:
                return db.execute("select secret from tokens").fetchall()

        def settings():
            if "PIPEBOARD_DATABASE_URL" not in os.environ:
                raise KeyError("PIPEBOARD_DATABASE_URL")

        phase = "profile" if any("profile_run" in a for a in sys.argv) else "train"
        report = {
            "other user's context": attempt(lambda: open(targets["other_context"]).read()),
            "database file": attempt(lambda: open(targets["database"], "rb").read()),
            "the job's database": attempt(lambda: open(targets["live_database"], "rb").read(16)),
            "token table": attempt(table),
            "worker's settings": attempt(settings),
            "own file": attempt(lambda: open("targets.json").read()),
            "own data": attempt(lambda: open(data).read()),
            "own folder writable": attempt(lambda: open(f"written-{os.getpid()}.txt", "w").write("x")),
        }
        with open(f"reads-{phase}-{os.getpid()}.json", "w") as fh:
            json.dump(report, fh)
        return get("mlp-digits", hidden=hidden)
''')
SECRETS = ("other user's context", "database file", "the job's database", "token table", "worker's settings")
OWN = ("own file", "own data", "own folder writable")
STEPS = 6


@pytest.fixture
def sandbox_on(monkeypatch):
    if sandbox.probe() is not None:  # CI installs bubblewrap (.ci/run): there this fails rather than skip
        pytest.fail(f"bubblewrap cannot run here: {sandbox.probe()}")
    monkeypatch.setenv("PIPEBOARD_SANDBOX", "on")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_a_jobs_training_reads_none_of_the_servers_files_and_its_steps_reach_the_database(live_db, sandbox_on, tmp_path):
    data_dir = get_settings().data_dir
    other = data_dir / "contexts" / uuid.uuid4().hex / "their_task.py"  # another user's unpacked context
    other.parent.mkdir(parents=True)
    other.write_text("SECRET = 'theirs'\n")
    database = data_dir / f"server-{uuid.uuid4().hex}.sqlite"  # a database with a token table, in the data folder
    with sqlite3.connect(database) as db:
        db.execute("create table tokens (secret text)")
        db.execute("insert into tokens values ('pb_secret')")
    data = tmp_path / "own-data.txt"  # the job's data, outside its folder
    data.write_text("1 2 3\n")
    spec = JobSpec.model_validate({
        "model": {"name": "probe_task.py:make_task", "args": {"hidden": 16}, "batch_size": 16, "data": str(data)},
        "layout": {"workers": 2, "schedule": "1f1b", "microbatches": 4}, "length": {"steps": STEPS}})
    job_id = new_job("queued", kind="train")
    with get_sessionmaker()() as s:
        s.execute(update(Job).where(Job.id == job_id).values(spec=spec.model_dump(mode="json")))
        s.commit()
        attempt = s.get(Job, job_id).attempt
    workdir = data_dir / "jobs" / str(job_id) / f"attempt-{attempt}"  # where the job's code runs (no context: its folder)
    shutil.rmtree(workdir, ignore_errors=True)  # the session's data folder: another database's job of this id
    workdir.mkdir(parents=True)
    (workdir / "probe_task.py").write_text(PROBING_FACTORY)
    live_database = live_db.removeprefix("sqlite:///") if live_db.startswith("sqlite") else str(database)
    (workdir / "targets.json").write_text(json.dumps({"other_context": str(other), "database": str(database),
                                                      "live_database": live_database}))
    try:
        assert runner.run_next("t") == job_id
        with get_sessionmaker()() as s:
            job = s.get(Job, job_id)
            points = s.scalar(select(func.count()).select_from(MetricPoint).where(MetricPoint.job_id == job_id))
            logs = {p.name: p.read_text()[-3000:] for p in workdir.glob("*.log")}
            assert job.status == JobStatus.SUCCEEDED, (job.error, logs)
            assert job.summary["steps"] == STEPS and points >= STEPS, (job.summary, points)
        reports = {path.name: json.loads(path.read_text()) for path in workdir.glob("reads-*.json")}
        phases = {name.split("-")[1] for name in reports}
        assert phases == {"profile", "train"}, reports  # the launcher and stage processes: train
        for name, report in reports.items():
            for what in SECRETS:
                assert report[what] != "READ", (name, what, report)
            assert all(report[what] == "READ" for what in OWN), (name, report)
            assert "No such file" in report["other user's context"] and "No such file" in report["database file"]
            assert "unable to open database" in report["token table"]
    finally:
        database.unlink()
        other.unlink()


# A run that reports it started, and on SIGTERM hands over its summary through the relay.
HANDING_OVER = textwrap.dedent('''
    import os, sys, time
    from pipeboard.app.core.lifetime import Terminated, raise_on_sigterm
    from pipeboard.app.services.run_relay import RelaySink

    sink = RelaySink(os.environ["PIPEBOARD_RELAY"])
    raise_on_sigterm()
    node = os.environ.get("PIPEBOARD_NODE_NAME") or __import__("socket").gethostname()
    sink.on_status("running", "started", pids={0: os.getpid()}, hosts={0: node})
    try:
        while True:
            time.sleep(0.05)
    except Terminated:
        sink.on_summary({"handed_over": True, "sees_database": "PIPEBOARD_DATABASE_URL" in os.environ})
        sys.exit(143)
''')


def test_sigterm_to_the_relay_reaches_the_sandboxed_run_which_hands_over_before_it_ends(live_db, sandbox_on, tmp_path):
    """A cancel, the time limit or the worker's death signal the relay's group; bwrap passes no
    signal on, so the relay does, and records what the run hands over before it exits."""
    import signal
    import time

    from pipeboard.app.models import JobEvent
    from pipeboard.app.services import proctree

    job_id = new_job("running", kind="train")
    cmd, env = sandbox.for_phase("train", [sys.executable, "-c", HANDING_OVER, "--job-id", str(job_id)],
                                 runner.child_env(), cwd=str(tmp_path), workdir=tmp_path)
    assert "pipeboard.app.services.run_relay" in cmd and "bwrap" in " ".join(cmd)
    with open(tmp_path / "run.log", "wb") as log:
        proc = proctree.spawn(cmd, env=env, cwd=str(tmp_path), stdout=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            with get_sessionmaker()() as s:
                event = s.scalar(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "progress"))
                if event is not None:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
            time.sleep(0.1)
        # the pid it reported (its process namespace's) is recorded as this host knows it
        pid = event.payload["pids"]["0"]
        assert pid in proctree.members(proc) and b"handed_over" in open(f"/proc/{pid}/cmdline", "rb").read()
        os.killpg(proc.pid, signal.SIGTERM)  # as runner.kill_child does
        # its exit 143 (128 + SIGTERM) comes out of bwrap as from a process SIGTERM ended: the relay says so
        assert proc.wait(timeout=30) == -signal.SIGTERM, (tmp_path / "run.log").read_text()
    finally:
        proctree.end(proc)
    with get_sessionmaker()() as s:
        assert s.get(Job, job_id).summary == {"handed_over": True, "sees_database": False, "attempt": 0}
