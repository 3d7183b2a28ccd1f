"""A validation past its time limit, for bench/sandbox.py: a factory whose setsid child never exits,
validated with a 5 s limit while a job waits behind it (worker concurrency 1), with the sandbox off
and on: when the validation failed, how many of the factory's processes were left, and when the
queued job started."""

from __future__ import annotations

import os
import textwrap
import time
import uuid
from pathlib import Path

from bench.sandbox_deploy import SMALL_JOB, deployment, upload, validated

SETSID_FACTORY = textwrap.dedent('''
    import subprocess, sys, time

    def make_task(**kwargs):
        subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)  # TOKEN"],
                         start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3600)
''')


def live_processes_naming(mark: str) -> int:
    """How many processes, zombies aside, have ``mark`` in their command line."""
    count = 0
    for pid in (entry for entry in os.listdir("/proc") if entry.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline, open(f"/proc/{pid}/stat") as stat:
                count += mark.encode() in cmdline.read() and stat.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            continue
    return count


def stuck_project(where: Path, mark: str) -> Path:
    where.mkdir()
    (where / "stuck.py").write_text(SETSID_FACTORY.replace("TOKEN", mark))
    return where


def setsid_part(tmp: Path) -> None:
    print("\n## A factory whose setsid child never exits, validated with a 5 s limit (worker concurrency 1)")
    for mode in ("off", "on"):
        with deployment(tmp, f"setsid-{mode}", sandbox=mode, validation_time_limit_s="5") as server:
            user = server.client_for("carol")
            mark = f"never-exits-{uuid.uuid4().hex}"
            began = time.monotonic()
            sha = upload(user, stuck_project(tmp / f"setsid-project-{mode}", mark))
            user.post("/models", json={"name": "stuck", "source": "stuck.py:make_task", "context": sha}).raise_for_status()
            job = user.post("/jobs", json={**SMALL_JOB, "stop": {"steps": 4}}).json()  # queued behind it
            model = validated(user, "stuck")
            failed_at = time.monotonic() - began
            left = live_processes_naming(mark)
            while user.get(f"/jobs/{job['id']}").json()["status"] == "queued" and time.monotonic() - began < 600:
                time.sleep(0.02)
            started = time.monotonic() - began - failed_at
            print(f"- sandbox {mode}: validation {model['status']} {failed_at:.2f} s after the upload began "
                  f"({model['message'][:90]}); the factory's processes left: {left}; "
                  f"the queued job left `queued` {started:.2f} s after the validation failed")
