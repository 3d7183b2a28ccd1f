"""Worker hosts on this one machine, each started as an operator starts one per machine
(docs/multihost.md): `pipeboard worker --node-name NAME --node-address ADDRESS`, with the
deployment's PostgreSQL and Redis in its environment and a data folder of its own.

``HostNetwork``: where this process may (root, `ip`, `socat`), each host runs in a network namespace
of its own. The hosts reach each other only over a veth pair between their namespaces (torch's
rendezvous and gloo: GLOO_SOCKET_IFNAME names it); PostgreSQL and Redis listen on this machine's
loopback, which a namespace cannot see, so each namespace has a second veth to this one and socat
relays the services' ports on its address here. bwrap's own `--unshare-net` would leave each host
only a loopback of its own: no path to the other host."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from bench.service_probe import ROOT, end_group, pipeboard_argv

SERVICE_KEYS = ("PIPEBOARD_DATABASE_URL", "PIPEBOARD_BROKER_URL", "PIPEBOARD_RESULT_BACKEND")


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=20)


def service_ports(env: dict[str, str]) -> list[int]:
    """The TCP ports of the deployment's PostgreSQL and Redis."""
    ports = {urlsplit(env[k]).port or (6379 if env[k].startswith("redis") else 5432) for k in SERVICE_KEYS if k in env}
    return sorted(ports)


class HostNetwork:
    """Two network namespaces joined by a veth pair, each with a path to this machine's services
    on ``ports``; ``isolated`` False (and every method a no-op) where they cannot be made."""

    def __init__(self, ports: list[int]) -> None:
        self.tag = uuid.uuid4().hex[:5]
        self.subnet = 200 + int(self.tag, 16) % 50  # 10.<subnet>.x.y: not this machine's, unlikely another run's
        self.relays: list[subprocess.Popen] = []
        self.made: list[tuple[str, ...]] = []  # `ip` arguments that remove what was made, in order
        self.isolated = os.geteuid() == 0 and bool(shutil.which("ip")) and bool(shutil.which("socat"))
        if self.isolated:
            try:
                self.build(ports)
            except (subprocess.CalledProcessError, OSError):
                self.close()
                self.isolated = False

    def namespace(self, i: int) -> str:
        return f"pb{self.tag}n{i}"

    def link(self, i: int) -> str:
        """Host ``i``'s interface towards the other host."""
        return f"pb{self.tag}l{i}"

    def address(self, i: int) -> str:
        """Where the other host reaches host ``i``."""
        return f"10.{self.subnet}.0.{i + 1}" if self.isolated else "127.0.0.1"

    def gateway(self, i: int) -> str:
        """This machine's address as host ``i`` sees it (where socat relays the services)."""
        return f"10.{self.subnet}.{i + 1}.1"

    def build(self, ports: list[int]) -> None:
        for i in range(2):
            ns, here = self.namespace(i), f"pb{self.tag}o{i}"
            ip("netns", "add", ns)
            self.made.append(("netns", "del", ns))
            ip("-n", ns, "link", "set", "lo", "up")
            ip("link", "add", here, "type", "veth", "peer", "name", f"pb{self.tag}i{i}", "netns", ns)
            self.made.append(("link", "del", here))
            ip("addr", "add", f"{self.gateway(i)}/24", "dev", here)
            ip("link", "set", here, "up")
            ip("-n", ns, "addr", "add", f"10.{self.subnet}.{i + 1}.2/24", "dev", f"pb{self.tag}i{i}")
            ip("-n", ns, "link", "set", f"pb{self.tag}i{i}", "up")
            self.relays += [subprocess.Popen(["socat", f"TCP-LISTEN:{port},bind={self.gateway(i)},reuseaddr,fork",
                                              f"TCP:127.0.0.1:{port}"], stderr=subprocess.DEVNULL, start_new_session=True)
                            for port in ports]
        ip("link", "add", self.link(0), "netns", self.namespace(0), "type", "veth", "peer", "name", self.link(1),
           "netns", self.namespace(1))
        for i in range(2):
            ip("-n", self.namespace(i), "addr", "add", f"{self.address(i)}/24", "dev", self.link(i))
            ip("-n", self.namespace(i), "link", "set", self.link(i), "up")

    def command(self, i: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(i), *argv] if self.isolated else argv

    def environment(self, i: int, env: dict[str, str]) -> dict[str, str]:
        """``env`` as host ``i`` needs it: the services at its gateway, gloo on its link."""
        if not self.isolated:
            return env
        moved = {k: v.replace("@127.0.0.1:", f"@{self.gateway(i)}:").replace("//127.0.0.1:", f"//{self.gateway(i)}:")
                 for k, v in env.items() if k in SERVICE_KEYS}
        return {**env, **moved, "GLOO_SOCKET_IFNAME": self.link(i)}

    def close(self) -> None:
        for relay in self.relays:  # socat and the children it forked per connection
            os.killpg(relay.pid, signal.SIGTERM)
            relay.wait(10)
        for undo in reversed(self.made):
            subprocess.run(["ip", *undo], capture_output=True, timeout=20)


class WorkerHost:
    """Host ``name``'s `pipeboard worker` (one task at a time), its data in ``folder / name``; in
    ``network``'s namespace ``index`` when given."""

    def __init__(self, name: str, env: dict[str, str], folder: Path, network: HostNetwork | None = None,
                 index: int = 0) -> None:
        self.name, self.env, self.network, self.index = name, env, network, index
        self.data = folder / name
        self.log = folder / f"worker-{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        address = self.network.address(self.index) if self.network else "127.0.0.1"
        argv = pipeboard_argv("worker", "--concurrency", "1", "--node-name", self.name, "--node-address", address)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIPEBOARD_")}, **self.env,
               "PIPEBOARD_DATA_DIR": str(self.data)}
        if self.network:
            argv, env = self.network.command(self.index, argv), self.network.environment(self.index, env)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def kill(self) -> None:
        """SIGKILL the worker process alone (its runs' process groups are left to the service)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None:
            end_group(self.proc, 20)

    def tail(self, chars: int = 3000) -> str:
        return f"--- {self.log.name}\n{self.log.read_text(errors='replace')[-chars:]}" if self.log.exists() else ""
