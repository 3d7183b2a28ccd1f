"""Users' code closed in, measured: upload bombs against /health, what a factory can read
with the sandbox off and on, a validation whose setsid child never exits, and the sandbox's cost.

Parts (each on real deployments: uvicorn and a Celery worker on a private SQLite database):
  bombs    a .tar.bz2 of 3 GB of zeros and a .tar.gz of 10 GB, each as one declared member and as
           bytes hidden after the archive's end, uploaded while GET /health is probed every 0.7 s
           with a 1 s timeout: the answer and its time, and how many probes answered
  reads    user B's factory (validation, then a job) reads user A's unpacked context, the database
           file, the token table, the worker's /proc environ and settings, and its own file and data;
           with PIPEBOARD_SANDBOX=off, then on
  setsid   a factory whose setsid child never exits, validated with a 5 s limit, a job queued behind
           it (worker concurrency 1): when the validation failed, processes left, when the job started
  cost     5 alternating pairs (off, on) of a job (mlp-digits, 2 stages, 1f1b, 300 steps; a new batch
           size per pair, so each job profiles: the sandboxed phase): job start (POST to its first
           measured step) and samples/s; medians, per-pair differences and the spread

    .venv/bin/python bench/sandbox.py [--parts bombs,reads,setsid,cost] [--pairs 5]
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import io
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from pipeboard.app.services import contexts  # noqa: E402
from tests.app.test_e2e_support import SMALL_JOB, Deployment, embedded_env  # noqa: E402
from pipeboard.app.core.config import settings_from_env  # noqa: E402


def processor() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return f"{fields.get('Model name', '?').strip()} (family {fields.get('CPU family', '?').strip()}, " \
           f"model {fields.get('Model', '?').strip()}), {os.cpu_count()} CPUs"


def deployment(tmp: Path, name: str, **settings: str) -> Deployment:
    where = tmp / name
    where.mkdir(parents=True)
    env = embedded_env(where) | {f"PIPEBOARD_{k.upper()}": v for k, v in settings.items()}
    env["PIPEBOARD_CALIBRATION_DIR"] = str(where / "calibration")
    return Deployment(env, where)


# ----- bombs ------------------------------------------------------------------------------------

def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def near_limit(kind: str, members: int, size: int) -> bytes:
    """A tar of ``members`` members of ``size`` zeros each (under the limit: checked to the end,
    seconds of decompression in the thread pool), compressed as ``bomb`` does."""
    chunk = 8 << 20
    compress = bz2.compress if kind == "bz2" else (lambda b: gzip.compress(b, 9, mtime=0))
    zeros = compress(b"\0" * chunk)
    out = b""
    for i in range(members):
        out += compress(_tar_header(f"part{i}.bin", size)) + zeros * (size // chunk)
    return out + compress(b"\0" * 1024)


def bomb(kind: str, total: int, hidden: bool) -> bytes:
    """A tar of ``total`` bytes of zeros, compressed (``kind`` bz2 or gz) as concatenated streams
    of one compressed 64 MiB block (both formats read such streams as one). ``hidden``: a small
    member, then the zeros after the end-of-archive blocks, where no header declares them."""
    chunk = 64 << 20
    compress = bz2.compress if kind == "bz2" else (lambda b: gzip.compress(b, 9, mtime=0))
    zeros = compress(b"\0" * chunk)
    if hidden:
        head = compress(_tar_header("task.py", 6) + b"x = 1\n".ljust(512, b"\0") + b"\0" * 1024)
    else:
        head = compress(_tar_header("zeros.bin", total))
    return head + zeros * (total // chunk)


class HealthProbe:
    """GET /health every 0.7 s with a 1 s timeout, in a thread: (time, answered) per probe."""

    def __init__(self, url: str) -> None:
        self.url, self.results, self.stop = url + "/api/v1/health", [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=1.0) as client:
            while not self.stop.is_set():
                at = time.monotonic()
                try:
                    ok = client.get(self.url).status_code < 500
                except httpx.HTTPError:
                    ok = False
                self.results.append((at, ok))
                self.stop.wait(max(0.0, 0.7 - (time.monotonic() - at)))

    def __enter__(self) -> "HealthProbe":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(5)


def bombs_part(tmp: Path) -> None:
    print("\n## Upload bombs while /health is probed every 0.7 s (1 s timeout)")
    dep = deployment(tmp, "bombs")
    with dep.running():
        cases = [(kind, total, hidden, bomb(kind, total, hidden))
                 for kind, total in (("bz2", 3 << 30), ("gz", 10 << 30)) for hidden in (False, True)]
        # under the 500 MB limit: the whole archive is decompressed, seconds, off the event loop
        cases += [(kind, 480 << 20, None, near_limit(kind, 4, 120 << 20)) for kind in ("gz", "bz2")]
        for kind, total, hidden, body in cases:
            if True:
                with HealthProbe(dep.url) as probe:
                    time.sleep(1.5)  # probes before
                    began = time.monotonic()
                    answer = dep.http.post(dep.url + "/api/v1/contexts", timeout=120,
                                           files={"file": (f"bomb.tar.{kind}", body, "application/octet-stream")})
                    took = time.monotonic() - began
                    time.sleep(1.5)  # and after
                during = [ok for at, ok in probe.results if began <= at <= began + took]
                where = ("4 members, under the limit" if hidden is None else
                         "after the end-of-archive (no header)" if hidden else "one declared member")
                print(f"- .tar.{kind}, {len(body):,} bytes, {total / 1e9:.2f} GB of zeros, {where}: "
                      f"{answer.status_code} in {took:.2f} s ({str(answer.json().get('detail', 'stored'))[:150]}); "
                      f"probes answered {sum(ok for _, ok in probe.results)} of {len(probe.results)} "
                      f"({sum(during)} of {len(during)} during the upload)")


# ----- reads ------------------------------------------------------------------------------------

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
    from tests.trainer.test_task_user_project import _readme_blocks

    task_file, data_script, _ = _readme_blocks()
    where.mkdir(parents=True)
    (where / "my_task.py").write_text(task_file)
    code = data_script.strip().removeprefix("python3 -c ").strip().strip('"')
    subprocess.run([sys.executable, "-c", code], cwd=where, check=True)
    return where


def user_client(dep: Deployment, user: str) -> httpx.Client:
    from sqlalchemy.orm import Session

    from pipeboard.app.core.db import make_engine
    from pipeboard.app.services.tokens import create_token

    engine = make_engine(settings_from_env(dep.env).database_url)
    with Session(engine) as session:
        _, secret = create_token(session, user, "write", user=user)
        session.commit()
    engine.dispose()
    return httpx.Client(base_url=dep.url + "/api/v1", timeout=60, headers={"Authorization": f"Bearer {secret}"})


def upload(client: httpx.Client, project: Path) -> str:
    answer = client.post("/contexts", files={"file": ("project.tar.gz", contexts.pack(project), "application/gzip")})
    assert answer.status_code in (200, 201), answer.text
    return answer.json()["sha256"]


def wait_model(client: httpx.Client, name: str, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        model = client.get(f"/models/{name}").json()
        if model.get("status") != "validating" or time.monotonic() > deadline:
            return model
        time.sleep(0.2)


def wait_job(client: httpx.Client, job_id: int, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
            return job
        time.sleep(0.3)


def reads_part(tmp: Path) -> None:
    print("\n## User B's factory reads what it should not (each job: README's project, 20 steps)")
    columns: dict[str, dict[str, str]] = {}
    for mode in ("off", "on"):
        dep = deployment(tmp, f"reads-{mode}", sandbox=mode)
        with dep.running():
            data_dir = settings_from_env(dep.env).data_dir
            alice, bob = user_client(dep, "alice"), user_client(dep, "bob")
            project_a = readme_project(tmp / f"a-{mode}")
            sha_a = upload(alice, project_a)
            alice.post("/models", json={"name": "alice-task", "source": "my_task.py:make_task", "context": sha_a,
                                        "data": "tokens.txt"}).raise_for_status()
            assert wait_model(alice, "alice-task")["status"] == "ready"
            project_b = readme_project(tmp / f"b-{mode}")
            (project_b / "probe_task.py").write_text(PROBE_FACTORY)
            (project_b / "targets.json").write_text(json.dumps({
                "other_context": str(data_dir / "contexts" / sha_a / "my_task.py"),
                "database": str(data_dir / "pipeboard.sqlite"), "worker_pid": dep.worker.pid}))
            sha_b = upload(bob, project_b)
            bob.post("/models", json={"name": "bob-task", "source": "probe_task.py:make_task", "context": sha_b,
                                      "data": "tokens.txt"}).raise_for_status()
            model = wait_model(bob, "bob-task")
            answer = bob.post("/jobs", json={**SMALL_JOB, "model": "bob-task", "data": "tokens.txt",
                                             "batch_size": 64, "microbatches": 4, "stop": {"steps": 20}})
            assert answer.status_code == 201, answer.text
            job = wait_job(bob, answer.json()["id"])
            print(f"- sandbox {mode}: validation {model['status']}, job {job['status']} "
                  f"({(job.get('summary') or {}).get('steps', '?')} steps) {job.get('error') or ''}")
            for path in sorted(data_dir.rglob("reads-*.json")):
                report = json.loads(path.read_text())
                columns.setdefault(report.pop("phase"), {}).update({mode: report})
    rows = list(next(iter(next(iter(columns.values())).values())))
    for phase, by_mode in columns.items():
        print(f"\n{phase}:\n\n| read | sandbox off | sandbox on |\n|---|---|---|")
        for row in rows:
            print(f"| {row} | {by_mode.get('off', {}).get(row, '-')} | {by_mode.get('on', {}).get(row, '-')} |")


# ----- setsid -----------------------------------------------------------------------------------

SETSID_FACTORY = textwrap.dedent('''
    import subprocess, sys, time

    def make_task(**kwargs):
        subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)  # TOKEN"],
                         start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3600)
''')


def running_with(token: str) -> int:
    found = 0
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if token.encode() in fh.read():
                    with open(f"/proc/{entry}/stat") as st:
                        found += st.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, ValueError):
            continue
    return found


def setsid_part(tmp: Path) -> None:
    print("\n## A factory whose setsid child never exits, validated with a 5 s limit (worker concurrency 1)")
    for mode in ("off", "on"):
        dep = deployment(tmp, f"setsid-{mode}", sandbox=mode, validation_time_limit_s="5")
        with dep.running():
            user = user_client(dep, "carol")
            project = tmp / f"setsid-project-{mode}"
            project.mkdir()
            token = f"never-exits-{uuid.uuid4().hex}"
            (project / "stuck.py").write_text(SETSID_FACTORY.replace("TOKEN", token))
            began = time.monotonic()
            sha = upload(user, project)
            user.post("/models", json={"name": "stuck", "source": "stuck.py:make_task", "context": sha}).raise_for_status()
            job = user.post("/jobs", json={**SMALL_JOB, "stop": {"steps": 4}}).json()  # queued behind it
            model = wait_model(user, "stuck")
            failed_at = time.monotonic() - began
            left = running_with(token)
            while user.get(f"/jobs/{job['id']}").json()["status"] == "queued" and time.monotonic() - began < 600:
                time.sleep(0.02)
            started = time.monotonic() - began - failed_at
            print(f"- sandbox {mode}: validation {model['status']} {failed_at:.2f} s after the upload began "
                  f"({model['message'][:90]}); the factory's processes left: {left}; "
                  f"the queued job left `queued` {started:.2f} s after the validation failed")


# ----- cost -------------------------------------------------------------------------------------

def timed_job(dep: Deployment, batch: int) -> tuple[float, float]:
    """(seconds from POST to the first measured step, samples/s) of one job."""
    began = time.monotonic()
    job = dep.api("POST", "/jobs", json={**SMALL_JOB, "batch_size": batch, "microbatches": 4, "stop": {"steps": 300}})
    for message in dep.events(job["id"], timeout=600, until="timeline"):
        if message["event"] == "end":
            raise RuntimeError(f"job ended early: {message['data']}")
    start = time.monotonic() - began
    done = wait_job(dep.http_client, job["id"])
    assert done["status"] == "succeeded", done
    return start, float(done["summary"]["samples_per_s"])


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} (range {min(values):.3f} to {max(values):.3f})"


def start_pairs(tmp: Path, pairs: int) -> None:
    """The sandbox's own start cost, without a deployment's noise: a bare `python -c pass` and a
    validation of mlp-digits (torch imported, the model built, checked and split), off and on."""
    from pipeboard.app.core.config import get_settings
    from pipeboard.app.services import model_checks, sandbox

    folder = tmp / "start"
    folder.mkdir()
    timings: dict[str, dict[str, list[float]]] = {"python -c pass": {"off": [], "on": []},
                                                  "validation of mlp-digits": {"off": [], "on": []}}
    for _ in range(pairs):
        for mode in ("off", "on"):
            os.environ["PIPEBOARD_SANDBOX"] = mode
            get_settings.cache_clear()
            cmd, env = [sys.executable, "-c", "pass"], dict(os.environ)
            if mode == "on":
                cmd, env = sandbox.command(cmd, env, cwd=str(folder), writable=[folder])
            began = time.monotonic()
            subprocess.run(cmd, env=env, cwd=folder, check=True)
            timings["python -c pass"][mode].append(time.monotonic() - began)
            began = time.monotonic()
            result = model_checks.run_validation("mlp-digits", {}, None, folder, time_limit_s=300,
                                                 memory_bytes=8 << 30)
            assert result["ok"], result
            timings["validation of mlp-digits"][mode].append(time.monotonic() - began)
    os.environ.pop("PIPEBOARD_SANDBOX")
    get_settings.cache_clear()
    for what, by_mode in timings.items():
        extra = [a - b for a, b in zip(by_mode["on"], by_mode["off"])]
        print(f"- {what}: on {spread(by_mode['on'])} s, off {spread(by_mode['off'])} s; per pair on - off "
              f"{spread(extra)} s")


def cost_part(tmp: Path, pairs: int) -> None:
    print(f"\n## The sandbox's start cost alone: {pairs} alternating pairs (off, on) in this process")
    start_pairs(tmp, pairs)
    print(f"\n## The sandbox's cost: {pairs} alternating pairs (off, on); mlp-digits, 2 stages, 1f1b, 300 steps")
    deps = {mode: deployment(tmp, f"cost-{mode}", sandbox=mode, calibration_max_age_s="0") for mode in ("off", "on")}
    contexts_ = [d.running() for d in deps.values()]
    for managed in contexts_:
        managed.__enter__()
    try:
        for dep in deps.values():
            dep.http_client = httpx.Client(base_url=dep.url + "/api/v1", timeout=60, headers=dep.http.headers)
        results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
        for pair in range(pairs):
            batch = 64 + 8 * pair  # a new profile each pair, in both: the profile phase is what runs sandboxed
            for mode in ("off", "on"):
                results[mode].append(timed_job(deps[mode], batch))
                start, sps = results[mode][-1]
                print(f"- pair {pair + 1}, batch {batch}, sandbox {mode}: start {start:.2f} s, {sps:.1f} samples/s")
    finally:
        for managed in reversed(contexts_):
            managed.__exit__(None, None, None)
    starts = {m: [r[0] for r in results[m]] for m in results}
    rates = {m: [r[1] for r in results[m]] for m in results}
    print(f"\n- job start: on {spread(starts['on'])} s, off {spread(starts['off'])} s; per pair on - off: "
          f"{spread([a - b for a, b in zip(starts['on'], starts['off'])])} s (goal: under 0.5 s more)")
    ratios = [a / b for a, b in zip(rates["on"], rates["off"])]
    own = (max(rates["off"]) - min(rates["off"])) / statistics.median(rates["off"])
    print(f"- samples/s: on / off per pair {spread(ratios)}; the unsandboxed runs' own spread is {own:.1%} of their "
          "median (each job's profile and training run sandboxed in `on`: docs/sandbox.md)")


def chosen_parts(parser: argparse.ArgumentParser, text: str, known: tuple[str, ...]) -> list[str]:
    """The comma-separated ``--parts``; one that is not ``known`` is the parser's error."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = set(parts) - set(known)
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))} ({', '.join(known)})")
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="bombs,reads,setsid,cost")
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    parts = chosen_parts(parser, args.parts, ("bombs", "reads", "setsid", "cost"))
    from pipeboard.app.services import sandbox

    print(f"processor: {processor()}")
    print(f"bubblewrap: {sandbox.probe() or 'works here'}")
    with tempfile.TemporaryDirectory(prefix="pipeboard-bench-sandbox-") as tmp:
        for part in parts:
            {"bombs": lambda: bombs_part(Path(tmp)), "reads": lambda: reads_part(Path(tmp)),
             "setsid": lambda: setsid_part(Path(tmp)), "cost": lambda: cost_part(Path(tmp), args.pairs)}[part]()


if __name__ == "__main__":
    main()
