"""Settings: embedded defaults under DATA_DIR, environment overrides, and errors naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeboard.app.core.config import Settings, get_settings, scheme_of


def test_defaults_are_embedded_sqlite_files_under_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "d")
    assert settings.database_url == f"sqlite:///{tmp_path}/d/pipeboard.sqlite"
    assert settings.broker_url == f"sqlalchemy+sqlite:///{tmp_path}/d/broker.sqlite"
    assert settings.result_backend == f"db+sqlite:///{tmp_path}/d/results.sqlite"
    assert settings.redis_url == ""
    assert settings.read_auth is True  # reads need a token by default
    assert settings.problems() == []


def test_relative_data_dir_becomes_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Settings(data_dir=Path("rel")).data_dir == tmp_path / "rel"


def test_environment_overrides_with_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEBOARD_DATABASE_URL", "postgresql+psycopg://u:p@db/pipeboard")
    monkeypatch.setenv("PIPEBOARD_BROKER_URL", "redis://cache:6379/0")
    monkeypatch.setenv("PIPEBOARD_READ_AUTH", "false")
    monkeypatch.setenv("PIPEBOARD_MAX_UPLOAD_BYTES", "1024")
    settings = Settings()
    assert settings.database_url == "postgresql+psycopg://u:p@db/pipeboard"
    assert settings.read_auth is False
    assert settings.max_upload_bytes == 1024
    # A Redis broker also serves as result backend and pub/sub unless told otherwise.
    assert settings.result_backend == "redis://cache:6379/0"
    assert settings.redis_url == "redis://cache:6379/0"
    assert settings.problems() == []


def test_get_settings_is_cached_until_cleared(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    get_settings.cache_clear()
    first = get_settings()
    assert get_settings() is first
    monkeypatch.setenv("PIPEBOARD_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    try:
        assert get_settings().data_dir == tmp_path
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("broker_url", "kafka://broker:9092", "PIPEBOARD_BROKER_URL"),
        ("broker_url", "memory://", "PIPEBOARD_BROKER_URL"),  # in-process: no worker could see it
        ("database_url", "mysql://db/x", "PIPEBOARD_DATABASE_URL"),
        ("result_backend", "mongodb://r", "PIPEBOARD_RESULT_BACKEND"),
    ],
)
def test_problems_name_the_setting(field: str, value: str, named: str, tmp_path: Path) -> None:
    problems = Settings(data_dir=tmp_path, **{field: value}).problems()
    assert len(problems) == 1
    assert problems[0].startswith(named + ":")
    assert scheme_of(value) in problems[0]


def test_invalid_numbers_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEBOARD_HEARTBEAT_SECONDS", "0")
    with pytest.raises(ValidationError, match="heartbeat_seconds"):
        Settings()


def test_stale_after_is_heartbeats_times_interval(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path, heartbeat_seconds=2, stale_after_heartbeats=4).stale_after_seconds == 8
