"""Upload bombs against /health, for bench/sandbox.py and bench/sandbox_cost.py: a .tar.bz2 of 3 GB
of zeros and a .tar.gz of 10 GB, each as one declared member and as bytes hidden after the
archive's end, and archives just under the limit, each uploaded while GET /health is probed
every 0.7 s with a 1 s timeout: the answer and its time, and how many probes answered."""

from __future__ import annotations

import bz2
import gzip
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from bench.sandbox_deploy import deployment


def compressor(kind: str) -> Callable[[bytes], bytes]:
    return bz2.compress if kind == "bz2" else (lambda data: gzip.compress(data, 9, mtime=0))


def tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def near_limit(kind: str, members: int, size: int) -> bytes:
    """A tar of ``members`` members of ``size`` zeros each, under the limit: read to its end,
    seconds of decompression in the API's thread pool."""
    compress, chunk = compressor(kind), 8 << 20
    zeros = compress(b"\0" * chunk)
    members_bytes = b"".join(compress(tar_header(f"part{i}.bin", size)) + zeros * (size // chunk) for i in range(members))
    return members_bytes + compress(b"\0" * 1024)


def bomb(kind: str, total: int, hidden: bool) -> bytes:
    """``total`` bytes of zeros in a tar, compressed (bz2 or gz) as concatenated streams of one
    64 MiB block each (both formats read them as one). ``hidden``: a small member, the
    end-of-archive blocks, then the zeros, which no header declares; else one member of them all."""
    compress, chunk = compressor(kind), 64 << 20
    if hidden:
        head = compress(tar_header("task.py", 6) + b"x = 1\n".ljust(512, b"\0") + b"\0" * 1024)
    else:
        head = compress(tar_header("zeros.bin", total))
    return head + compress(b"\0" * chunk) * (total // chunk)


class HealthProbe:
    """GET /health every 0.7 s with a 1 s timeout, in a thread of its own: (time, answered) per probe."""

    def __init__(self, url: str) -> None:
        self.url = url + "/api/v1/health"
        self.results: list[tuple[float, bool]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.probe, daemon=True)

    def probe(self) -> None:
        with httpx.Client(timeout=1.0) as client:
            while not self.stop.is_set():
                at = time.monotonic()
                try:
                    answered = client.get(self.url).status_code < 500
                except httpx.HTTPError:
                    answered = False
                self.results.append((at, answered))
                self.stop.wait(max(0.0, 0.7 - (time.monotonic() - at)))

    def __enter__(self) -> "HealthProbe":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(5)


def bomb_cases() -> list[tuple[str, int, bool | None, bytes]]:
    """(kind, bytes of zeros, hidden: None for the archives under the limit, the archive)."""
    cases = [(kind, total, hidden, bomb(kind, total, hidden))
             for kind, total in (("bz2", 3 << 30), ("gz", 10 << 30)) for hidden in (False, True)]
    return cases + [(kind, 480 << 20, None, near_limit(kind, 4, 120 << 20)) for kind in ("gz", "bz2")]


def bombs_part(tmp: Path) -> None:
    print("\n## Upload bombs while /health is probed every 0.7 s (1 s timeout)")
    with deployment(tmp, "bombs") as server:
        for kind, total, hidden, body in bomb_cases():
            with HealthProbe(server.url) as probe:
                time.sleep(1.5)  # probes before
                began = time.monotonic()
                answer = server.http.post("/contexts", timeout=120,
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
