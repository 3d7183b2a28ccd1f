"""Service settings, read from `PIPEBOARD_*` environment variables (and an optional `.env`).

With no configuration pipeboard runs embedded: SQLite for its data, kombu's SQLAlchemy
transport on another SQLite file as the Celery broker, and Celery's database result backend,
all under `DATA_DIR`. Point `DATABASE_URL` at `postgresql+psycopg://...` and `BROKER_URL` /
`RESULT_BACKEND` at `redis://...` and the same code runs on PostgreSQL and Redis.
"""

from __future__ import annotations

import ipaddress
import os
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

try:  # the installed distribution's version, as pyproject.toml declares it
    VERSION = metadata.version("pipeboard")
except metadata.PackageNotFoundError:  # running from a tree that was never installed
    VERSION = "0+unknown"

# Broker schemes the worker and the health check know how to talk to. In-process ones
# (memory://) are left out on purpose: the worker is always another process.
BROKER_SCHEMES = ("sqlalchemy+sqlite", "sqla+sqlite", "redis", "rediss", "amqp", "pyamqp")
RESULT_SCHEMES = ("db+sqlite", "db+postgresql", "db+postgresql+psycopg", "redis", "rediss", "rpc")
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg")
# Addresses only this machine can reach: the one place authentication may be switched off.
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def _user_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pipeboard"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PIPEBOARD_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path("./data"), description="Folder for the embedded SQLite files, uploads and run output.")
    database_url: str = Field("", description="SQLAlchemy URL of the service database; default SQLite under DATA_DIR.")
    broker_url: str = Field("", description="Celery broker; default kombu's SQLAlchemy transport on SQLite under DATA_DIR.")
    result_backend: str = Field("", description="Celery result backend; default a SQLite file under DATA_DIR.")
    redis_url: str = Field("", description="Redis for live pub/sub of run events; default the broker when it is Redis.")
    key_prefix: str = Field("", description="Prefix of every Redis key and channel, so that deployments (or tests) can share one Redis.")

    auth: bool = Field(True, description=(
        "Authentication, on by default: every write needs a token from the first start. `off` lets anyone who "
        "reaches the server write (run code); it is refused unless the server binds to loopback only (BIND_HOST "
        "127.0.0.1, ::1 or localhost)."))
    read_auth: bool = Field(True, description=(
        "Reads need a token too, on by default: every route but /health, the event stream and trace download included. "
        "`false` lets anyone who reaches the server read everything, every user's work included."))
    bind_host: str = Field("127.0.0.1", description=(
        "The address the API listens on; `pipeboard up --host` sets it for the API process it starts. The Host "
        "allow-list includes it, and AUTH=off needs it to be loopback."))
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list, description=(
        "More Host header values the API answers, comma-separated (`*.example.com` matches subdomains), besides "
        "localhost, 127.0.0.1, ::1 and BIND_HOST (with a wildcard BIND_HOST, this machine's names and addresses); "
        "any other Host gets 400, against DNS rebinding. `*` allows all."))
    data_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list, description=(
        "Folders a job's or a model's `data` may name, colon- or comma-separated (e.g. /datasets:/scratch/data). "
        "Any other absolute path is refused with one answer, whether or not it exists; a relative `data` names a "
        "file or folder inside the model's code context. None by default: zoo models use their built-in data."))
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list, description=(
        "Origins whose pages may call the API from a browser, comma-separated (e.g. https://ci.example.com); "
        "none by default (no CORS headers at all)."))
    max_body_bytes: int = Field(1024 * 1024, gt=0, description="Largest request body on JSON routes (413 past it); uploads have MAX_UPLOAD_BYTES.")
    auth_failure_limit: str = Field("10/minute", description=(
        "Failed authentications allowed per client address, as a `limits` rate (e.g. 10/minute, 100/hour); past "
        "it requests with a token get 429 with Retry-After until the window has room again."))
    max_upload_bytes: int = Field(50 * 1024 * 1024, gt=0, description="Largest accepted upload (profiles, graph.txt).")
    max_context_bytes: int = Field(500 * 1024 * 1024, gt=0, description="Largest code context once unpacked (the sum of its files).")
    validation_time_limit_s: float = Field(300.0, gt=0, description="Seconds a worker gives a model's validation (build, check, split).")
    validation_memory_bytes: int = Field(8 * 1024**3, gt=0, description="Address space a model's validation may use (RLIMIT_AS).")
    sandbox: Literal["auto", "on", "off"] = Field("auto", description=(
        "Users' code (validation, profiling, training) in Debian's bubblewrap: its own folders, the installed environment "
        "and its data, not other users' contexts, the data folder, the database or the worker's settings "
        "(docs/sandbox.md). auto: where bwrap works here; on: refuse to run users' code without it; off: never."))
    heartbeat_seconds: float = Field(5.0, gt=0, description="How often running jobs and workers report they are alive.")
    stale_after_heartbeats: int = Field(3, ge=1, description="Missed heartbeats after which a job or worker is presumed dead.")
    worker_concurrency: int = Field(2, ge=1, description="Tasks one `pipeboard worker` runs at once (thread pool).")
    health_timeout_seconds: float = Field(1.0, gt=0, description="How long /health waits for the database, broker and workers.")
    log_level: str = Field("info", description="Log level of the API and the worker.")
    join_timeout_s: float = Field(120.0, gt=0, description=(
        "How long a job on several hosts waits for enough free worker hosts, and then for their agents to join "
        "torch's rendezvous, before its attempt fails saying which joined."))
    checkpoint_keep: int = Field(2, ge=1, description=(
        "Complete checkpoints kept per job (the newest); an older one goes once a newer one is 10 s old."))
    calibration_dir: Path = Field(default_factory=lambda: _user_cache() / "calibration", description=(
        "Where a calibrated profile keeps this machine's figures (the link between worker processes, the "
        "runtime's per-action overhead), shared by every profile measured here; default ~/.cache/pipeboard."))
    calibration_max_age_s: float = Field(86400.0, ge=0, description=(
        "Seconds this machine's kept calibration figures are used before they are measured again (0: every "
        "calibrated profile measures them)."))
    node_name: str = Field("", description=(
        "This host's name as jobs and timelines show it, and the unit a multi-host job reserves (one worker "
        "host per node); default the machine's host name. Give each worker host its own."))
    node_address: str = Field("", description=(
        "The address other worker hosts reach this one at (torch's rendezvous and the training processes); "
        "default the address NODE_NAME resolves to."))
    # A long job keeps every step's summary, and its full action timeline only in windows (docs/storage.md).
    # The run reads these from its environment (trainer.runtime.detail.DetailPolicy.from_env).
    detail_first_steps: int = Field(50, ge=0, description="Steps at the start of every attempt whose full action timeline is kept.")
    detail_every: int = Field(1000, ge=0, description="A detail window starts every this many steps (0: none).")
    detail_width: int = Field(5, ge=0, description="Steps in each periodic detail window.")
    detail_max_windows: int = Field(500, ge=0, description="Periodic detail windows at most per job: bounds a job's detail rows.")
    detail_before_failure: int = Field(10, ge=0, description="Steps before a failure whose actions are kept (held in memory until then).")
    detail_max_queued: int = Field(200_000, ge=0, description=(
        "Actions waiting for the database at most; past it a window's actions are dropped (and counted), never a step's summary."))
    detail_retention_days: float = Field(30.0, ge=0, description=(
        "Finished jobs older than this lose their action timeline (summaries stay) when `pipeboard storage prune` "
        "or the worker's daily prune runs; 0 keeps detail forever."))

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, value: Path) -> Path:
        # Workers and the API resolve the same folder however they were started.
        return value.expanduser().resolve()

    @field_validator("allowed_hosts", "cors_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("data_roots", mode="before")
    @classmethod
    def _path_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.replace(",", ":").split(":") if part.strip()]
        return value

    @field_validator("data_roots")
    @classmethod
    def _absolute_roots(cls, value: list[Path]) -> list[Path]:
        for root in value:
            if not root.expanduser().is_absolute():
                raise ValueError(f"{str(root)!r}: each data root must be an absolute path")
        return [root.expanduser().resolve() for root in value]

    @field_validator("allowed_hosts")
    @classmethod
    def _host_patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if pattern != "*" and ("*" in pattern[1:] or (pattern.startswith("*") and not pattern.startswith("*."))):
                raise ValueError(f"{pattern!r}: a wildcard must be the whole entry (*) or lead it (*.example.com)")
        return [host_header_form(p) for p in value]

    @field_validator("auth_failure_limit")
    @classmethod
    def _rate(cls, value: str) -> str:
        from limits import parse_many

        try:
            parse_many(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a rate such as 10/minute or 100/hour") from None
        return value

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
        if not self.node_name:
            import socket

            self.node_name = socket.gethostname()
        return self

    @property
    def stale_after_seconds(self) -> float:
        return self.heartbeat_seconds * self.stale_after_heartbeats

    def trusted_hosts(self) -> list[str]:
        """The Host header values the API answers (Starlette's TrustedHostMiddleware patterns)."""
        hosts = ["localhost", "127.0.0.1", "[::1]"]
        if is_wildcard(self.bind_host):
            hosts += machine_names()
        else:
            hosts.append(host_header_form(self.bind_host))
        hosts += self.allowed_hosts
        return list(dict.fromkeys(h.lower() for h in hosts))

    def auth_off_refusal(self) -> str | None:
        """Why this configuration may not run (AUTH=off on a non-loopback address), or None."""
        if self.auth or is_loopback(self.bind_host):
            return None
        return (f"PIPEBOARD_AUTH: off is allowed only when the server binds to loopback "
                f"({', '.join(LOOPBACK_HOSTS)}), not {self.bind_host}: anyone who reaches it could run code")

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


def settings_from_env(env: dict[str, str]) -> Settings:
    """The Settings of a deployment described by ``env``'s PIPEBOARD_* variables alone (this
    process's own environment aside): what another process started with ``env`` reads."""
    return Settings(**{k.removeprefix("PIPEBOARD_").lower(): v for k, v in env.items() if k.startswith("PIPEBOARD_")})


def is_loopback(host: str) -> bool:
    return host.strip("[]").lower() in LOOPBACK_HOSTS


def is_wildcard(host: str) -> bool:
    return host.strip("[]") in ("", "0.0.0.0", "::")


def host_header_form(host: str) -> str:
    """How a host appears in a Host header: IPv6 addresses in brackets."""
    bare = host.strip("[]")
    try:
        return f"[{bare}]" if ipaddress.ip_address(bare).version == 6 else bare
    except ValueError:
        return host


def machine_names() -> list[str]:
    """This machine's host names and addresses: what clients of a wildcard bind may send as Host."""
    import socket

    names = {socket.gethostname(), socket.getfqdn()}
    for name in list(names):
        try:
            names |= {info[4][0] for info in socket.getaddrinfo(name, None)}
        except OSError:
            pass
    return sorted(host_header_form(n) for n in names if n)


def scheme_of(url: str) -> str:
    """`postgresql+psycopg://u@h/db` -> `postgresql+psycopg`; '' when there is none."""
    return urlsplit(url).scheme if "://" in url else ""


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once. Tests change the environment then call `cache_clear()`."""
    return Settings()
