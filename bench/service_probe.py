"""What the benches that probe a served pipeboard share: a free port, the `pipeboard up` serve line,
a .tar.gz code context built in memory, and ``Served``: `pipeboard up --workers 1` started as a
user starts it (data in a folder of its own, and a database of its own given one), driven over the
REST API with the admin token its first start prints."""

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
    """`pipeboard up --workers 1` on a free port, data in ``tmp / "data"``; ``extra_env``: more
    PIPEBOARD_* settings; ``token``: a restarted data folder prints no sign-in link, so the caller
    brings the token it had. ``http`` is a client on ``/api/v1`` with the token."""

    def __init__(self, tmp: Path, database_url: str | None = None, extra_env: dict[str, str] | None = None,
                 token: str | None = None, timeout: float = 180) -> None:
        self.data = tmp / "data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {"PIPEBOARD_DATA_DIR": str(self.data), **(extra_env or {})}
        if database_url:
            self.env["PIPEBOARD_DATABASE_URL"] = database_url
        base = {k: v for k, v in os.environ.items() if not k.startswith("PIPEBOARD_")}
        self.log = tmp / "up.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", "from pipeboard.app.cli import main; main()", "up",
                                          "--port", str(self.port), "--workers", "1"], cwd=ROOT, env={**base, **self.env},
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = token or (lambda m: m and m.group(1))(SIGN_IN.search(self.log.read_text(errors="replace")))
            try:
                if found and httpx.get(f"{self.url}/api/v1/health", timeout=5).json().get("workers", 0) >= 1:
                    self.token = found
                    self.http = httpx.Client(base_url=f"{self.url}/api/v1", timeout=300,
                                             headers={"Authorization": f"Bearer {self.token}"})
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        raise SystemExit(f"pipeboard up did not start:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def api(self, method: str, path: str, body: dict | None = None) -> Any:
        """The answer's JSON; an HTTP error status raises with the answer's text."""
        response = self.http.request(method, path, json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    def events(self, job_id: int, until: str = "end", timeout: float = 1800) -> Iterator[dict[str, Any]]:
        """The job's event stream (each message's data decoded) up to the first event named ``until``."""
        deadline = time.monotonic() + timeout
        with self.http.stream("GET", f"/jobs/{job_id}/events", timeout=httpx.Timeout(10, read=timeout)) as response:
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
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
