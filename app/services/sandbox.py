"""Users' code in a sandbox: Debian's bubblewrap (``bwrap``) gives it a filesystem of its own.

What a sandboxed process sees (docs/sandbox.md says the same for operators):

- the installed environment, read-only: /usr (and the /bin, /lib links into it), the Python
  installation and virtual environment running this worker, pipeboard's own source, a few files
  of /etc that programs need (the loader's cache, hosts, resolv.conf, passwd, TLS roots);
- its own folders, writable: the job's work folder (or the model's unpacked context), the
  machine's calibration folder for a profile, the job's checkpoints for its training, and the
  folder of the relay's socket through which a training run reports (app/services/run_relay.py);
- its data, read-only: the job's or model's data location when it names one outside those;
- a /tmp and a /dev/shm of its own (empty; torch's shared-memory transport between a run's
  processes works inside, they all share the one sandbox), /proc of its own process namespace,
  /sys read-only, GPUs' device files where the host has them;
- the host's network, loopback included (gloo, torch's rendezvous, a multi-host job's peers).

Not there: the server's data folder (other users' contexts and jobs, the SQLite database and with
it the token table), any other file of this machine, the worker's processes (its own process
namespace: no /proc/PID/environ of the worker to read). Its environment loses every
``PIPEBOARD_*`` setting (database and broker URLs, tokens) but the few the trainer reads, and
any variable whose name says it holds a secret.

``PIPEBOARD_SANDBOX``: ``auto`` (default) sandboxes where bwrap works here, ``on`` refuses to run
users' code without it, ``off`` runs it as before (the worker's own view).
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from pipeboard.app.services.errors import ServiceError

log = logging.getLogger(__name__)

# The PIPEBOARD_* settings users' code may keep: what the trainer itself reads (and the tree's
# mark, app/services/proctree.py); every other one (database, broker, tokens) is dropped.
KEPT_SETTINGS = frozenset({"PIPEBOARD_TREE", "PIPEBOARD_CPU_MATMUL", "PIPEBOARD_P2P", "PIPEBOARD_NODE_NAME",
                           "PIPEBOARD_SCHEDULES", "PIPEBOARD_RUN_GROUP",
                           # the run's detail windows (trainer.runtime.detail.DetailPolicy.from_env, docs/storage.md)
                           *(f"PIPEBOARD_DETAIL_{n}" for n in ("FIRST_STEPS", "EVERY", "WIDTH", "MAX_WINDOWS",
                                                               "BEFORE_FAILURE", "MAX_QUEUED"))})
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|DATABASE_URL"
                         r"|REDIS_URL|BROKER_URL", re.IGNORECASE)
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "hosts", "host.conf", "resolv.conf", "nsswitch.conf",
             "passwd", "group", "localtime", "ssl", "ca-certificates", "alternatives", "os-release", "mime.types",
             "gai.conf", "protocols", "services")


class SandboxUnavailable(ServiceError):
    """PIPEBOARD_SANDBOX=on, and bubblewrap cannot run here: the job or validation fails saying so."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=503, field="sandbox")


@functools.lru_cache(maxsize=1)
def probe() -> str | None:
    """None when bwrap can start a sandbox here (a process namespace, /proc, binds); else why not."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed (Debian: apt-get install bubblewrap)"
    try:
        done = subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
                               "--die-with-parent", "true"], capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start: {exc}"
    if done.returncode != 0:
        return f"bwrap cannot make a sandbox here: {done.stderr.strip()[:300] or f'exit code {done.returncode}'}"
    return None


def enabled() -> bool:
    """Whether users' code runs sandboxed now (PIPEBOARD_SANDBOX); SandboxUnavailable for ``on``
    where bwrap cannot run."""
    from pipeboard.app.core.config import get_settings  # here: the relay imports this module before it starts the run

    mode = get_settings().sandbox
    if mode == "off":
        return False
    why = probe()
    if why is None:
        return True
    if mode == "on":
        raise SandboxUnavailable(f"PIPEBOARD_SANDBOX=on, but {why}")
    log.warning("users' code runs without a sandbox (PIPEBOARD_SANDBOX=auto): %s", why)
    return False


def clean_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the server's settings and secrets (KEPT_SETTINGS stay)."""
    return {k: v for k, v in env.items()
            if (k in KEPT_SETTINGS or not k.startswith("PIPEBOARD_")) and (k in KEPT_SETTINGS or not SECRET_NAME.search(k))}


def _installed() -> list[Path]:
    """The folders the worker's Python and pipeboard itself run from."""
    import pipeboard.app

    places = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.base_exec_prefix),
              Path(pipeboard.app.__file__).resolve().parents[1]}
    places |= {Path(p) for p in sys.path if p and Path(p).is_dir()}  # where the trainer imports from
    for exe in (sys.executable, os.path.realpath(sys.executable)):
        places.add(Path(exe).parent)
    return sorted(p.resolve() for p in places if p.exists() and p.resolve() != Path("/"))


def _minimal(paths: Iterable[Path]) -> list[Path]:
    """The paths without those inside another of them (one bind each)."""
    ordered = sorted({Path(p) for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in ordered:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return kept


def command(cmd: list[str], env: dict[str, str], *, cwd: str, writable: Iterable[Path],
            readable: Iterable[Path] = ()) -> tuple[list[str], dict[str, str]]:
    """``cmd`` and its environment wrapped in bwrap: the view the module docstring describes,
    with ``writable`` and ``readable`` bound at their own paths, ``cwd`` its working folder."""
    bwrap = shutil.which("bwrap") or "bwrap"
    from pipeboard.app.core.config import get_settings

    data_dir = get_settings().data_dir
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm", "--tmpfs", "/tmp",
            "--ro-bind", "/usr", "/usr", "--ro-bind-try", "/sys", "/sys"]
    for name in ("bin", "lib", "lib32", "lib64", "sbin"):
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for device in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri")):
        args += ["--dev-bind-try", device, device]
    installed = [p for p in _minimal(_installed()) if p != Path("/usr") and Path("/usr") not in p.parents]
    for path in installed:
        args += ["--ro-bind", str(path), str(path)]
    # The server's data folder may sit inside a bound one (./data under the project): hidden.
    if any(data_dir == p or p in data_dir.parents for p in installed):
        args += ["--tmpfs", str(data_dir)]
    for path in _minimal(Path(p).resolve() for p in readable if Path(p).exists()):
        args += ["--ro-bind", str(path), str(path)]
    for path in _minimal(Path(p).resolve() for p in writable):
        path.mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(path), str(path)]
    args += ["--chdir", str(Path(cwd).resolve()), "--"]
    return args + list(cmd), inner_env(env)


def inner_env(env: dict[str, str]) -> dict[str, str]:
    """The environment a sandboxed command gets from ``env`` (clean_env, its own /tmp)."""
    inner = clean_env(env)
    inner.pop("PIPEBOARD_PARENT_PID", None)  # another process namespace: bwrap's --die-with-parent instead
    inner["TMPDIR"] = "/tmp"
    return inner


def data_paths(values: Iterable[str | None], cwd: str) -> list[Path]:
    """The data locations named (a file, a folder, or a comma-separated list), absolute."""
    found: list[Path] = []
    for value in values:
        for part in (value or "").split(","):
            part = part.strip()
            if part:
                found.append(Path(cwd, os.path.expanduser(part)))
    return found


def schedule_files() -> list[Path]:
    """PIPEBOARD_SCHEDULES' files, which the trainer imports inside the sandbox too."""
    return [Path(p.strip()) for p in os.environ.get("PIPEBOARD_SCHEDULES", "").split(",") if os.sep in p.strip()]


def for_phase(phase: str, cmd: list[str], env: dict[str, str], *, cwd: str, workdir: Path
              ) -> tuple[list[str], dict[str, str]]:
    """A job phase's command as the runner starts it, sandboxed where the sandbox is on: ``profile``
    with users' code, its data and the calibration folder; ``train`` (``pipeboard train`` or the
    elastic agent that starts it) with the job's work folder, its checkpoints and data, behind the
    relay that writes its reports to the database from outside (app/services/run_relay.py)."""
    if phase not in ("profile", "train") or not enabled():
        return cmd, env
    value = {flag: cmd[i + 1] for i, flag in enumerate(cmd[:-1]) if flag.startswith("--")}
    writable = [workdir, Path(cwd)]
    readable = schedule_files() + _model_caches()
    if phase == "profile":
        if value.get("--machine-cache"):
            writable.append(Path(value["--machine-cache"]))
        readable += data_paths([value.get("--data")], cwd)
        return command(cmd, env, cwd=cwd, writable=writable, readable=readable)
    if "--config" in value:  # the run file: where it checkpoints, what it reads
        run = json.loads(Path(value["--config"]).read_text())
        if run.get("checkpoint_dir"):
            writable.append(Path(run["checkpoint_dir"]))
        readable += data_paths([run.get("data")], cwd)
    if "--job-id" not in value:  # reports to no job: nothing to relay
        return command(cmd, env, cwd=cwd, writable=writable, readable=readable)
    relay = Path(tempfile.mkdtemp(prefix="pipeboard-relay-"))  # short: a socket's path has 107 bytes at most
    inner, _ = command(cmd, env, cwd=cwd, writable=writable + [relay], readable=readable)
    outer = [sys.executable, "-m", "pipeboard.app.services.run_relay", "--job-id", value["--job-id"],
             "--socket", str(relay / "sink")]
    if value.get("--attempt"):
        outer += ["--attempt", value["--attempt"]]
    return outer + ["--", *inner], env  # the relay keeps the worker's settings; it gives the run inner_env


def _model_caches() -> list[Path]:
    """Downloaded models and datasets the zoo reads offline (Hugging Face's cache)."""
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return [Path(home)] if os.path.isdir(home) else []
