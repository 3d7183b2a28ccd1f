"""A worker's GPU inventory: probed from torch in a child process (CUDA must stay uninitialised
in the Celery worker, which forks), reported with each heartbeat. No GPU here: torch reports
zero and the inventory is an empty list."""

from __future__ import annotations

import pytest
import torch
from sqlalchemy import select

from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.core.devices import gpu_count, probe_devices, probe_devices_apart
from pipeboard.app.models import WorkerHeartbeat
from pipeboard.app.worker import WorkerHeartbeatThread
from tests.app.test_services_support import live_db  # noqa: F401  (fixture)

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a host without a GPU reports")


@no_gpu
def test_a_host_without_a_gpu_reports_an_empty_list_in_process_and_apart():
    assert probe_devices() == []
    assert probe_devices_apart() == []
    assert gpu_count(None) == gpu_count([]) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_host_reports_each_device_as_torch_sees_it():
    devices = probe_devices_apart()
    assert len(devices) == torch.cuda.device_count()
    for i, d in enumerate(devices):
        assert d["index"] == i and d["memory_bytes"] > 0 and d["name"] and d["cuda"] == torch.version.cuda


def test_a_probe_that_cannot_answer_is_one_line(monkeypatch):
    monkeypatch.setattr("sys.executable", "/bin/false")
    with pytest.raises(RuntimeError, match=r"^GPU probe: exit 1: \(no output\)$"):
        probe_devices_apart()


@no_gpu
def test_the_heartbeat_reports_none_until_probed_then_the_inventory(live_db):  # noqa: F811
    beat = WorkerHeartbeatThread("pipeboard@here", "threads", 1, 60)
    beat.beat()
    with get_sessionmaker()() as s:
        assert s.scalar(select(WorkerHeartbeat.devices).where(WorkerHeartbeat.hostname == "pipeboard@here")) is None
    beat.probe()
    beat.beat()
    with get_sessionmaker()() as s:
        assert s.scalar(select(WorkerHeartbeat.devices).where(WorkerHeartbeat.hostname == "pipeboard@here")) == []
