"""Profiles: `POST /profiles` (a profiling job) and the stored profiles."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ProfileCreate(BaseModel):
    """Profile a model on the worker (a Celery task); poll `GET /profiles/{id}` for the result."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"model": "mlp-digits", "batch_size": 32}]})

    model: str = Field(min_length=1, max_length=300, description="A zoo name or a registered model's name.")
    model_args: dict[str, str | int | float | bool] = Field(default_factory=dict, description="Arguments of the model.")
    batch_size: int = Field(default=32, ge=1, le=65536)
    device: Literal["cpu", "cuda"] = "cpu"
    repeats: int = Field(default=5, ge=1, le=100, description="Timed repetitions per layer.")


class LayerRow(BaseModel):
    name: str
    desc: str = ""
    forward_ms: float
    backward_ms: float
    activation_bytes: float
    parameter_bytes: float


class ProfilePublic(BaseModel):
    id: int
    name: str
    model_id: int | None = None
    batch_size: int | None = None
    status: str = Field(description="`ready` once data is present, `pending` while being profiled, `failed`.")
    error: str | None = None
    created_at: datetime | None = None
    total_forward_ms: float = 0.0
    total_backward_ms: float = 0.0
    layers: list[LayerRow] = Field(default_factory=list)
    lengths: dict[str, Any] | None = Field(
        default=None,
        description="For a task whose batches vary in length: the lengths it was measured at and the data's "
                    "length histogram, as `dim`, `measured`, `batch_size` and `histogram` (`edges`, `counts`); "
                    "its layers' times are the expected costs over that histogram. Null for one shape.")
    data: dict[str, Any] | None = Field(default=None, description="The profile JSON (pipeboard.profile v1).")
