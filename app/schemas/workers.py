"""Live workers and their GPUs as `GET /workers` answers them (app/services/placement.py)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class DevicePublic(BaseModel):
    """One GPU as the worker's torch reports it (app/core/devices.py), and the job holding it."""

    index: int = Field(description="torch's index of the GPU in the worker's process (cuda:INDEX).")
    name: str = Field(description="The GPU's name, e.g. `NVIDIA H100 80GB HBM3`.")
    memory_bytes: int = Field(description="Its total memory.")
    capability: str = Field(description="CUDA compute capability, `major.minor`.")
    cuda: str | None = Field(description="The CUDA version torch was built with.")
    driver: str | None = Field(description="The driver's CUDA version (None where torch does not say).")
    job_id: int | None = Field(description="The job whose attempt holds this GPU; null when it is free.")


class WorkerPublic(BaseModel):
    """A live Celery worker (its heartbeat is fresh) with its GPUs."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "worker": "pipeboard@gpu-1", "host": "gpu-1", "pool": "prefork", "concurrency": 2,
        "started_at": "2026-12-05T23:00:00Z", "seen_at": "2026-12-05T23:10:00Z", "devices_reported": True,
        "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85520809984, "capability": "9.0",
                     "cuda": "12.8", "driver": "12.8", "job_id": 7}]}]})

    worker: str = Field(description="Its Celery node name; a cuda job placed on it is queued on its own queue.")
    host: str = Field(description="The host it runs on (PIPEBOARD_NODE_NAME).")
    pool: str = Field(description="Its Celery pool.")
    concurrency: int = Field(description="Tasks it runs at once.")
    started_at: datetime
    seen_at: datetime = Field(description="Its last heartbeat.")
    devices_reported: bool = Field(description="False until its first GPU probe has answered (seconds after start).")
    devices: list[DevicePublic] = Field(description="Its GPUs, index order; empty on a host without one.")
