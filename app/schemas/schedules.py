"""The schedule registry as `GET /schedules` answers it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from pipeboard.app.schemas.common import ScheduleName, WeightGrads


class SchedulePublic(BaseModel):
    """A registered schedule and what it can do (trainer/schedule/registry.py's ScheduleSpec)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "name": "pipedream", "description": "Asynchronous 1F1B without a flush: weight stashing, one update per batch (PipeDream).",
        "default": False, "synchronous": False, "replication": True, "chunks": False, "default_chunks": 1,
        "weight_grads": ["batched", "immediate"], "vertical_sync": True, "needs_split_backward": False,
        "data_parallel": False}]})

    name: ScheduleName
    description: str = Field(description="One line, for help texts and the dashboard's form.")
    default: bool = Field(description="The schedule a job or plan gets when it names none.")
    synchronous: bool = Field(description="One weight update per iteration of its microbatches (a flush); false: "
                                          "asynchronous, an update per batch with weight stashing (pipedream).")
    replication: bool = Field(description="Stages may have several replicas.")
    chunks: bool = Field(description="Takes `chunks` > 1 model chunks per worker (a job's `layout.chunks`, a plan's `chunks`).")
    default_chunks: int = Field(description="The chunks a job runs with when it asks for 1.")
    weight_grads: list[WeightGrads] = Field(description="The `weight_grads` modes it honours; empty: it ignores the setting.")
    vertical_sync: bool = Field(description="Takes a job's `layout.vertical_sync`.")
    needs_split_backward: bool = Field(description="Its backwards are always split into input and weight gradients.")
    data_parallel: bool = Field(description="The whole model on every worker: one stage, `workers` replicas of it.")
