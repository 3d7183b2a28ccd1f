"""Users' code in bubblewrap: a factory that reaches for another user's context, the database file,
the token table and the worker's settings finds none of them, while its own files and data work."""

from __future__ import annotations

import json
import os
import sqlite3
import textwrap
import uuid
from pathlib import Path

import pytest

from pipeboard.app.core.config import get_settings
from pipeboard.app.services import model_checks, sandbox

# What the factory tries, each read reported as "READ" or the error that stopped it; it writes
# the report into its own folder and then refuses to build (validation needs nothing more).
PROBING_FACTORY = textwrap.dedent('''
    import json, os, sqlite3

    def attempt(read):
        try:
            read()
            return "READ"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    def make_task(other_context, database, worker_pid, data=None, **kwargs):
        def table():
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
                return db.execute("select secret from tokens").fetchall()

        def settings():
            if "PIPEBOARD_DATABASE_URL" not in os.environ:
                raise KeyError("PIPEBOARD_DATABASE_URL")

        report = {
            "other user's context": attempt(lambda: open(other_context).read()),
            "database file": attempt(lambda: open(database, "rb").read()),
            "token table": attempt(table),
            "worker's environment": attempt(lambda: open(f"/proc/{worker_pid}/environ", "rb").read()),
            "worker's settings": attempt(settings),
            "own file": attempt(lambda: open("own.txt").read()),
            "own data": attempt(lambda: open(data).read()),
            "own folder writable": attempt(lambda: open("written.txt", "w").write("x")),
        }
        with open("report.json", "w") as fh:
            json.dump(report, fh)
        raise RuntimeError("reported")
''')
SECRETS = ("other user's context", "database file", "token table", "worker's environment", "worker's settings")
OWN = ("own file", "own data", "own folder writable")


@pytest.fixture
def server_files(monkeypatch):
    """Another user's unpacked context and a database with a token table, in the worker's data
    folder, and the database's URL in the worker's environment."""
    data_dir = get_settings().data_dir
    other = data_dir / "contexts" / uuid.uuid4().hex / "their_task.py"
    other.parent.mkdir(parents=True)
    other.write_text("SECRET = 'theirs'\n")
    database = data_dir / f"sandbox-test-{uuid.uuid4().hex}.db"
    with sqlite3.connect(database) as db:
        db.execute("create table tokens (secret text)")
        db.execute("insert into tokens values ('pb_secret')")
    monkeypatch.setenv("PIPEBOARD_DATABASE_URL", f"sqlite:///{database}")
    yield other, database
    database.unlink()
    other.unlink()


def probe_with(mode: str, tmp_path: Path, other: Path, database: Path, monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("PIPEBOARD_SANDBOX", mode)
    get_settings.cache_clear()
    try:
        project = tmp_path / mode / "project"
        project.mkdir(parents=True)
        (project / "factory.py").write_text(PROBING_FACTORY)
        (project / "own.txt").write_text("mine\n")
        data = tmp_path / mode / "data.txt"  # data outside the project, named by the model
        data.write_text("1 2 3\n")
        config = {"other_context": str(other), "database": str(database), "worker_pid": os.getpid()}
        result = model_checks.run_validation("factory.py:make_task", config, str(data), project,
                                             time_limit_s=120, memory_bytes=4 << 30)
        assert "reported" in result["message"], result
        return json.loads((project / "report.json").read_text())
    finally:
        get_settings.cache_clear()


def test_without_the_sandbox_a_factory_reads_everything_the_worker_can(tmp_path, server_files, monkeypatch):
    report = probe_with("off", tmp_path, *server_files, monkeypatch)
    assert all(report[what] == "READ" for what in SECRETS + OWN), report


def test_in_the_sandbox_each_secret_read_fails_and_its_own_files_and_data_work(tmp_path, server_files, monkeypatch):
    if sandbox.probe() is not None:
        pytest.skip(sandbox.probe())
    report = probe_with("on", tmp_path, *server_files, monkeypatch)
    for what in SECRETS:
        assert report[what] != "READ", (what, report)
    assert "No such file" in report["other user's context"] and "No such file" in report["database file"]
    assert "unable to open database" in report["token table"]
    assert all(report[what] == "READ" for what in OWN), report


def test_on_refuses_to_run_users_code_where_bubblewrap_cannot(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEBOARD_SANDBOX", "on")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    get_settings.cache_clear()
    sandbox.probe.cache_clear()
    try:
        result = model_checks.run_validation("factory.py:make_task", {}, None, tmp_path, time_limit_s=60,
                                             memory_bytes=4 << 30)
    finally:
        sandbox.probe.cache_clear()
        get_settings.cache_clear()
    assert not result["ok"] and "PIPEBOARD_SANDBOX=on" in result["message"] and "bubblewrap" in result["message"]


def test_the_environment_loses_the_server_s_settings_and_secrets_but_keeps_the_trainer_s():
    env = sandbox.clean_env({"PIPEBOARD_DATABASE_URL": "postgresql://u:p@h/db", "PIPEBOARD_BROKER_URL": "redis://",
                             "PIPEBOARD_DATA_DIR": "/srv/data", "PIPEBOARD_CPU_MATMUL": "onednn",
                             "PIPEBOARD_TREE": "abc", "HF_TOKEN": "hf_x", "AWS_SECRET_ACCESS_KEY": "k",
                             "PATH": "/usr/bin", "OMP_NUM_THREADS": "2"})
    assert env == {"PIPEBOARD_CPU_MATMUL": "onednn", "PIPEBOARD_TREE": "abc", "PATH": "/usr/bin", "OMP_NUM_THREADS": "2"}
