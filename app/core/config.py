"""Service settings, read from `PIPEBOARD_*` environment variables (and an optional `.env`).

With no configuration pipeboard runs embedded: SQLite for its data, kombu's SQLAlchemy
transport on another SQLite file as the Celery broker, and Celery's database result backend,
all under `DATA_DIR`. Point `DATABASE_URL` at `postgresql+psycopg://...` and `BROKER_URL` /
`RESULT_BACKEND` at `redis://...` and the same code runs on PostgreSQL and Redis.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

try:  # the installed distribution's version, as pyproject.toml declares it
    VERSION = metadata.version("pipeboard")
except metadata.PackageNotFoundError:  # running from a tree that was never installed
    VERSION = "0+unknown"

# Broker schemes the worker and the health check know how to talk to. In-process ones
# (memory://) are left out on purpose: the worker is always another process.
BROKER_SCHEMES = ("sqlalchemy+sqlite", "sqla+sqlite", "redis", "rediss", "amqp", "pyamqp")
RESULT_SCHEMES = ("db+sqlite", "db+postgresql", "db+postgresql+psycopg", "redis", "rediss", "rpc")
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PIPEBOARD_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path("./data"), description="Folder for the embedded SQLite files, uploads and run output.")
    database_url: str = Field("", description="SQLAlchemy URL of the service database; default SQLite under DATA_DIR.")
    broker_url: str = Field("", description="Celery broker; default kombu's SQLAlchemy transport on SQLite under DATA_DIR.")
    result_backend: str = Field("", description="Celery result backend; default a SQLite file under DATA_DIR.")
    redis_url: str = Field("", description="Redis for live pub/sub of run events; default the broker when it is Redis.")
    key_prefix: str = Field("", description="Prefix of every Redis key and channel, so that deployments (or tests) can share one Redis.")

    read_auth: bool = Field(False, description="When true, reads need a token too (writes need a write token once any token exists).")
    max_upload_bytes: int = Field(50 * 1024 * 1024, gt=0, description="Largest accepted upload (profiles, graph.txt).")
    heartbeat_seconds: float = Field(5.0, gt=0, description="How often running jobs and workers report they are alive.")
    stale_after_heartbeats: int = Field(3, ge=1, description="Missed heartbeats after which a job or worker is presumed dead.")
    worker_concurrency: int = Field(2, ge=1, description="Tasks one `pipeboard worker` runs at once (thread pool).")
    health_timeout_seconds: float = Field(1.0, gt=0, description="How long /health waits for the database, broker and workers.")
    log_level: str = Field("info", description="Log level of the API and the worker.")

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, value: Path) -> Path:
        # Workers and the API resolve the same folder however they were started.
        return value.expanduser().resolve()

    @model_validator(mode="after")
    def _fill_defaults(self) -> Settings:
        data = self.data_dir.as_posix()
        if not self.database_url:
            self.database_url = f"sqlite:///{data}/pipeboard.sqlite"
        if not self.broker_url:
            self.broker_url = f"sqlalchemy+sqlite:///{data}/broker.sqlite"
        if not self.result_backend:
            if scheme_of(self.broker_url) in ("redis", "rediss"):
                self.result_backend = self.broker_url
            else:
                self.result_backend = f"db+sqlite:///{data}/results.sqlite"
        if not self.redis_url and scheme_of(self.broker_url) in ("redis", "rediss"):
            self.redis_url = self.broker_url
        return self

    @property
    def stale_after_seconds(self) -> float:
        return self.heartbeat_seconds * self.stale_after_heartbeats

    def problems(self) -> list[str]:
        """Configuration errors, one line each naming the setting (empty when all is well)."""
        found = []
        if scheme_of(self.database_url) not in DATABASE_SCHEMES:
            found.append(
                f"PIPEBOARD_DATABASE_URL: unsupported scheme {scheme_of(self.database_url)!r} "
                f"(use one of {', '.join(DATABASE_SCHEMES)})"
            )
        if scheme_of(self.broker_url) not in BROKER_SCHEMES:
            found.append(
                f"PIPEBOARD_BROKER_URL: unknown broker scheme {scheme_of(self.broker_url)!r} "
                f"(use one of {', '.join(BROKER_SCHEMES)})"
            )
        if scheme_of(self.result_backend) not in RESULT_SCHEMES:
            found.append(
                f"PIPEBOARD_RESULT_BACKEND: unknown result backend scheme {scheme_of(self.result_backend)!r} "
                f"(use one of {', '.join(RESULT_SCHEMES)})"
            )
        return found


def scheme_of(url: str) -> str:
    """`postgresql+psycopg://u@h/db` -> `postgresql+psycopg`; '' when there is none."""
    return urlsplit(url).scheme if "://" in url else ""


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once. Tests change the environment then call `cache_clear()`."""
    return Settings()
