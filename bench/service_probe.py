"""What the benches that probe a served pipeboard share: a free port, the `pipeboard up` serve line,
a .tar.gz code context built in memory, the processor, a job polled to its end, and ``Served``:
`pipeboard up --workers 1` started as a user starts it (data in a folder of its own, and a
database of its own given one; started again after a kill), driven over the REST API with the
admin token its first start prints, and over the `pipeboard` CLI as an operator on the server
(`pipeboard token create` for users' tokens)."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

from pipeboard.app.services.sse import parse_stream

ROOT = Path(__file__).resolve().parents[1]
SIGN_IN = re.compile(r"/#token=(pb_[A-Za-z0-9_-]+)")

# `pipeboard up` after its migrations: the API (uvicorn) and one Celery worker, each its own
# process, supervised (the benches migrate first, then serve).
SERVE = ("from pipeboard.app.cli.server import checked_settings, serve; "
         "s = checked_settings(); serve(s, '127.0.0.1', {port}, 1, s.worker_concurrency)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pipeboard_argv(*argv: str) -> list[str]:
    """The `pipeboard` command line of this interpreter's installation."""
    return [sys.executable, "-c", "from pipeboard.app.cli import main; main()", *argv]


def processor() -> str:
    """The processor as lscpu names it (model name, family, model) and how many CPUs there are."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
    return (f"{fields.get('Model name', '?')} (family {fields.get('CPU family', '?')}, "
            f"model {fields.get('Model', '?')}), {os.cpu_count()} CPUs")


def finished(client: httpx.Client, job_id: int, timeout: float = 600) -> dict[str, Any]:
    """The job once it has ended (or as it is after ``timeout`` s), polled over ``client``."""
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
            return job
        time.sleep(0.3)


def end_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the process group ``proc`` leads, SIGKILL it if it has not ended after ``grace`` s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def printed_token(log: Path) -> str | None:
    """The admin token of the sign-in link `pipeboard up` prints on its first start, if it did."""
    found = SIGN_IN.search(log.read_text(errors="replace"))
    return found.group(1) if found else None


def archive(files: dict[str, str]) -> bytes:
    """A .tar.gz of `files` (name -> text), as a user's upload would be."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Served:
    """`pipeboard up --workers N` on a free port, data in ``tmp / "data"``; ``extra_env``: more
    PIPEBOARD_* settings; ``token``: a restarted data folder prints no sign-in link, so the caller
    brings the token it had; ``workers=0``: the API alone, for workers started as hosts of their
    own (`pipeboard worker`); ``concurrency``: tasks per worker (0: the setting's). ``http`` is a
    client on ``/api/v1`` with the token."""

    def __init__(self, tmp: Path, database_url: str | None = None, extra_env: dict[str, str] | None = None,
                 token: str | None = None, timeout: float = 180, workers: int = 1, concurrency: int = 0) -> None:
        self.data = tmp / "data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {"PIPEBOARD_DATA_DIR": str(self.data), **(extra_env or {})}
        if database_url:
            self.env["PIPEBOARD_DATABASE_URL"] = database_url
        self.log = tmp / "up.log"
        self.log.write_bytes(b"")
        self.workers, self.concurrency = workers, concurrency
        self.token = token
        self.start(timeout)
        self.http = httpx.Client(base_url=f"{self.url}/api/v1", timeout=300, headers={"Authorization": f"Bearer {self.token}"})

    def start(self, timeout: float = 180) -> None:
        """Start `pipeboard up` (again, after a kill: same port, data and token); return once
        /health counts its workers."""
        argv = ["up", "--port", str(self.port), "--workers", str(self.workers), "--concurrency", str(self.concurrency)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(pipeboard_argv(*argv), cwd=ROOT, env=self.process_env(), stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.token = self.token or printed_token(self.log)
            if self.token and self.healthy(self.workers):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        raise SystemExit(f"pipeboard up did not start:\n{self.tail()}")

    def process_env(self) -> dict[str, str]:
        """This environment without its own PIPEBOARD_* settings, with the deployment's."""
        return {**{k: v for k, v in os.environ.items() if not k.startswith("PIPEBOARD_")}, **self.env}

    def healthy(self, workers: int) -> bool:
        """Whether the API answers /health and counts at least ``workers`` live workers."""
        try:
            return httpx.get(f"{self.url}/api/v1/health", timeout=5).json().get("workers", 0) >= workers
        except (httpx.HTTPError, ValueError):
            return False

    def cli(self, *argv: str) -> str:
        """`pipeboard ARGV` on this deployment's settings, as an operator runs it on the server; its output."""
        done = subprocess.run(pipeboard_argv(*argv), cwd=ROOT, env=self.process_env(), capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"pipeboard {' '.join(argv)}: {done.stderr[-2000:]}")
        return done.stdout

    def client_for(self, user: str, scope: str = "write") -> httpx.Client:
        """A client on ``/api/v1`` with a new ``scope`` token of ``user`` (`pipeboard token create`)."""
        secret = re.search(r"pb_[A-Za-z0-9_-]+", self.cli("token", "create", user, "--scope", scope, "--user", user)).group(0)
        return httpx.Client(base_url=f"{self.url}/api/v1", timeout=60, headers={"Authorization": f"Bearer {secret}"})

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def api(self, method: str, path: str, body: dict | None = None) -> Any:
        """The answer's JSON; an HTTP error status raises with the answer's text."""
        response = self.http.request(method, path, json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    def events(self, job_id: int, until: str = "end", timeout: float = 1800, last_id: int = 0) -> Iterator[dict[str, Any]]:
        """The job's event stream (each message's data decoded) up to the first event named ``until``;
        ``last_id``: resume after that event, as a client that reconnects with Last-Event-ID."""
        deadline = time.monotonic() + timeout
        headers = {"Last-Event-ID": str(last_id)} if last_id else {}
        with self.http.stream("GET", f"/jobs/{job_id}/events", headers=headers,
                              timeout=httpx.Timeout(10, read=timeout)) as response:
            response.raise_for_status()
            for message in parse_stream(response.iter_lines()):
                message["data"] = json.loads(message["data"])
                yield message
                if message.get("event") == until or time.monotonic() > deadline:
                    return

    def processes(self) -> dict[str, int]:
        """The service's own processes: `pipeboard up`, its API server and its Celery worker."""
        out: dict[str, int] = {"up": self.proc.pid}
        for task in Path(f"/proc/{self.proc.pid}/task").glob("*"):
            for pid in (task / "children").read_text().split():
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                out["api" if "uvicorn" in cmdline else "worker" if "celery" in cmdline else pid] = int(pid)
        return out

    def stop(self) -> None:
        end_group(self.proc, 60)
