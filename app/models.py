"""SQLAlchemy 2 tables for pipeboard's domain.

Models -> Profiles -> Plans -> Jobs, plus the append-heavy data a job produces: timeline events,
metric points and its event log (the Server-Sent Events stream). Those three tables have a
composite primary key (job_id, [source,] seq): rows go in with one executemany per batch
(no RETURNING needed) and come out ordered by the key, which is also the index for reads by
(job, sequence). A writer picks seq = last + 1; a concurrent writer with the same seq hits the
key and retries, so seq order is commit order and an SSE reader resuming after id N misses nothing.

Changing the schema: add a column or table here with a small edit and a new Alembic revision
(`alembic revision --autogenerate -m "..."`); never edit a committed revision.
"""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names: Alembic's batch mode on SQLite recreates tables and needs them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python, on SQLite as on PostgreSQL.

    SQLite stores no zone and hands back naive datetimes; this re-attaches UTC on the way out
    and converts aware values to UTC on the way in, so comparisons never mix naive and aware.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON, list[Any]: JSON}


def _str_enum(enum_cls: type[enum.Enum], name: str) -> Enum:
    # VARCHAR + CHECK rather than a native PostgreSQL ENUM: adding a value later is then a plain
    # migration on both databases, and values_callable stores "queued", not "QUEUED".
    return Enum(
        enum_cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
        values_callable=lambda members: [m.value for m in members],
    )


class JobStatus(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class EventSource(str, enum.Enum):
    MEASURED = "measured"
    PREDICTED = "predicted"


class TokenScope(str, enum.Enum):
    READ = "read"  # GET routes
    WRITE = "write"  # every route but token management
    ADMIN = "admin"  # everything, token management too


class ModelStatus(str, enum.Enum):
    VALIDATING = "validating"  # a worker builds, splits and runs one batch of it
    READY = "ready"
    FAILED = "failed"  # `message` says why


class User(Base):
    """Who owns work: each API token belongs to one user. Jobs, models, profiles and code contexts
    are their owner's; a token of scope `admin` sees and acts on everyone's (app/api/ownership.py).
    Migration 0006 made the tokens that existed before users the `admin` user's."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(120), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ContextAccess(Base):
    """Who may see and use a code context. Contexts are stored once by content (`sha256`), but each
    user who uploaded the same bytes, or was shared it (`POST /contexts/{sha}/share`), has a row."""

    __tablename__ = "context_access"

    sha256: Mapped[str] = mapped_column(ForeignKey("contexts.sha256", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True)
    granted_by: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))  # None: uploaded it
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CodeContext(Base):
    """A user's project archive (.tar.gz or .zip), checked and stored by the SHA-256 of its bytes;
    workers unpack it into their own data folder (app/services/contexts.py)."""

    __tablename__ = "contexts"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    filename: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(8))  # "tar.gz" | "zip"
    size: Mapped[int]
    files: Mapped[int]
    unpacked_bytes: Mapped[int]
    content: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Model(Base):
    """A trainable model: a task factory, as an import path installed on the workers or a path
    inside an uploaded code context. Validated by a worker before it can run (``status``)."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    source: Mapped[str] = mapped_column(String(500))
    kind: Mapped[str] = mapped_column(String(16), default="zoo")  # "zoo" | "import" | "context"
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)  # constructor / data arguments
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    context_sha256: Mapped[str | None] = mapped_column(ForeignKey("contexts.sha256", ondelete="RESTRICT"), index=True)
    data: Mapped[str | None] = mapped_column(String(500))  # the data location its validation used
    status: Mapped[ModelStatus] = mapped_column(_str_enum(ModelStatus, "model_status"), default=ModelStatus.READY)
    message: Mapped[str] = mapped_column(Text, default="")  # why validation failed, or what it found
    layers: Mapped[int | None]
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), index=True)


class Profile(Base):
    """Per-layer measurements: `data` is `pipeboard.trainer.profile.schema.Profile.to_dict()`."""

    __tablename__ = "profiles"

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id", ondelete="SET NULL"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    origin: Mapped[str] = mapped_column(String(16), default="profiled")  # "profiled" | "upload"
    batch_size: Mapped[int | None]
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), index=True)


class Plan(Base):
    """A partition of a profile onto a cluster: `data` is `pipeboard.trainer.plan.Plan.to_dict()`."""

    __tablename__ = "plans"

    id: Mapped[int] = mapped_column(primary_key=True)
    profile_id: Mapped[int] = mapped_column(ForeignKey("profiles.id", ondelete="CASCADE"), index=True)
    request: Mapped[dict[str, Any]]  # what was asked: workers, bandwidth, schedule, ...
    data: Mapped[dict[str, Any]]
    predicted: Mapped[dict[str, Any] | None]  # throughput, against data parallel, ...
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), index=True)  # who asked


class Job(Base):
    """A submitted run (training, or a profiling task), executed by a Celery worker.

    The task starts the run as its own process group; `pid`/`pgid` let cancel end all of it,
    `heartbeat_at` lets a sweeper notice runs whose worker died.
    """

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status_priority_created", "status", "priority", "created_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    kind: Mapped[str] = mapped_column(String(16), default="train")  # "train" | "profile" | ...
    status: Mapped[JobStatus] = mapped_column(_str_enum(JobStatus, "job_status"), default=JobStatus.QUEUED)
    submitted_by: Mapped[str | None] = mapped_column(String(200))  # the API token's name
    priority: Mapped[int] = mapped_column(default=0)
    spec: Mapped[dict[str, Any]]  # the submitted request, as validated
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id", ondelete="SET NULL"), index=True)
    profile_id: Mapped[int | None] = mapped_column(ForeignKey("profiles.id", ondelete="SET NULL"), index=True)
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("plans.id", ondelete="SET NULL"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
    celery_task_id: Mapped[str | None] = mapped_column(String(64), index=True)
    worker_hostname: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None]
    pgid: Mapped[int | None]
    attempt: Mapped[int] = mapped_column(default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    summary: Mapped[dict[str, Any] | None]
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), index=True)


class JobAttempt(Base):
    """One run of a job: the first, each automatic retry of a lost attempt, each manual retry.

    A resumed attempt starts from the newest complete checkpoint (``resume_step``); its timeline
    is shifted by ``offset_s`` (the wall time since the job's first training began), so a job's
    timeline and metrics read as one run. ``hosts`` says which host ran each worker (rank)."""

    __tablename__ = "job_attempts"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(primary_key=True)
    trigger: Mapped[str] = mapped_column(String(8))  # "submit" | "auto" | "manual"
    status: Mapped[JobStatus] = mapped_column(_str_enum(JobStatus, "attempt_status"), default=JobStatus.QUEUED)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    train_started_at: Mapped[datetime | None]  # when its training processes' clock started
    offset_s: Mapped[float | None] = mapped_column(Float)
    resume_step: Mapped[int | None]  # the checkpoint step it continued from (0: from the start)
    error: Mapped[str | None] = mapped_column(Text)
    hosts: Mapped[dict[str, Any] | None]  # {rank: host}
    nodes: Mapped[int] = mapped_column(default=1)  # hosts it runs on at once
    rendezvous: Mapped[str | None] = mapped_column(String(300))  # host:port of torch's c10d rendezvous
    # the worker asked to run it: the one whose host holds the job's checkpoints (one-host jobs)
    prefer_node: Mapped[str | None] = mapped_column(String(255))
    # GPUs the attempt holds while it runs: {"worker": Celery hostname, "devices": [index, ...]}
    # (app/services/placement.py); None for a CPU attempt or once it ended
    gpus: Mapped[dict[str, Any] | None]
    waiting: Mapped[str | None] = mapped_column(Text)  # why a queued attempt has not started ("waiting: ...")


class AttemptNode(Base):
    """A worker host taking part in an attempt: the one that claimed it (``leader``) and, for a
    job on several hosts, each one reserved with it (``member``), with its own heartbeat."""

    __tablename__ = "attempt_nodes"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(primary_key=True)
    node: Mapped[str] = mapped_column(String(255), primary_key=True)  # the Celery worker's node name
    host: Mapped[str] = mapped_column(String(255))  # the host's name (PIPEBOARD_NODE_NAME)
    role: Mapped[str] = mapped_column(String(8))  # "leader" | "member"
    joined_at: Mapped[datetime | None]  # when its elastic agent started
    heartbeat_at: Mapped[datetime | None]
    pgid: Mapped[int | None]


class TimelineEvent(Base):
    """One executed or predicted schedule action (`pipeboard.trainer.schedule.actions.TimelineEvent`)."""

    __tablename__ = "timeline_events"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    source: Mapped[EventSource] = mapped_column(_str_enum(EventSource, "event_source"), primary_key=True)
    seq: Mapped[int] = mapped_column(primary_key=True)
    worker: Mapped[int]
    stage: Mapped[int]
    replica: Mapped[int] = mapped_column(default=0)
    microbatch: Mapped[int]
    kind: Mapped[str] = mapped_column(String(16))
    start: Mapped[float] = mapped_column(Float)  # seconds from the run's (or simulation's) zero
    end: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(default=0)
    attempt: Mapped[int] = mapped_column(default=1, server_default="1")  # the job attempt that measured it


class MetricPoint(Base):
    """One point of a job's metric series (`pipeboard.trainer.sink.MetricRecord`)."""

    __tablename__ = "metric_points"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(primary_key=True)
    step: Mapped[int]
    wall_s: Mapped[float] = mapped_column(Float)
    epoch: Mapped[float] = mapped_column(Float, default=0.0)
    values: Mapped[dict[str, Any]] = mapped_column(default=dict)
    attempt: Mapped[int] = mapped_column(default=1, server_default="1")


class JobEvent(Base):
    """A job's log of status/progress messages; `seq` is the Server-Sent Events id."""

    __tablename__ = "job_events"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # "status" | "progress" | "summary" | ...
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """A bearer token; only its hash is stored, `prefix` identifies it in listings. It stops working
    when revoked or once `expires_at` (if set) has passed."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    scope: Mapped[TokenScope] = mapped_column(_str_enum(TokenScope, "token_scope"))
    token_hash: Mapped[str] = mapped_column(String(128), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    expires_at: Mapped[datetime | None]
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)  # whose work it acts on


class WorkerHeartbeat(Base):
    """A live Celery worker, refreshed every HEARTBEAT_SECONDS by the worker itself.

    Kombu's SQLAlchemy transport has no broadcast, so Celery's control ping cannot reach
    workers on the embedded broker; /health counts fresh rows here instead (and uses the
    ping where the broker supports it).
    """

    __tablename__ = "worker_heartbeats"

    hostname: Mapped[str] = mapped_column(String(255), primary_key=True)
    pid: Mapped[int]
    host: Mapped[str | None] = mapped_column(String(255))  # PIPEBOARD_NODE_NAME: jobs on several hosts reserve distinct ones
    address: Mapped[str | None] = mapped_column(String(255))  # where other hosts reach it (PIPEBOARD_NODE_ADDRESS)
    pool: Mapped[str] = mapped_column(String(32))
    concurrency: Mapped[int]
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    # its GPUs as torch reports them (app/core/devices.py), refreshed with each beat; [] for none
    devices: Mapped[list[Any] | None]
