"""Users kept apart, for bench/sandbox.py: user B's factory (its validation, then a job) tries to read
user A's unpacked context, the database file, the token table, the worker's /proc environ and
settings, and its own file and data, with PIPEBOARD_SANDBOX=off, then on. Each user has a token of
their own (`pipeboard token create NAME --user NAME`) and uploads README's example project."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from bench.sandbox_deploy import SMALL_JOB, deployment, upload, validated
from bench.service_probe import ROOT, Served, finished

PROBE_FACTORY = textwrap.dedent('''
    """User B's project: before building its task, it reads what it should not."""
    import json, os, sqlite3, sys

    from my_task import make_task as build


    def attempt(read):
        try:
            read()
            return "READ"
        except Exception as exc:
            return f"refused ({type(exc).__name__}: {str(exc)[:60]})"


    def make_task(data=None, **kwargs):
        with open("targets.json") as fh:
            targets = json.load(fh)

        def table():
            with sqlite3.connect(f"file:{targets['database']}?mode=ro", uri=True) as db:
                return db.execute("select count(*) from api_tokens").fetchall()

        def settings():
            if "PIPEBOARD_DATABASE_URL" not in os.environ and "PIPEBOARD_DATA_DIR" not in os.environ:
                raise KeyError("no PIPEBOARD_DATABASE_URL, no PIPEBOARD_DATA_DIR")

        phase = "validation" if any("validate" in a for a in sys.argv) else (
            "profile" if any("profile_run" in a for a in sys.argv) else "train")
        report = {"phase": phase,
                  "user A's context": attempt(lambda: open(targets["other_context"]).read()),
                  "the database file": attempt(lambda: open(targets["database"], "rb").read(16)),
                  "the token table (sqlite3)": attempt(table),
                  "the worker's environment (/proc)": attempt(lambda: open(f"/proc/{targets['worker_pid']}/environ", "rb").read()),
                  "the worker's settings (env)": attempt(settings),
                  "its own file": attempt(lambda: open("my_task.py").read(16)),
                  "its own data": attempt(lambda: open(data).read(16))}
        with open(f"reads-{phase}-{os.getpid()}.json", "w") as fh:
            json.dump(report, fh)
        return build(data=data, **kwargs)
''')


def readme_project(where: Path) -> Path:
    """README's example of a user's own project ("Your own model and data"), in ``where``: its
    task file as my_task.py, and tokens.txt written by its data script."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Your own model and data", 1)[1].split("\n## ", 1)[0]
    task_file = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    data_script = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    where.mkdir(parents=True)
    (where / "my_task.py").write_text(task_file)
    code = data_script.strip().removeprefix("python3 -c ").strip().strip('"')
    subprocess.run([sys.executable, "-c", code], cwd=where, check=True)
    return where


def register(client: Any, name: str, source: str, sha: str) -> dict[str, Any]:
    """Model ``name`` registered from the uploaded context ``sha`` (data tokens.txt), once validated."""
    client.post("/models", json={"name": name, "source": source, "context": sha, "data": "tokens.txt"}).raise_for_status()
    return validated(client, name)


def probing_project(where: Path, server: Served, other_context: Path) -> Path:
    """README's project with PROBE_FACTORY beside it and what it is to try to read."""
    project = readme_project(where)
    (project / "probe_task.py").write_text(PROBE_FACTORY)
    (project / "targets.json").write_text(json.dumps({
        "other_context": str(other_context), "database": str(server.data / "pipeboard.sqlite"),
        "worker_pid": server.processes()["worker"]}))
    return project


def reads_with(tmp: Path, mode: str) -> list[dict[str, str]]:
    """With the sandbox ``mode``: user A's model, then user B's probing model and job; what each
    phase of B's read (one report per process)."""
    with deployment(tmp, f"reads-{mode}", sandbox=mode) as server:
        alice, bob = server.client_for("alice"), server.client_for("bob")
        sha_a = upload(alice, readme_project(tmp / f"a-{mode}"))
        model_a = register(alice, "alice-task", "my_task.py:make_task", sha_a)
        assert model_a["status"] == "ready", model_a
        context_a = server.data / "contexts" / sha_a / "my_task.py"
        sha_b = upload(bob, probing_project(tmp / f"b-{mode}", server, context_a))
        model = register(bob, "bob-task", "probe_task.py:make_task", sha_b)
        answer = bob.post("/jobs", json={**SMALL_JOB, "model": "bob-task", "data": "tokens.txt", "batch_size": 64,
                                         "microbatches": 4, "stop": {"steps": 20}})
        assert answer.status_code == 201, answer.text
        job = finished(bob, answer.json()["id"])
        print(f"- sandbox {mode}: validation {model['status']}, job {job['status']} "
              f"({(job.get('summary') or {}).get('steps', '?')} steps) {job.get('error') or ''}")
        return [json.loads(path.read_text()) for path in sorted(server.data.rglob("reads-*.json"))]


def reads_part(tmp: Path) -> None:
    print("\n## User B's factory reads what it should not (each job: README's project, 20 steps)")
    columns: dict[str, dict[str, dict[str, str]]] = {}  # phase -> mode -> read -> outcome
    for mode in ("off", "on"):
        for report in reads_with(tmp, mode):
            columns.setdefault(report.pop("phase"), {}).setdefault(mode, {}).update(report)
    reads = list(next(iter(next(iter(columns.values())).values())))
    for phase, by_mode in columns.items():
        print(f"\n{phase}:\n\n| read | sandbox off | sandbox on |\n|---|---|---|")
        for read in reads:
            print(f"| {read} | {by_mode.get('off', {}).get(read, '-')} | {by_mode.get('on', {}).get(read, '-')} |")
