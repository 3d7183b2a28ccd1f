"""Fixtures shared by the whole suite.

Isolation: at import, PIPEBOARD_* variables are cleared and DATA_DIR points at a fresh temp
folder, so no test touches ./data or a developer's configuration. PostgreSQL tests use their
own schema (dropped at the end); Redis tests use their own key prefix. Several people can run
the suite on one machine at once.

Databases
- `db_url`: URL of a migrated-shape database (all tables), parametrised `sqlite` / `postgres`.
- `empty_db_url`: a database without tables (migration tests), same two parameters.
- `db_engine`: an engine on `db_url`. `session`: a Session inside a transaction that is rolled back
  after the test (commits inside the test only release a SAVEPOINT).
- `client`: a TestClient on a fresh `create_app()` whose `get_session` is that `session`, sending
  a write token (every write needs one). `anonymous`: a client of the same app with no token.
  `make_token(scope)`: a new token's secret, in the test's `session`; `bearer(secret)`: its header.

Services: PostgreSQL and Redis come from PIPEBOARD_TEST_POSTGRES_URL / PIPEBOARD_TEST_REDIS_URL
(default the local servers). Unreachable: the test skips, or FAILS under CI=true.

Workers
- `sqlite_broker_env` / `redis_broker_env`: PIPEBOARD_* variables of a private deployment
  (SQLite database and broker under tmp_path, or Redis with a private key prefix).
- `start_worker(env)`: a real `celery worker` subprocess (thread pool, own process group) for
  that deployment, returned once it answered a `pipeboard.ping`; stopped after the test.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kombu.pools
import pytest

if os.environ.get("MUTANT_UNDER_TEST") is not None:
    # mutmut (docs/mutation-testing.md) names a mutant by its file's path (trainer/plan/formulas.py:
    # trainer.plan.formulas) and puts its mutated copy of trainer/ on sys.path as `trainer`; the
    # code under test imports pipeboard.trainer, which must be that copy, under that name.
    import importlib.util

    _spec = importlib.util.spec_from_file_location("pipeboard_module_alias", "trainer/task/old_name.py")
    _alias = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_alias)
    _alias.ModuleAlias("pipeboard.trainer", "trainer").install()

for _name in [n for n in os.environ if n.startswith("PIPEBOARD_") and not n.startswith("PIPEBOARD_TEST_")]:
    del os.environ[_name]
SESSION_DIR = Path(tempfile.mkdtemp(prefix="pipeboard-test-"))
os.environ["PIPEBOARD_DATA_DIR"] = str(SESSION_DIR / "data")

from sqlalchemy import Engine, text  # noqa: E402  (after the environment is fixed)
from sqlalchemy.orm import Session  # noqa: E402

from pipeboard.app.core.config import settings_from_env  # noqa: E402,F401  (tests import it from here too)
from pipeboard.app.core.db import make_engine, private_schema, with_search_path  # noqa: E402,F401
from pipeboard.app.models import Base  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI") == "true"
POSTGRES_URL = os.environ.get("PIPEBOARD_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("PIPEBOARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


# Each test process picks server ports from a band of its own, below the kernel's ephemeral ports
# (32768 and up on Linux): bind(0) drew from the band every process shares, and between a
# test's pick and its server's bind another process's pick or outgoing connection could take the
# same port (a deployment then found another test's server answering on its port).
PORT_BAND = 2500


def _port_band() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 8
    low = 10000 + (index % 9) * PORT_BAND
    return range(low, low + PORT_BAND)


_ports: Iterator[int] | None = None  # this process's band, in turn (made on first use: xdist names the process by then)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, from this process's band, each in turn."""
    global _ports
    _ports = _ports or itertools.cycle(_port_band())
    for port in itertools.islice(_ports, PORT_BAND):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_port_band()}")


def unavailable(message: str) -> None:
    """Skip, or fail under CI=true, where every service must be there."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def require_postgres() -> str:
    """PIPEBOARD_TEST_POSTGRES_URL once it answers (else skip / fail in CI)."""
    try:
        engine = make_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        unavailable(f"PostgreSQL unreachable at {POSTGRES_URL}: {str(exc).splitlines()[0]}")
    return POSTGRES_URL


def require_redis() -> str:
    """PIPEBOARD_TEST_REDIS_URL once it answers PING (else skip / fail in CI)."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3, socket_timeout=3).ping()
    except Exception as exc:
        unavailable(f"Redis unreachable at {REDIS_URL}: {exc}")
    return REDIS_URL


@pytest.fixture(scope="session", autouse=True)
def _remove_session_dir() -> Iterator[None]:
    yield
    shutil.rmtree(SESSION_DIR, ignore_errors=True)


@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database with every table of pipeboard.app.models, on SQLite or on PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{SESSION_DIR}/db-{uuid.uuid4().hex[:8]}.sqlite"
        drop = None
    else:
        url, drop = private_schema(require_postgres())
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    yield url
    if drop is not None:
        drop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no tables at all (for migrations), on SQLite or PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/empty.sqlite"
        return
    url, drop = private_schema(require_postgres(), prefix="pbm")
    yield url
    drop()


@pytest.fixture(scope="session")
def db_engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def session(db_engine: Engine) -> Iterator[Session]:
    """A session whose work is rolled back after the test ("join an external transaction")."""
    connection = db_engine.connect()
    transaction = connection.begin()
    db_session = Session(bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False)
    try:
        yield db_session
    finally:
        db_session.close()
        transaction.rollback()
        connection.close()


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def make_token(session: Session) -> Callable[..., str]:
    """Factory: `make_token("admin", name=None, expires_at=None)` -> the secret of a new token."""
    from pipeboard.app.services.tokens import create_token

    def make(scope: str = "write", name: str | None = None, expires_at: Any = None) -> str:
        _, secret = create_token(session, name or f"t-{scope}", scope, expires_at=expires_at)
        session.commit()
        return secret

    return make


# TestClient's default host, testserver, is not one the API answers (its Host allow-list).
TEST_BASE_URL = "http://localhost"


def app_on(session: Session, settings: Any = None) -> Any:
    """A fresh `create_app(settings)` whose requests all use `session`."""
    from pipeboard.app.core.db import get_session
    from pipeboard.app.main import create_app

    app = create_app(settings)
    app.dependency_overrides[get_session] = lambda: session
    return app


@pytest.fixture
def client(session: Session, make_token: Callable[..., str]) -> Iterator[Any]:
    """A TestClient on a fresh app whose requests all use the test's `session`, sending a write
    token named `suite-writer` (a request may send another in its own headers)."""
    from fastapi.testclient import TestClient

    with TestClient(app_on(session), base_url=TEST_BASE_URL, headers=bearer(make_token("write", "suite-writer"))) as test_client:
        yield test_client


@pytest.fixture
def anonymous(session: Session) -> Iterator[Any]:
    """A client that sends no token (anyone who can reach the server), on a fresh app with the
    test's `session`; used alone, the database holds no token at all: a first start."""
    from fastapi.testclient import TestClient

    with TestClient(app_on(session), base_url=TEST_BASE_URL) as test_client:
        yield test_client


def deployment_env(tmp: Path, redis_url: str | None = None) -> dict[str, str]:
    """PIPEBOARD_* variables of a private deployment in `tmp`: SQLite database, and the SQLite
    broker, or `redis_url` as broker and results under a key prefix of its own."""
    env = {"PIPEBOARD_DATA_DIR": str(tmp / "data"), "PIPEBOARD_HEARTBEAT_SECONDS": "0.5"}
    if redis_url is not None:
        env |= {
            "PIPEBOARD_BROKER_URL": redis_url,
            "PIPEBOARD_RESULT_BACKEND": redis_url,
            "PIPEBOARD_KEY_PREFIX": f"pbtest-{uuid.uuid4().hex[:12]}:",
        }
    return env


@pytest.fixture
def sqlite_broker_env(tmp_path: Path) -> dict[str, str]:
    """The embedded deployment in tmp_path: SQLite database, SQLite broker, SQLite results."""
    return deployment_env(tmp_path)


@pytest.fixture
def redis_broker_env(tmp_path: Path) -> dict[str, str]:
    """SQLite database in tmp_path, Redis broker and results under a key prefix of this test's own."""
    return deployment_env(tmp_path, require_redis())


@dataclass
class RunningWorker:
    """A `celery worker` subprocess and a client Celery app on the same broker."""

    process: subprocess.Popen
    env: dict[str, str]
    log_path: Path
    client: Any = field(repr=False)

    @property
    def settings(self) -> Any:
        return settings_from_env(self.env)

    def call(self, task: str, *args: Any, timeout: float = 30, **kwargs: Any) -> Any:
        """Send `task` and wait for its result."""
        return self.client.send_task(task, args=args, kwargs=kwargs).get(timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 20) -> int:
        """Warm shutdown (SIGTERM to its process group), SIGKILL after `timeout`; the exit code."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        self.client.close()
        # kombu keeps global Redis connection pools with after-fork hooks; a later fork in this
        # process (the trainer runtime forks its workers) runs those hooks in the child, which
        # then hangs on sockets shared with the parent. Drop the pools, and the hooks with them.
        kombu.pools.reset()
        return self.process.returncode


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., RunningWorker]]:
    """Factory: `start_worker(env, concurrency=2)` -> a ready RunningWorker (stopped at teardown).

    The deployment's database gets every table first, as `pipeboard up` would migrate it.
    """
    from pipeboard.app.worker import make_celery, worker_argv

    started: list[RunningWorker] = []

    def start(env: dict[str, str], concurrency: int = 2, ready_timeout: float = 60) -> RunningWorker:
        settings = settings_from_env(env)
        engine = make_engine(settings.database_url)
        Base.metadata.create_all(engine)
        engine.dispose()
        log_path = tmp_path / f"worker-{len(started)}.log"
        hostname = f"test{len(started)}-{uuid.uuid4().hex[:6]}@%h"
        argv = worker_argv(concurrency=concurrency, hostname=hostname, loglevel="info")
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "pipeboard.app.worker:celery_app", *argv],
                cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = RunningWorker(process, dict(env), log_path, make_celery(settings))
        started.append(worker)
        deadline = time.monotonic() + ready_timeout
        while True:  # ready = a real round trip through the broker
            if process.poll() is not None:
                raise RuntimeError(f"worker exited with {process.returncode}:\n{worker.log()[-3000:]}")
            try:
                worker.call("pipeboard.ping", timeout=2)
                return worker
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker not ready after {ready_timeout}s:\n{worker.log()[-3000:]}")

    yield start
    for worker in started:
        worker.stop()


def pytest_collection_modifyitems(items):
    """schemathesis 4 names every operation's item after the test function (pytest 9 builds the node
    id from it), so all of a test's operations share one id and pytest-xdist runs only one of them:
    each item gets its operation in its id."""
    for item in items:
        label = getattr(item, "operation_label", None)
        if label and label not in item.nodeid:
            from _pytest.nodeid import coerce_node_id  # pytest 9 keeps the id as a structured NodeId

            item._id = coerce_node_id(f"{item.nodeid}[{label}]")
