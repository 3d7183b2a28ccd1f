"""`pipeboard up` / `migrate` / `worker` as a user runs them: real processes, real exit codes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import inspect

from pipeboard.app.core.db import make_engine
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def pipeboard(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from pipeboard.app.cli import main; main()", *args],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, naming: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert naming in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_unreachable_database_stops_start_up_with_one_line(tmp_path: Path) -> None:
    # A real process: the exit code and stderr a user sees.
    env = {"PIPEBOARD_DATA_DIR": str(tmp_path), "PIPEBOARD_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:9/none"}
    assert_one_line_error(pipeboard("up", "--port", "1", env=env), "PIPEBOARD_DATABASE_URL")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIPEBOARD_BROKER_URL", "kafka://127.0.0.1:9092"),
        ("PIPEBOARD_BROKER_URL", "redis://127.0.0.1:9/0"),
        ("PIPEBOARD_DATABASE_URL", "oracle://db/x"),
        ("PIPEBOARD_HEARTBEAT_SECONDS", "-1"),
    ],
)
def test_bad_configuration_stops_start_up_with_one_line(
    variable: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from pipeboard.app.cli import cli
    from pipeboard.app.core.config import get_settings

    monkeypatch.setenv("PIPEBOARD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(variable, value)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli, ["up", "--port", "1"])
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert_one_line_error(subprocess.CompletedProcess([], result.exit_code, result.stdout, result.stderr), variable)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10"])
def test_auth_off_is_refused_unless_up_binds_to_loopback(host: str, tmp_path: Path) -> None:
    env = {"PIPEBOARD_DATA_DIR": str(tmp_path), "PIPEBOARD_AUTH": "off"}
    result = pipeboard("up", "--host", host, "--port", "1", env=env)
    assert_one_line_error(result, "PIPEBOARD_AUTH")
    assert f"not {host}" in result.stderr and not (tmp_path / "pipeboard.sqlite").exists()  # nothing was started


def test_worker_refuses_a_daemonic_pool() -> None:
    from typer.testing import CliRunner

    from pipeboard.app.cli import cli

    result = CliRunner().invoke(cli, ["worker", "--pool", "prefork"])
    assert_one_line_error(subprocess.CompletedProcess([], result.exit_code, result.stdout, result.stderr), "--pool")


def test_migrate_builds_the_schema(tmp_path: Path) -> None:
    result = pipeboard("migrate", env={"PIPEBOARD_DATA_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    engine = make_engine(f"sqlite:///{tmp_path}/pipeboard.sqlite")
    assert {"jobs", "timeline_events", "alembic_version"} <= set(inspect(engine).get_table_names())
    engine.dispose()


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def run_up(tmp_path: Path, name: str, workers: int = 1, until: str = "pipeboard is up at") -> tuple[str, str]:
    """`pipeboard up` on a free port until its log shows `until` and /health counts `workers`,
    then SIGTERM; returns its base URL and its whole output."""
    port = free_port()
    env = {**os.environ, "PIPEBOARD_DATA_DIR": str(tmp_path / "data"), "PIPEBOARD_HEARTBEAT_SECONDS": "0.5"}
    log_path = tmp_path / f"{name}.log"
    with open(log_path, "w") as log:
        up = subprocess.Popen(
            [sys.executable, "-c", "from pipeboard.app.cli import main; main()", "up", "--port", str(port), "--workers", str(workers)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        health: dict = {}
        while time.monotonic() < deadline and up.poll() is None:
            if until in log_path.read_text():
                health = get_json(f"{url}/api/v1/health")
                if health["workers"] == workers:
                    break
            time.sleep(0.3)
        devices = health.pop("worker_devices")  # one entry per live worker, each with its GPUs
        assert health == {"database": "ok", "broker": "ok", "workers": workers, "version": health.get("version")}, log_path.read_text()
        assert len(devices) == workers and all("worker" in w and "devices" in w for w in devices), devices
        check_while_up(url, log_path.read_text())
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=40) == 0, log_path.read_text()
    finally:
        if up.poll() is None:  # a failed assertion: still stop the service (and so its children)
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=40)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
    output = log_path.read_text()
    assert "pipeboard stopped" in output
    assert "Traceback" not in output
    with pytest.raises(OSError):
        get_json(f"{url}/api/v1/health")
    return url, output


def check_while_up(url: str, output: str) -> None:
    """While it runs: the token a first start printed signs in as admin and can write."""
    import httpx

    match = re.search(r"http://\S+/#token=(pb_\S+)", output)
    if match:
        me = httpx.get(f"{url}/api/v1/tokens/me", headers={"Authorization": f"Bearer {match.group(1)}"}).json()
        assert me["authenticated"] and me["scope"] == "admin" and me["name"] == "admin"
    anonymous = httpx.post(f"{url}/api/v1/tokens", json={"name": "mine", "scope": "admin"})
    assert anonymous.status_code == 401  # closed from the first start


@pytest.mark.slow
def test_up_serves_health_with_one_worker_and_stops_on_sigterm(tmp_path: Path) -> None:
    run_up(tmp_path, "up")


@pytest.mark.slow
def test_up_prints_an_admin_token_once_on_the_first_start(tmp_path: Path) -> None:
    url, first = run_up(tmp_path, "first", workers=0, until="#token=")
    tokens = re.findall(r"(\S+)/#token=(pb_[A-Za-z0-9_-]+)", first)
    assert len(tokens) == 1 and tokens[0][0] == url, first
    assert first.count(tokens[0][1]) == 1  # shown once, in the URL only
    _, later = run_up(tmp_path, "later", workers=0, until="pipeboard token create")
    assert "#token=" not in later and "pb_" not in later
    assert "sign in with an API token: `pipeboard token create NAME --scope write`" in later


def children_of(pid: int) -> dict[int, str]:
    """Live child processes of ``pid``: {pid: command line}."""
    found = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(c): "" for c in (task / "children").read_text().split()}
        except OSError:
            continue
    for child in list(found):
        try:
            found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            del found[child]
    return found


def wait_for(predicate, timeout: float, what: str, log_path: Path):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}\n{log_path.read_text()}")
        time.sleep(0.2)


def child_pid(up: subprocess.Popen, marker: str, other_than: int | None = None) -> int | None:
    pids = [p for p, cmd in children_of(up.pid).items() if marker in cmd and p != other_than]
    return pids[0] if pids else None


@pytest.mark.slow
def test_up_keeps_the_service_and_a_job_going_through_a_killed_worker_and_a_killed_api(tmp_path: Path) -> None:
    """SIGKILL the worker while a job trains: the API stays up, `up` restarts the worker, the job
    resumes on attempt 2 from its checkpoint; SIGKILL the API during attempt 2: `up` restarts it
    and a client resuming with Last-Event-ID sees every event once. SIGTERM still stops it all."""
    import httpx

    from tests.app.test_e2e_support import FAULT_JOB, Deployment, KillAfterCheckpoint, check_resumed_run, group_alive

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = {"PIPEBOARD_DATA_DIR": str(tmp_path / "data"), "PIPEBOARD_HEARTBEAT_SECONDS": "0.5"}
    log_path = tmp_path / "up.log"
    with open(log_path, "w") as log:
        up = subprocess.Popen([sys.executable, "-c", "from pipeboard.app.cli import main; main()", "up", "--port", str(port),
                               "--workers", "1"], cwd=ROOT, env={**os.environ, **data}, stdout=log, stderr=subprocess.STDOUT,
                              text=True)
    dep = None
    try:
        wait_for(lambda: "pipeboard is up at" in log_path.read_text(), 60, "the start", log_path)
        wait_for(lambda: get_json(f"{url}/api/v1/health")["workers"] == 1, 60, "the worker", log_path)
        dep = Deployment(dict(data), tmp_path)  # a client of it (the database is `up`'s, migrated)
        dep.url = url
        job_id = dep.api("POST", "/jobs", json=FAULT_JOB)["id"]
        worker, api = child_pid(up, "celery"), child_pid(up, "uvicorn")
        messages, groups = [], set()

        def kill_the_worker() -> None:
            assert child_pid(up, "celery") == worker
            os.kill(worker, signal.SIGKILL)

        # the worker's kill loses the reports it had not written yet: wait for the service to have step
        # 100, so that the checkpoint there is one the next attempt may resume from
        cutter = KillAfterCheckpoint(dep, job_id, [tmp_path / "data"], kill_the_worker, step=100, recorded=True)
        try:
            for message in dep.events(job_id, timeout=300):
                messages.append(message)
                if message["event"] == "progress" and message["data"].get("phase") == "running":
                    groups.add(dep.job_row(job_id).pgid)
                if message["event"] == "attempt" and message["data"]["attempt"] == 2:
                    assert get_json(f"{url}/api/v1/health")["database"] == "ok"  # the API stayed up
                    os.kill(api, signal.SIGKILL)  # the stream breaks here
        except httpx.HTTPError:
            pass
        assert cutter.killed_at is not None, repr(cutter.error)
        # the stream broke after attempt 2's start (messages already read with it may follow it)
        assert any(m["event"] == "attempt" and m["data"]["attempt"] == 2 for m in messages), messages[-3:]
        wait_for(lambda: "the API server is back at" in log_path.read_text(), 60, "the API to come back", log_path)
        rest = list(dep.events(job_id, last_id=int(messages[-1]["id"]), timeout=300))
        check_resumed_run(dep, job_id, messages + rest[1:], FAULT_JOB["stop"]["steps"])
        output = log_path.read_text()
        node = re.search(r"worker (pipeboard1@\S+) exited with code -9 \(SIGKILL\) after [\d.]+ s; restarting it in 0\.5 s "
                         r"\(restart 1\)", output)
        assert node, output
        # `up` ends the attempt the moment it sees its worker die, unless the reaper saw the worker's
        # heartbeats go stale first (0.5 s heartbeats here: on a loaded machine it can)
        assert (f"job {job_id}: attempt 1 failed, attempt 2 queued (attempt 1 lost: its worker {node.group(1)} exited" in output
                or f"job {job_id}: worker" in output and "stopped sending heartbeats" in output), output
        assert "the API server exited with code -9 (SIGKILL)" in output
        new_worker = child_pid(up, "celery")
        assert new_worker not in (None, worker) and child_pid(up, "uvicorn") not in (None, api)
        health = get_json(f"{url}/api/v1/health")
        assert len(health.pop("worker_devices")) == 1
        assert health == {"database": "ok", "broker": "ok", "workers": 1, "version": ANY_VERSION}
        groups.add(dep.job_row(job_id).pgid)
        survivors = list(children_of(up.pid))
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=40) == 0, log_path.read_text()
    finally:
        if dep is not None:
            dep.close()
        if up.poll() is None:
            up.kill()
            up.wait()
    output = log_path.read_text()
    assert "pipeboard stopped" in output and "Traceback" not in output
    time.sleep(0.2)
    assert not [p for p in survivors if Path(f"/proc/{p}").exists() and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert not any(group_alive(g) for g in groups)


class _AnyVersion:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)


ANY_VERSION = _AnyVersion()
