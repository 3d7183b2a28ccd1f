"""What the benches that probe a served pipeboard share: a free port, the `pipeboard up` serve line,
and a .tar.gz code context built in memory."""

from __future__ import annotations

import gzip
import io
import socket
import tarfile

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
