"""One candidate of the search: what a run would be, what it is predicted (and measured) to cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


class TuneError(ValueError):
    """Bad input to the tuner, or a cap nothing fits; the message starts with the field it concerns."""

    def __init__(self, message: str, field: str = "memory_bytes") -> None:
        super().__init__(message)
        self.field = field


@dataclass
class Candidate:
    """A run layout: ``plan`` (the planner's method and, per stage, its layers and replicas; for
    a schedule that takes chunks, one entry per virtual stage), ``schedule``, ``chunks``,
    ``microbatches`` of ``microbatch_size`` samples, ``recompute`` per (virtual) stage."""

    plan: dict[str, Any]
    schedule: str
    microbatches: int
    microbatch_size: int
    chunks: int
    recompute: list[bool]
    predicted_step_s: float
    predicted_memory_bytes: int  # the fullest worker's predicted peak
    stage_memory_bytes: list[int] = field(default_factory=list)  # per (virtual) stage, its fullest worker
    fits: bool = True
    why: str | None = None  # why it does not fit, when it does not
    measured_step_s: float | None = None
    measured_spread_s: float | None = None  # max - min of the measured steps' repeats
    # the most any stage's process held in the measured runs (the runtime's source: CUDA peak
    # allocated on a GPU, the process's peak RSS on a CPU, which counts torch itself too)
    measured_memory_bytes: int | None = None

    @property
    def batch_size(self) -> int:
        return self.microbatches * self.microbatch_size

    @property
    def predicted_time_per_sample_s(self) -> float:
        return self.predicted_step_s / self.batch_size

    @property
    def key(self) -> tuple:
        """What makes two candidates the same run."""
        stages = tuple((tuple(st["layers"]), int(st["replicas"])) for st in self.plan["stages"])
        return (stages, self.schedule, self.chunks, self.microbatches, tuple(self.recompute))

    def label(self) -> str:
        stages = self.plan["stages"]
        split = "+".join(str(len(st["layers"])) + (f"x{st['replicas']}" if st["replicas"] > 1 else "") for st in stages)
        redo = "none" if not any(self.recompute) else "all" if all(self.recompute) else \
            ",".join(str(i) for i, on in enumerate(self.recompute) if on)
        chunks = f" chunks {self.chunks}" if self.chunks > 1 else ""
        return (f"{self.schedule}{chunks} {self.plan['method']} [{split}] mb {self.microbatches} "
                f"recompute {redo}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["predicted_time_per_sample_s"] = self.predicted_time_per_sample_s
        return d

    @classmethod
    def from_dict(cls, raw: Any) -> Candidate:
        """A candidate as ``to_dict`` wrote it (its derived ``predicted_time_per_sample_s`` is
        recomputed); a key it does not have is refused."""
        if not isinstance(raw, dict):
            raise TuneError("choice: must be an object (a candidate of `pipeboard tune --json`)", field="choice")
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__) - {"predicted_time_per_sample_s"})
        if unknown:
            raise TuneError(f"choice: unknown field(s) {unknown}", field="choice")
        try:
            return cls(**{k: v for k, v in raw.items() if k != "predicted_time_per_sample_s"})
        except TypeError as exc:
            raise TuneError(f"choice: not a tuner candidate: {exc}", field="choice") from None
