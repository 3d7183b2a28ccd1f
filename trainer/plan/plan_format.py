"""The Plan: plain data with a JSON form (documented in docs/plan-format.md).

Times are seconds per minibatch (the profile's minibatch), sizes are bytes. ``levels`` mirrors
what the reference optimizer prints (level 1 innermost, stages as antichain-state ranges);
``stages`` is the flat pipeline that the simulator and the runtime execute.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pipeboard.trainer.plan.plan_error import PlanError

PLAN_FORMAT = "pipeboard.plan"
PLAN_VERSION = 1


@dataclass
class LevelStage:
    """A stage of one level: states start..end-1 (half-open), replicated ``replicas`` times."""

    start: int
    end: int
    replicas: int
    compute_s: float  # forward + backward of its layers on one worker, as the reference prints
    layers: list[str] = field(default_factory=list)  # its layers, in topological order


@dataclass
class Level:
    level: int  # 1 = innermost
    workers: int  # machines at this level (workers per server at level 1, servers at level 2, ...)
    bandwidth: float  # bytes/s between the machines of this level
    stages: list[LevelStage]


@dataclass
class Stage:
    """One stage of the flat pipeline, ready to execute or simulate."""

    index: int
    layers: list[str]  # layer names in topological order
    replicas: int
    workers: list[int]  # global worker ranks, one per replica
    start_state: int
    end_state: int  # half-open state range
    compute_s: float  # forward + backward on one worker, per minibatch
    forward_s: float
    backward_s: float
    allreduce_s: float  # data-parallel weight synchronisation per minibatch (0 if one replica)
    send_s: float  # sending this stage's output activations (and their gradients back) per minibatch
    activation_bytes_out: float  # bytes crossing the cut after this stage
    activation_bytes: float  # activations produced inside the stage (stashed per minibatch in flight)
    parameter_bytes: float
    in_flight: int  # minibatches in flight at this stage (PipeDream: ceil(workers from here on / replicas))
    memory_bytes: float  # parameter_bytes + in_flight * activation_bytes
    time_s: float  # this stage's time per minibatch under the planner's cost model


def timing_fields(best: float, single: float, dp_time: float) -> dict[str, float]:
    """The Plan's times and the speedups derived from them (infinite when a time is zero)."""
    return {
        "predicted_time_s": best,
        "single_worker_time_s": single,
        "data_parallel_time_s": dp_time,
        "speedup_vs_single": single / best if best > 0 else math.inf,
        "speedup_vs_data_parallel": dp_time / best if best > 0 else math.inf,
        "data_parallel_speedup_vs_single": single / dp_time if dp_time > 0 else math.inf,
    }


@dataclass
class Plan:
    method: str  # pipedream | uniform | time | params | dp
    model: str
    state_graph: str  # "antichain" (exact states) or "linearised" (topological order as a chain)
    states: int
    cluster: list[tuple[int, float]]  # (workers, bandwidth bytes/s) per level, innermost first
    total_workers: int
    workers_used: int
    predicted_time_s: float  # time per minibatch of the slowest stage (the reference's objective)
    single_worker_time_s: float
    data_parallel_time_s: float
    speedup_vs_single: float
    speedup_vs_data_parallel: float
    data_parallel_speedup_vs_single: float
    noam: int  # ceil(total workers / input-stage replicas): minibatches in flight at the input
    levels: list[Level]
    stages: list[Stage]
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return self.state_graph == "antichain"

    @property
    def throughput_per_s(self) -> float:
        """Minibatches per second under the cost model."""
        return 1.0 / self.predicted_time_s if self.predicted_time_s > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cluster"] = [list(level) for level in self.cluster]
        data["exact"] = self.exact
        return {"format": PLAN_FORMAT, "version": PLAN_VERSION, **data}

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise PlanError(f"plan JSON: field 'format' must be {PLAN_FORMAT!r}")
        if data.get("version") != PLAN_VERSION:
            raise PlanError(f"plan JSON: unsupported 'version' {data.get('version')!r} (expected {PLAN_VERSION})")
        try:
            known = {f.name for f in fields(cls)}
            values = {k: v for k, v in data.items() if k in known}
            values["cluster"] = [(int(w), float(b)) for w, b in values["cluster"]]
            values["levels"] = [
                Level(**{**lv, "stages": [LevelStage(**s) for s in lv["stages"]]}) for lv in values["levels"]
            ]
            values["stages"] = [Stage(**s) for s in values["stages"]]
            return cls(**values)
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"plan JSON: malformed plan ({exc})") from None

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"plan JSON: line {exc.lineno}: {exc.msg}") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.from_json(Path(path).read_text())
