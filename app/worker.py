"""The one Celery app (`celery_app`), configured from the settings.

Start a worker with `pipeboard worker` (or `celery -A pipeboard.app.worker:celery_app worker -P threads`).
The thread pool is deliberate: prefork children are daemonic processes, and a task must be able
to start a training run as its own process group. Job tasks live in `pipeboard.app.tasks` and stay thin;
this module only adds `pipeboard.ping`, a real round trip for health checks and benchmarks.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import kombu.transport.sqlalchemy
from celery import Celery, signals

from pipeboard.app.core import polling
from pipeboard.app.core.config import Settings, get_settings, scheme_of
from pipeboard.app.core.devices import probe_devices_apart

logger = logging.getLogger(__name__)

# Kombu's SQLAlchemy transport hands every broker_transport_options key to create_engine(), so
# the polling interval cannot go there; as a class attribute it stops each task from waiting
# about a second (the default) before an idle worker looks again (and app/core/polling.py
# makes it a second again while this worker trains a job).
kombu.transport.sqlalchemy.Transport.polling_interval = property(polling.interval)

# Long training runs are acknowledged late; Redis would redeliver any task still unacknowledged
# after its visibility timeout (default one hour), so make that longer than any run.
REDIS_VISIBILITY_TIMEOUT_S = 7 * 24 * 3600


def _task_modules() -> list[str]:
    # The worker imports these at start (a deployment without the task module still starts).
    return [name for name in ("pipeboard.app.tasks",) if importlib.util.find_spec(name) is not None]


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings for this service's broker and result backend."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)  # SQLite broker/results live there
    broker_scheme = scheme_of(settings.broker_url)
    redis_prefix = {"global_keyprefix": settings.key_prefix} if settings.key_prefix else {}
    if broker_scheme in ("redis", "rediss"):
        transport_options: dict[str, Any] = {"visibility_timeout": REDIS_VISIBILITY_TIMEOUT_S, **redis_prefix}
    elif broker_scheme.startswith("sqla"):
        # create_engine() keywords: wait on a busy SQLite file rather than fail.
        transport_options = {"connect_args": {"timeout": 30, "check_same_thread": False}}
    else:
        transport_options = {}
    config: dict[str, Any] = {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend,
        "broker_transport_options": transport_options,
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_track_started": True,
        "result_expires": 7 * 24 * 3600,
        "worker_hijack_root_logger": False,
        "worker_pool": "threads",
        # every worker also consumes a queue of its own (<node>.dq2): a job on several hosts sends
        # each host it reserved its part there (app/services/multihost.py)
        "worker_direct": True,
        "worker_concurrency": settings.worker_concurrency,
        "timezone": "UTC",
    }
    if scheme_of(settings.result_backend) in ("redis", "rediss") and redis_prefix:
        config["result_backend_transport_options"] = redis_prefix
    if scheme_of(settings.result_backend).startswith("db+sqlite"):
        config["database_engine_options"] = {"connect_args": {"timeout": 30}}
    return config


def make_celery(settings: Settings | None = None) -> Celery:
    """A Celery app for `settings` (the module's `celery_app` uses the process settings)."""
    app = Celery("pipeboard", include=_task_modules())
    app.conf.update(celery_config(settings or get_settings()))
    return app


celery_app = make_celery()


@celery_app.task(name="pipeboard.ping")
def ping(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Echo the arguments with the worker's clock: liveness and pick-up latency probes."""
    return {
        "args": list(args),
        "kwargs": kwargs,
        "worker_time": time.time(),
        "hostname": ping.request.hostname,
        "pid": os.getpid(),
    }


def broker_supports_broadcast(broker_url: str) -> bool:
    """Whether Celery's remote control (ping, shutdown) reaches workers over this broker."""
    return scheme_of(broker_url) in ("redis", "rediss", "amqp", "pyamqp")


class WorkerHeartbeatThread(threading.Thread):
    """Keeps this worker's row in `worker_heartbeats` fresh, and removes it on shutdown."""

    def __init__(self, hostname: str, pool: str, concurrency: int, interval_s: float) -> None:
        super().__init__(name="pipeboard-heartbeat", daemon=True)
        self.hostname, self.pool, self.concurrency, self.interval_s = hostname, pool, concurrency, interval_s
        self.stopped = threading.Event()
        self.started_at: Any = None
        self.devices: list[dict[str, Any]] | None = None  # None until probed (after the first beat)

    def probe(self) -> None:
        """This worker's GPUs (app/core/devices.py), probed once at start; the same list goes with
        every beat after (a GPU does not come or go under a running worker). A failed probe is
        logged and reported as no GPU, so placement sends this worker no cuda job."""
        try:
            self.devices = probe_devices_apart()
        except RuntimeError as exc:
            logger.warning("%s; reporting no GPU", exc)
            self.devices = []
        logger.info("worker %s: %d GPU(s)%s", self.hostname, len(self.devices),
                    "".join(f"; cuda:{d['index']} {d['name']}" for d in self.devices))

    def beat(self) -> None:
        from pipeboard.app.core.db import get_sessionmaker
        from pipeboard.app.models import WorkerHeartbeat, utcnow

        from sqlalchemy import update

        now = utcnow()
        self.started_at = self.started_at or now
        row = {"pid": os.getpid(), "pool": self.pool, "concurrency": self.concurrency, "started_at": self.started_at,
               "seen_at": now, "host": get_settings().node_name, "address": get_settings().node_address or None,
               "devices": self.devices}
        with get_sessionmaker()() as session:
            # The write first, then an insert if there was no row: a read first (merge) would fail
            # at once on SQLite whenever another process wrote in between (app/services/tx.py).
            if session.execute(update(WorkerHeartbeat).where(WorkerHeartbeat.hostname == self.hostname).values(**row)).rowcount == 0:
                session.add(WorkerHeartbeat(hostname=self.hostname, **row))
            session.commit()

    def run(self) -> None:
        probed = False
        while not self.stopped.is_set():
            try:
                self.beat()
                if not probed:
                    # the first beat says the worker is alive at once (devices None: not known yet);
                    # the probe imports torch in a child, seconds; then beat again with its answer
                    probed = True
                    self.probe()
                    continue
            except Exception as exc:  # a missing table or a busy database must not kill the worker
                logger.warning("worker heartbeat failed: %s", exc)
            self.stopped.wait(self.interval_s)

    def stop(self) -> None:
        from pipeboard.app.core.db import get_sessionmaker
        from pipeboard.app.models import WorkerHeartbeat

        self.stopped.set()
        try:
            with get_sessionmaker()() as session:
                row = session.get(WorkerHeartbeat, self.hostname)
                if row is not None:
                    session.delete(row)
                    session.commit()
        except Exception as exc:
            logger.warning("could not remove worker heartbeat: %s", exc)


_heartbeat: WorkerHeartbeatThread | None = None


@signals.worker_ready.connect
def _start_heartbeat(sender: Any = None, **_: Any) -> None:
    global _heartbeat
    controller = getattr(sender, "controller", None)
    pool_cls = getattr(controller, "pool_cls", None)
    pool = getattr(pool_cls, "__module__", str(pool_cls)).rsplit(".", 1)[-1]
    concurrency = int(getattr(controller, "concurrency", 1) or 1)
    _heartbeat = WorkerHeartbeatThread(sender.hostname, pool, concurrency, get_settings().heartbeat_seconds)
    _heartbeat.start()


@signals.worker_shutdown.connect
def _stop_heartbeat(**_: Any) -> None:
    if _heartbeat is not None:
        _heartbeat.stop()


def worker_argv(
    *, concurrency: int, pool: str = "threads", hostname: str | None = None, loglevel: str = "info"
) -> list[str]:
    """Arguments of `celery worker` for this app (used by `pipeboard up`/`worker` and tests)."""
    argv = ["worker", f"--pool={pool}", f"--concurrency={concurrency}", f"--loglevel={loglevel}",
            "--without-gossip", "--without-mingle"]
    if hostname:
        argv.append(f"--hostname={hostname}")
    return argv


def project_root() -> Path:
    return Path(__file__).resolve().parents[1]
