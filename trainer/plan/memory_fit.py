"""A plan under a memory cap, by the one memory formula (``trainer.schedule.memory_model``).

PipeDream's own check (``memory_constraint``) counts parameters and stashed activations under
its stash formula only; the cap a user gives is per worker and must hold for what a run keeps:
gradients, optimizer state, each schedule's activations in flight, boundary buffers. So the
planner's candidates are checked here, under the schedule they will run, and a stage that does
not fit gets activation recompute (it then keeps only its input per microbatch in flight and
rebuilds the rest in its backward). The first candidate, in the caller's ranking, that fits is
chosen; when none does, one line names the smallest memory any of them needs (recompute on
wherever it helps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeboard.trainer.plan.plan_error import PlanError


@dataclass(frozen=True)
class MemoryFit:
    """Per plan stage: predicted peak bytes (the most of its workers) and whether it recomputes."""

    memory_bytes: list[int]
    recompute: list[bool]
    parts: list[dict[str, int]]  # per stage, memory_model's parts of its fullest worker

    @property
    def peak(self) -> int:
        return max(self.memory_bytes, default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"memory_bytes": self.memory_bytes, "recompute": self.recompute, "parts": self.parts}


def _plan_dict(plan: Any) -> dict[str, Any]:
    return plan.to_dict() if hasattr(plan, "to_dict") else plan


def stage_memory(plan: Any) -> list:
    """memory_model inputs of each plan stage: one version of its parameters, the activations it
    keeps per microbatch, and its boundary tensors (the previous cut's and its own)."""
    from pipeboard.trainer.schedule.memory_model import StageMemory

    stages = _plan_dict(plan)["stages"]
    out = []
    for i, st in enumerate(stages):
        before = float(stages[i - 1].get("activation_bytes_out") or 0.0) if i else 0.0
        after = float(st.get("activation_bytes_out") or 0.0) if i < len(stages) - 1 else 0.0
        out.append(StageMemory(weight_bytes=int(st.get("parameter_bytes") or 0),
                               activation_bytes=int(st.get("activation_bytes") or 0),
                               input_bytes=int(before), output_bytes=int(after),
                               weight_grad_bytes=int(st.get("weight_grad_bytes") or 0),
                               weight_input_bytes=int(st.get("weight_input_bytes") or 0)))
    return out


def plan_memory(plan: Any, schedule: str, microbatches: int, *, optimizer: str = "adam",
                recompute: list[bool] | None = None) -> MemoryFit:
    """Predicted memory per plan stage when ``plan`` runs ``schedule`` with ``microbatches``."""
    from pipeboard.trainer.schedule.actions import ScheduleError
    from pipeboard.trainer.schedule.memory_model import run_schedule, worker_memory

    data = _plan_dict(plan)
    stages = stage_memory(data)
    n = len(stages)
    recompute = list(recompute) if recompute is not None else [False] * n
    if len(recompute) != n:
        raise PlanError(f"recompute: {len(recompute)} entries for a plan of {n} stages")
    replicas = [int(st.get("replicas") or 1) for st in data["stages"]]
    try:
        sched = run_schedule(schedule, n, microbatches, replicas=replicas if any(r > 1 for r in replicas) else None)
        workers = worker_memory(sched, stages, optimizer=optimizer,
                                recompute=[s for s in range(n) if recompute[s]])
    except ScheduleError as e:
        raise PlanError(str(e)) from None
    best: dict[int, Any] = {}
    for spec, w in zip(sched.workers, workers):
        for s in spec.stages:
            if s not in best or w.total > best[s].total:
                best[s] = w
    return MemoryFit(memory_bytes=[best[s].total for s in range(n)], recompute=recompute,
                     parts=[best[s].as_dict() for s in range(n)])


def with_recompute(plan: Any, schedule: str, microbatches: int, cap: float, *, optimizer: str = "adam") -> MemoryFit:
    """The plan's memory with recompute turned on for the stages over ``cap`` where it lowers
    their memory (a stage's recompute changes only its own workers' memory, so one pass
    decides it)."""
    plain = plan_memory(plan, schedule, microbatches, optimizer=optimizer)
    if plain.peak <= cap:
        return plain
    on = plan_memory(plan, schedule, microbatches, optimizer=optimizer, recompute=[True] * len(plain.recompute))
    choice = [off > cap and rec < off for off, rec in zip(plain.memory_bytes, on.memory_bytes)]
    return plan_memory(plan, schedule, microbatches, optimizer=optimizer, recompute=choice)


def least_memory(plan: Any, schedule: str, microbatches: int, *, optimizer: str = "adam") -> int:
    """The smallest peak this plan can have: each stage recomputing or not, whichever is less."""
    plain = plan_memory(plan, schedule, microbatches, optimizer=optimizer)
    on = plan_memory(plan, schedule, microbatches, optimizer=optimizer, recompute=[True] * len(plain.recompute))
    return max((min(a, b) for a, b in zip(plain.memory_bytes, on.memory_bytes)), default=0)


def choose_under_cap(candidates: list[Any], schedule: str, microbatches: int, cap: float, *,
                     optimizer: str = "adam") -> tuple[Any, MemoryFit]:
    """The first of ``candidates`` (best first) that fits ``cap`` bytes per worker, recompute
    turned on where needed; PlanError naming the smallest need when none fits."""
    if not candidates:
        raise PlanError("memory_bytes: no plan to check against the cap")
    smallest: tuple[int, int] | None = None
    for i, plan in enumerate(candidates):
        fit = with_recompute(plan, schedule, microbatches, cap, optimizer=optimizer)
        if fit.peak <= cap:
            return plan, fit
        least = least_memory(plan, schedule, microbatches, optimizer=optimizer)
        if smallest is None or least < smallest[0]:
            smallest = (least, i)
    need, which = smallest
    method = _plan_dict(candidates[which]).get("method", "plan")
    raise PlanError(f"memory_bytes: no plan fits in {int(cap)} bytes per worker under {schedule}; "
                    f"the smallest any plan needs is {need} bytes ({method}, recompute where it helps)")


def plan_under_cap(profile, levels, cap: float, schedule: str, microbatches: int, *, optimizer: str = "adam",
                   **options) -> tuple[Any, MemoryFit]:
    """The planner under a memory cap per worker: PipeDream's plan first, then PipeDream's own
    stash-constrained plan, then the baselines (uniform, time, params), each checked by
    memory_model under ``schedule``, recompute on where a stage would not fit. The plan's options
    record the per-stage ``recompute`` and predicted ``stage_memory_bytes``."""
    from pipeboard.trainer.plan import plan as make_plan

    candidates = [make_plan(profile, levels, **options)]
    try:
        candidates.append(make_plan(profile, levels, memory_bytes=cap, memory_constraint=True, **options))
    except PlanError:
        pass  # PipeDream's own check finds nothing: the baselines may still fit
    base = {k: v for k, v in options.items() if k == "activation_compression"}
    candidates += [make_plan(profile, levels, method=m, **base) for m in ("uniform", "time", "params")]
    chosen, fit = choose_under_cap(candidates, schedule, microbatches, cap, optimizer=optimizer)
    chosen.options = {**chosen.options, "memory_cap_bytes": cap, "memory_schedule": schedule,
                      "memory_microbatches": microbatches, "optimizer": optimizer,
                      "recompute": fit.recompute, "stage_memory_bytes": fit.memory_bytes}
    return chosen, fit
