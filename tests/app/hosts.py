"""Worker hosts on this one machine, for tests and benchmarks of jobs on several hosts.

Each host is a `pipeboard worker` with its own node name and data folder. Where this process may
make network namespaces (root, `ip netns`), each worker runs in one of its own, and the hosts reach
each other only over a veth pair between their namespaces (torch's rendezvous and gloo traffic
cross it: GLOO_SOCKET_IFNAME names it). PostgreSQL and Redis listen on this machine's loopback,
which a namespace cannot see: each namespace has a second veth to this one, and a small TCP
forwarder here relays its connections to them. Elsewhere the workers share this namespace and
differ by name and folder only (`isolated` says which it is).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=20)


class Forwarder:
    """Relays TCP connections to ``listen`` on to the same port on 127.0.0.1 (a thread of its own)."""

    def __init__(self, listen: list[tuple[str, int]]) -> None:
        self.loop = asyncio.new_event_loop()
        self.servers: list[asyncio.AbstractServer] = []
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(listen, ready), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _serve(self, listen: list[tuple[str, int]], ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        for host, port in listen:
            self.servers.append(self.loop.run_until_complete(
                asyncio.start_server(lambda r, w, port=port: self._relay(r, w, port), host, port)))
        ready.set()
        self.loop.run_forever()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def close(self) -> None:
        def stop() -> None:
            for server in self.servers:
                server.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(stop)
        self.thread.join(5)


def can_isolate() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


class WorkerHosts:
    """``names`` worker hosts of the deployment described by ``env`` (PIPEBOARD_* variables whose
    database and broker are on 127.0.0.1), each in its own data folder under ``workdir``."""

    def __init__(self, env: dict[str, str], workdir: Path, names: tuple[str, ...] = ("host-a", "host-b")) -> None:
        self.env, self.workdir, self.names = env, workdir, names
        self.processes: dict[str, subprocess.Popen] = {}
        self.tag = uuid.uuid4().hex[:5]
        self.net = 10 * 256 + int(self.tag[:2], 16)  # 10.<net>.x.y: unlikely to meet another run's
        self.forwarder: Forwarder | None = None
        self.isolated = False
        if can_isolate():
            self.isolated = True
            try:
                self._make_namespaces()
            except (subprocess.CalledProcessError, OSError):
                self._remove_namespaces()
                self.isolated = False

    # --- network ------------------------------------------------------------------------

    def namespace(self, i: int) -> str:
        return f"pb{self.tag}{i}"

    def _addr(self, third: int, fourth: int) -> str:
        return f"10.{self.net % 256}.{third}.{fourth}"

    def link(self, i: int) -> str:
        """The host's interface towards the other hosts."""
        return f"pb{self.tag}h{i}"

    def address(self, i: int) -> str:
        return self._addr(100, i + 1) if self.isolated else "127.0.0.1"

    def _make_namespaces(self) -> None:
        listen = []
        for i, _ in enumerate(self.names):
            ns, out, inside = self.namespace(i), f"pb{self.tag}o{i}", f"pb{self.tag}i{i}"
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "add", out, "type", "veth", "peer", "name", inside)  # to this namespace
            _run("ip", "link", "set", inside, "netns", ns)
            _run("ip", "addr", "add", f"{self._addr(i + 1, 1)}/24", "dev", out)
            _run("ip", "link", "set", out, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self._addr(i + 1, 2)}/24", "dev", inside)
            _run("ip", "-n", ns, "link", "set", inside, "up")
            listen += [(self._addr(i + 1, 1), port) for port in self._service_ports()]
        # the hosts' own link: a veth pair between the first two namespaces
        a, b = self.link(0), self.link(1)
        _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        for i, end in ((0, a), (1, b)):
            _run("ip", "link", "set", end, "netns", self.namespace(i))
            _run("ip", "-n", self.namespace(i), "addr", "add", f"{self.address(i)}/24", "dev", end)
            _run("ip", "-n", self.namespace(i), "link", "set", end, "up")
        self.forwarder = Forwarder(listen)

    def _remove_namespaces(self) -> None:
        for i, _ in enumerate(self.names):
            subprocess.run(["ip", "netns", "del", self.namespace(i)], capture_output=True, timeout=20)
            subprocess.run(["ip", "link", "del", f"pb{self.tag}o{i}"], capture_output=True, timeout=20)

    def _service_ports(self) -> list[int]:
        ports = []
        for key in ("PIPEBOARD_DATABASE_URL", "PIPEBOARD_BROKER_URL"):
            parts = urlsplit(self.env[key])
            ports.append(parts.port or {"redis": 6379}.get(parts.scheme.split("+")[0], 5432))
        return sorted(set(ports))

    def _env_for(self, i: int, name: str) -> dict[str, str]:
        env = {**os.environ, **self.env, "PIPEBOARD_DATA_DIR": str(self.workdir / name)}
        if self.isolated:  # the services through this host's forwarder
            for key in ("PIPEBOARD_DATABASE_URL", "PIPEBOARD_BROKER_URL", "PIPEBOARD_RESULT_BACKEND", "PIPEBOARD_REDIS_URL"):
                if key in env:
                    parts = urlsplit(env[key])
                    env[key] = urlunsplit(parts._replace(netloc=parts.netloc.replace("127.0.0.1", self._addr(i + 1, 1))))
            env["GLOO_SOCKET_IFNAME"] = self.link(i)
        return env

    # --- workers --------------------------------------------------------------------------

    def start(self, name: str) -> subprocess.Popen:
        i = self.names.index(name)
        argv = [sys.executable, "-c", "from pipeboard.app.cli import main; main()", "worker", "--concurrency", "1",
                "--node-name", name, "--node-address", self.address(i)]
        if self.isolated:
            argv = ["ip", "netns", "exec", self.namespace(i), *argv]
        log = open(self.workdir / f"worker-{name}.log", "ab")
        process = subprocess.Popen(argv, cwd=ROOT, env=self._env_for(i, name), stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.processes[name] = process
        return process

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal the host's worker process (the Celery worker, not its group: its runs live on)."""
        os.kill(self.processes[name].pid, sig)
        self.processes[name].wait(30)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.workdir.glob("worker-*.log")))

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                except ProcessLookupError:
                    pass
        if self.forwarder is not None:
            self.forwarder.close()
        if self.isolated:
            self._remove_namespaces()
