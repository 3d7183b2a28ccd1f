"""`pipeboard up`, `pipeboard worker`, `pipeboard migrate`: running the service.

`up` checks the configuration first and stops with ONE line naming the bad setting (exit code 2),
migrates the database, then runs uvicorn and the Celery workers as child processes, each in its own
process group, restarts any of them that dies (with backoff, saying so; app/cli/supervise.py) and
stops them all on Ctrl-C or SIGTERM. Authentication is on from the first start
(Jupyter's way): when the database has no admin token that works, `up` creates one and prints it
once, in a dashboard URL that signs in with it (`#token=`: a fragment, so it reaches no server log).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import typer

SETUP_ERROR = 2  # bad configuration: nothing was started
STOP_TIMEOUT_S = 15.0
API_GRACE_S = 3  # seconds the API server waits for open requests (event streams) when stopped


def register(cli: typer.Typer) -> None:
    """Add this module's commands to the `pipeboard` app."""
    cli.command("up")(up)
    cli.command("worker")(worker)
    cli.command("migrate")(migrate)


def fail(message: str, code: int = SETUP_ERROR) -> None:
    typer.echo(f"pipeboard: {message}", err=True)
    raise typer.Exit(code)


def checked_settings():
    """The settings, or exit with one line naming what is wrong with them."""
    from pydantic import ValidationError

    from pipeboard.app.core.config import get_settings

    try:
        settings = get_settings()
    except ValidationError as exc:
        error = exc.errors()[0]
        name = "PIPEBOARD_" + "_".join(str(p) for p in error["loc"]).upper()
        fail(f"{name}: {error['msg']}")
    problems = settings.problems()
    if problems:
        fail(problems[0])
    return settings


def check_reachable(settings, broker: bool = True) -> None:
    """Exit with one line when the database (or the broker) cannot be reached."""
    from pipeboard.app.services.probes import check_broker, check_database_url, describe_failure, redacted

    timeout_s = max(settings.health_timeout_seconds, 3.0)
    try:
        check_database_url(settings.database_url, timeout_s)
    except Exception as exc:
        fail(f"PIPEBOARD_DATABASE_URL: {redacted(settings.database_url)} is {describe_failure(exc)}")
    if not broker:
        return
    try:
        check_broker(settings, timeout_s)
    except Exception as exc:
        fail(f"PIPEBOARD_BROKER_URL: {redacted(settings.broker_url)} is {describe_failure(exc)}")


def alembic_config():
    from alembic.config import Config

    root = Path(__file__).resolve().parents[2]
    config = Config(str(root / "alembic.ini"))
    config.set_main_option("script_location", str(root / "migrations"))
    config.attributes["configure_logger"] = False  # keep our own logging as it is
    return config


def run_migrations(revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(), revision)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def wait_for_http(url: str, child: subprocess.Popen, should_stop=lambda: False, timeout_s: float = 60.0) -> bool:
    """Whether `url` answered before `child` exited, `should_stop()` or the timeout."""
    import urllib.error
    import urllib.request  # here, not at the top: 25 ms of every other command's start-up

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and child.poll() is None and not should_stop():
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # it answered (503 = something unreachable, still up)
        except OSError:
            time.sleep(0.2)
    return False


def signal_group(child: subprocess.Popen, signum: int) -> None:
    if child.poll() is None:
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass


def stop_groups(children: list[subprocess.Popen], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM every child's process group at once, then SIGKILL what is left after `timeout_s`."""
    for child in children:
        signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(child, signal.SIGKILL)
            child.wait()


def worker_command(concurrency: int, pool: str, hostname: str | None, loglevel: str) -> list[str]:
    from pipeboard.app.worker import worker_argv

    argv = worker_argv(concurrency=concurrency, pool=pool, hostname=hostname, loglevel=loglevel)
    return [sys.executable, "-m", "celery", "-A", "pipeboard.app.worker:celery_app", *argv]


def up(
    host: str = typer.Option("127.0.0.1", help="Address the API listens on."),
    port: int = typer.Option(8000, min=1, max=65535, help="Port the API listens on."),
    workers: int = typer.Option(1, "--workers", min=0, help="Celery worker processes to start (0: none)."),
    concurrency: int = typer.Option(0, min=0, help="Tasks per worker at once (0: PIPEBOARD_WORKER_CONCURRENCY)."),
) -> None:
    """Migrate the database, then serve the API and dashboard with Celery workers until Ctrl-C; restart any that dies."""
    try:
        settings = checked_settings().model_copy(update={"bind_host": host})
        refusal = settings.auth_off_refusal()
        if refusal:
            fail(f"{refusal} (--host {host})")
        check_reachable(settings)
        if not port_free(host, port):
            fail(f"--port {port}: address {host}:{port} is already in use")
        try:
            run_migrations()
        except Exception as exc:
            from pipeboard.app.services.probes import describe_failure

            fail(f"PIPEBOARD_DATABASE_URL: migration failed, {describe_failure(exc).removeprefix('unreachable: ')}")
    except KeyboardInterrupt:  # Ctrl-C before anything was started
        fail("interrupted before start-up finished", code=130)
    serve(settings, host, port, workers, concurrency or settings.worker_concurrency)


def die_with_parent() -> None:
    """In a child: receive SIGTERM if `pipeboard up` itself dies (even by SIGKILL), Linux only."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(settings, host: str, port: int, workers: int, concurrency: int) -> None:
    """Run uvicorn and the workers, each in its own process group, until Ctrl-C or SIGTERM; a
    child that dies is started again (app/cli/supervise.py) while the others keep running."""
    from pipeboard.app.cli.supervise import Child, Supervisor
    from pipeboard.app.core.config import is_wildcard

    stopping = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    loglevel = settings.log_level
    # A server told to stop closes its event streams after a few seconds (their clients resume
    # with Last-Event-ID) rather than live on for as long as some job's stream stays open.
    uvicorn = [sys.executable, "-m", "uvicorn", "pipeboard.app.main:app", "--host", host, "--port", str(port), "--log-level", loglevel,
               "--timeout-graceful-shutdown", str(API_GRACE_S)]
    # The API's Host allow-list and its AUTH=off check need the address it listens on.
    api_env = {**os.environ, "PIPEBOARD_BIND_HOST": host}

    def spawn(argv: list[str], env: dict[str, str] | None = None):
        return lambda: subprocess.Popen(argv, start_new_session=True, preexec_fn=die_with_parent, env=env)

    api = Child("the API server", spawn(uvicorn, api_env))
    children = [api]
    for index in range(workers):
        node = f"pipeboard{index + 1}@{settings.node_name}"
        children.append(Child(f"worker {node}", spawn(worker_command(concurrency, "threads", node, loglevel)), node=node))
    # A wildcard bind answers on every address; this machine's own name for it is the one to show.
    shown_host = "localhost" if is_wildcard(host) else f"[{host}]" if ":" in host else host
    base = f"http://{shown_host}:{port}"
    api_restarted = False

    def on_start(child: Child) -> None:
        nonlocal api_restarted
        api_restarted = api_restarted or child is api

    supervisor = Supervisor(children, say=lambda line: typer.echo(line, err=True), on_exit=worker_lost, on_start=on_start)
    supervisor.start_all()
    try:
        if wait_for_http(f"{base}/api/v1/health", api.process, should_stop=lambda: stopping):
            typer.echo(f"pipeboard is up at {base}  (API docs {base}/docs; Ctrl-C stops)")
            announce_sign_in(settings, base)
        while not stopping:
            supervisor.check()
            if api_restarted and answers(f"{base}/api/v1/health"):
                api_restarted = False
                typer.echo(f"pipeboard: the API server is back at {base}", err=True)
            time.sleep(0.2)
    finally:
        # Celery's warm shutdown lets running tasks finish (or, past the timeout, acks_late
        # hands them back to the queue); uvicorn drains open requests meanwhile.
        stop_groups(supervisor.processes())
    typer.echo("pipeboard stopped")


def answers(url: str) -> bool:
    """Whether an HTTP server answers ``url`` at once (any status)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=0.5):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def worker_lost(child, code: int) -> None:
    """A worker `up` started has died: the jobs it ran are retried now, not once their heartbeats
    go stale (its runs are in process groups of their own, which this ends first)."""
    if child.node is None:
        return
    from pipeboard.app.cli.supervise import describe_exit
    from pipeboard.app.core.db import get_sessionmaker
    from pipeboard.app.services import recovery

    with get_sessionmaker()() as session:
        for line in recovery.node_lost(session, child.node, f"its worker {child.node} exited with {describe_exit(code)}"):
            typer.echo(f"pipeboard: {line}", err=True)


def announce_sign_in(settings, base: str) -> None:
    """Print how to sign in; on a first start (no admin token works) create one and print it, once."""
    if not settings.auth:
        typer.echo("authentication is OFF (PIPEBOARD_AUTH=off): anyone who can reach this address can run code here")
        return
    from pipeboard.app.core.db import get_sessionmaker
    from pipeboard.app.services.tokens import FIRST_ADMIN, ensure_first_admin

    with get_sessionmaker()() as session:
        secret = ensure_first_admin(session)
    if secret is None:
        typer.echo("sign in with an API token: `pipeboard token create NAME --scope write` (or `--scope admin`) "
                   "on this machine prints a new one")
        return
    typer.echo(f"first start: created the admin token {FIRST_ADMIN!r}; it is shown only this once. "
               "Open this URL to sign in with it (keep it secret):")
    typer.echo(f"\n    {base}/#token={secret}\n")


def worker(
    concurrency: int = typer.Option(0, min=0, help="Tasks at once (0: PIPEBOARD_WORKER_CONCURRENCY)."),
    pool: str = typer.Option("threads", help="Celery pool: threads or solo (both let tasks start process groups)."),
    hostname: str = typer.Option("", help="Celery node name (default pipeboard@<node name>)."),
    node_name: str = typer.Option("", "--node-name", help=(
        "This host's name for jobs and timelines, and for placing jobs on several hosts (one worker host per node): "
        "give each host its own (default PIPEBOARD_NODE_NAME, else the machine's host name).")),
    node_address: str = typer.Option("", "--node-address", help=(
        "The address the other worker hosts reach this one at, for torch's rendezvous and training traffic "
        "(default PIPEBOARD_NODE_ADDRESS, else what the node name resolves to).")),
) -> None:
    """Run one Celery worker in the foreground (one per host; see docs/multihost.md for several hosts)."""
    if pool not in ("threads", "solo"):
        fail(f"--pool: {pool!r} is not supported (use threads or solo)")
    if node_name:
        os.environ["PIPEBOARD_NODE_NAME"] = node_name
    if node_address:
        os.environ["PIPEBOARD_NODE_ADDRESS"] = node_address
    from pipeboard.app.core.config import get_settings

    get_settings.cache_clear()
    settings = checked_settings()
    check_reachable(settings)
    command = worker_command(concurrency or settings.worker_concurrency, pool, hostname or f"pipeboard@{settings.node_name}",
                             settings.log_level)
    os.execv(command[0], command)


def migrate(revision: str = typer.Argument("head", help="Alembic revision to upgrade to.")) -> None:
    """Upgrade the database schema (`alembic upgrade`)."""
    check_reachable(checked_settings(), broker=False)
    try:
        run_migrations(revision)
    except Exception as exc:
        fail(f"migrate {revision}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", code=1)
    typer.echo(f"database at {revision}")
