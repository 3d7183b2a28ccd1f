"""Registered models: `POST /models` and what `GET /models` answers."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeboard.app.schemas.common import NAME_PATTERN


FACTORY_PATTERN = r"^(?:[A-Za-z_][A-Za-z0-9_.]*|[A-Za-z0-9_.][A-Za-z0-9_./-]*\.py):[A-Za-z_][A-Za-z0-9_]*$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class ModelCreate(BaseModel):
    """Register a task factory: an import path installed on the workers, or a path inside an
    uploaded code context (POST /contexts). A worker validates it before it can run."""

    # An example the API accepts as it stands: a task factory installed with pipeboard itself (one in
    # a code context names the context's sha256, which only an upload makes: docs/api.md).
    model_config = ConfigDict(json_schema_extra={"examples": [{"name": "my-mlp", "source": "pipeboard.trainer.zoo.digits:mlp_digits",
                                                                "config": {"hidden": 64}}]})

    name: str = Field(pattern=NAME_PATTERN, description="Unique name to refer to the model by (jobs' `model`).")
    source: str = Field(
        min_length=3,
        max_length=300,
        pattern=FACTORY_PATTERN,
        description="The task factory: `package.module:function` (importable on the workers, or from the "
                    "context's top folder) or `path/inside/context.py:function` (needs `context`). It returns "
                    "a pipeboard.trainer.Task.",
    )
    context: str | None = Field(default=None, pattern=SHA256_PATTERN,
                                description="SHA-256 of an uploaded code context (POST /contexts) the factory lives in.")
    config: dict[str, Any] = Field(default_factory=dict, description="Model arguments passed to the factory.")
    data: str | None = Field(default=None, max_length=500,
                             description="Data location passed to the factory as `data=` when validating (a path "
                                         "relative to the context's top folder, or absolute on the workers).")


class ModelPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int | None = Field(description="Database id; null for zoo models that were never registered.")
    name: str
    source: str
    kind: str = Field(description="`zoo`, `import` (an installed import path) or `context` (an uploaded project).")
    description: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    context: str | None = Field(default=None, description="SHA-256 of the model's code context.")
    data: str | None = None
    status: Literal["validating", "ready", "failed"] = Field(
        default="ready", description="`validating` while a worker builds, checks and splits it; `ready`; `failed` "
                                     "(`message` says why). Zoo models are always ready.")
    message: str = Field(default="", description="What validation found, or why it failed.")
    layers: int | None = None
    created_at: datetime | None = None
