"""Discrete-event simulation of a schedule: the predicted timeline of its action lists.

The model is the runtime the action lists are written for:
- a worker runs its list in order; computes, steps and all-reduces occupy it;
- a SEND is posted without blocking the worker; a RECV posts a receive without blocking; a
  transfer starts once both are posted and takes the stage's send time; the compute that needs
  the data waits for it to arrive (pre-posted receives overlap transfers with compute);
- transfers do not contend, unless ``shared_links=True``: then the transfers between two workers,
  both directions, take turns on one link (the planner's assumption);
- an ALLREDUCE starts when its whole group has reached it and takes the stage's all-reduce time;
- an overlapped forward-and-backward pair (``meta["overlap_f_b"]``, actions.OverlapFB) runs in
  sequence, as pipeboard's runtime runs it on every device, unless ``overlap_f_b=True``: then
  the backward may start with the forward (its receive posted at the pair's start) and the
  worker is free once both have ended, what a runtime that overlaps them (DualPipe's
  computation-communication overlap on GPUs) would get.

The loop itself lives in engine.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeboard.trainer.schedule.actions import Schedule, ScheduleError, TimelineEvent
from pipeboard.trainer.schedule.action_costs import StageCosts
from pipeboard.trainer.schedule.engine import (
    Program,
    SharedLinks,
    Trace,
    compile_programs,
    durations,
    gc_paused,
    run,
    worker_stats,
)
from pipeboard.trainer.schedule.memory_model import StageMemory, stage_memory_from_costs, worker_memory
from pipeboard.trainer.schedule.stash import CODES, memory_profile, schedule_columns

NAME = {code: kind.value for kind, code in CODES.items()}


@dataclass
class SimResult:
    iteration_time_s: float  # makespan of the schedule (all its microbatches / minibatches)
    throughput: float  # microbatches per second over the iteration
    throughput_unit: str
    bubble_fraction: float  # idle share of worker-time within the iteration, averaged over workers
    utilization: list[float]  # per worker: share of the iteration spent in F/B/BI/W
    peak_activations: list[int]  # per worker, in-flight (microbatch, stage) pairs
    stashed_versions: list[int]  # per worker, weight versions held at once
    peak_memory_bytes: list[int] | None  # per worker, when the costs give bytes (memory_model's total)
    steady_bubble_fraction: float | None  # idle share once every worker runs 1F1B, before the drain
    steady_throughput: float | None  # microbatches per second within that steady state
    samples_per_s: float | None = None
    # set by trainer.choose.simulate_plan: where the costs came from ("profile" or "plan"), the
    # stages that recompute, the step back to back and data parallelism's under the same costs
    cost_model: str | None = None
    recompute: list[int] = field(default_factory=list)
    steady_step_s: float | None = None
    data_parallel_step_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    _make_timeline: Any = field(default=None, repr=False, compare=False)
    _timeline: list[TimelineEvent] | None = field(default=None, repr=False, compare=False)

    @property
    def timeline(self) -> list[TimelineEvent]:
        """The predicted events, built on first use (creating 10^5 events costs more than simulating)."""
        if self._timeline is None:
            with gc_paused():
                self._timeline = self._make_timeline() if self._make_timeline else []
        return self._timeline

    def summary(self) -> dict[str, Any]:
        """Everything but the timeline, JSON-ready."""
        d = {k: v for k, v in self.__dict__.items() if not k.startswith("_") and k != "extra"}
        return d | self.extra


def stage_costs(schedule: Schedule, costs: list[StageCosts]) -> list[StageCosts]:
    """One StageCosts per virtual stage; a worker's physical-stage costs are split evenly over the
    chunks it holds (wherever the schedule's placement puts them)."""
    n = schedule.num_stages
    if len(costs) == n:
        return list(costs)
    p = schedule.meta.get("physical_stages", n)
    chunks = schedule.meta.get("chunks", 1)
    if chunks > 1 and len(costs) == p and p * chunks == n:
        worker_of = {s: w.rank for w in schedule.workers for s in w.stages}
        return [costs[worker_of[j]].scaled(1 / chunks) for j in range(n)]
    raise ScheduleError(f"costs list {len(costs)} stages; the schedule has {n} (or {p} with chunks)")


def simulate(
    schedule: Schedule,
    costs: list[StageCosts],
    *,
    samples_per_microbatch: int | None = None,
    shared_links: bool = False,
    overlap_f_b: bool = False,
    optimizer: str = "adam",
    recompute: tuple[int, ...] | list[int] = (),
    memory: list[StageMemory] | None = None,
) -> SimResult:
    """Predict the timeline of ``schedule`` under per-stage ``costs``; ``overlap_f_b`` times its
    overlapped pairs overlapped (the module docstring says when). Memory is memory_model's, for
    ``optimizer`` (the task's default, adam, unless given) with ``recompute`` on the listed
    virtual stages; ``memory`` gives the stages' memory inputs (boundary sizes included) where
    the costs' two byte fields are not enough."""
    per_stage = stage_costs(schedule, costs)
    with gc_paused():
        cols, sources = schedule_columns(schedule)
        progs = compile_programs(schedule, cols, sources, durations(per_stage), overlap_f_b)
        trace = run(schedule, progs, SharedLinks() if shared_links else None)
        stats = worker_stats(progs, trace)
        activations, versions = memory_profile(schedule, cols)
        parts = _memory(schedule, per_stage, cols, optimizer, recompute, memory)
    n = len(schedule.workers)
    busy, compute = stats.busy, stats.compute
    span = max([stats.t1] + [end for *_, end in trace.transfers]) - stats.t0
    throughput = schedule.microbatches / span if span > 0 else float("inf")
    return SimResult(
        iteration_time_s=span,
        throughput=throughput,
        throughput_unit="microbatches/s",
        bubble_fraction=max(0.0, 1.0 - sum(busy) / (span * n)) if span > 0 else 0.0,
        utilization=[c / span if span > 0 else 0.0 for c in compute],
        peak_activations=activations,
        stashed_versions=versions,
        peak_memory_bytes=None if parts is None else [w.total for w in parts],
        steady_bubble_fraction=stats.steady_bubble,
        steady_throughput=stats.steady_rate,
        samples_per_s=None if samples_per_microbatch is None else throughput * samples_per_microbatch,
        extra={"schedule": schedule.name, "workers": n, "microbatches": schedule.microbatches,
               **({} if parts is None else {"memory": [w.as_dict() for w in parts]}),
               **({"overlap_f_b": overlap_f_b} if "overlap_f_b" in schedule.meta else {})},
        _make_timeline=lambda: _timeline(schedule, progs, trace),
    )


def _timeline(schedule: Schedule, progs: list[Program], trace: Trace) -> list[TimelineEvent]:
    """Events numbered by step as the runtime numbers its own: a sync schedule is one step; a
    pipedream step is one batch (``meta["per_update"]`` microbatches, one update), and a
    W(-1), all-reduce or step belongs to the batch of the work before it."""
    per_step = 0 if schedule.meta.get("sync", True) else schedule.meta.get("per_update", 1)

    def step_of(mb: int) -> int:
        return mb // per_step if per_step else 0

    timeline = []
    for w, (p, idx, starts) in enumerate(zip(progs, trace.index, trace.start)):
        replica = schedule.workers[w].replica
        step = 0
        mbs = p.mb.tolist()
        for i, start in zip(idx, starts):
            mb = mbs[i]
            if mb >= 0:
                step = step_of(mb)
            kind = NAME[p.codes[i]]
            end = start + p.durs[i]
            timeline.append(TimelineEvent(w, p.stages[i], replica, mb, kind, start, end, step))
    for src, code, stage, mb, start, end in trace.transfers:
        replica = schedule.workers[src].replica
        timeline.append(TimelineEvent(src, stage, replica, mb, NAME[code], start, end, step_of(mb)))
    return timeline


def _memory(schedule: Schedule, per_stage: list[StageCosts], cols, optimizer: str, recompute, memory):
    """Per worker memory_model parts; None when neither the costs nor ``memory`` give bytes."""
    if memory is None:
        if not any(c.activation_bytes or c.weight_bytes for c in per_stage):
            return None
        memory = stage_memory_from_costs(per_stage)
    return worker_memory(schedule, memory, optimizer=optimizer, recompute=recompute, cols=cols)
