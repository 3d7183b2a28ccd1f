"""Plan a profile for a cluster and simulate the chosen schedule: what POST /plans answers and
what a job runs. Pure computation on plain data (no torch), fast enough to answer inline.
"""

from __future__ import annotations

from typing import Any, Sequence

from app.services.errors import ServiceError

# Bandwidth assumed between local worker processes when a job gives `workers` rather than
# cluster levels (shared memory through gloo: a few GB/s).
LOCAL_BANDWIDTH = 5e9


def levels_of(levels: Sequence[Any] | None, workers: int | None) -> list[tuple[int, float]]:
    if levels:
        return [(int(lv.workers if hasattr(lv, "workers") else lv["workers"]), float(lv.bandwidth if hasattr(lv, "bandwidth") else lv["bandwidth"])) for lv in levels]
    return [(int(workers or 1), LOCAL_BANDWIDTH)]


def make_plan(profile_data: dict[str, Any], levels: list[tuple[int, float]], *, memory_bytes: float | None, method: str) -> Any:
    """A trainer.plan.Plan; planner errors become 422 naming the field they concern."""
    from trainer.plan import PlanError, plan
    from trainer.profile.schema import Profile, ProfileError

    try:
        profile = Profile.from_dict(profile_data)
    except ProfileError as exc:
        raise ServiceError(f"profile_id: stored profile is invalid: {exc}", status=422, field="profile_id") from None
    try:
        return plan(profile, levels=levels, memory_bytes=memory_bytes, memory_constraint=memory_bytes is not None, method=method)
    except PlanError as exc:
        text = str(exc)
        field = "memory_bytes" if "memory" in text.lower() else "levels"
        raise ServiceError(f"{field}: {text}", status=422, field=field) from None


def stage_replicas(plan_obj: Any) -> list[int]:
    from trainer.schedule.costs import plan_replicas

    return plan_replicas(plan_obj)


def runtime_schedule(plan_obj: Any, schedule: str, microbatches: int, *, chunks: int = 1, vertical_sync: bool = False,
                     weight_grads: str = "batched") -> Any:
    """The Schedule `pipeboard train --plan` runs for one step of ``microbatches``: the runtime's own
    layout (trainer.runtime.layout.resolve, then Layout.build), so that what the service predicts is
    what a run executes: batched weight gradients where the runtime batches them (not dp, not zb-h1),
    pipedream's one update per batch, interleaved's chunks over the plan's stages. Raises
    ConfigError or ScheduleError."""
    from trainer.runtime.config import RunConfig
    from trainer.runtime.layout import resolve

    d = plan_obj.to_dict() if hasattr(plan_obj, "to_dict") else plan_obj
    stages = [list(st.get("layers") or [f"stage{i}"]) for i, st in enumerate(d.get("stages") or [])]
    cfg = RunConfig(model="", schedule=schedule, batch_size=microbatches, microbatches=microbatches, chunks=chunks,
                    vertical_sync=vertical_sync, weight_grads=weight_grads)
    if schedule == "dp":  # the whole model on every worker the planner costs data parallel with
        from trainer.schedule.costs import data_parallel_costs_from_plan

        cfg.workers = data_parallel_costs_from_plan(d)[1]
    else:
        cfg.stages, cfg.replicas = stages, stage_replicas(d)
    return resolve(cfg).build(microbatches)


def simulate(plan_obj: Any, schedule: str, microbatches: int, *, samples_per_microbatch: int | None = None, chunks: int = 1,
             vertical_sync: bool = False, weight_grads: str = "batched") -> tuple[Any, Any]:
    """(Schedule, SimResult) of the step a run of ``schedule`` on the plan executes (see
    runtime_schedule); 422 naming `schedule` if it cannot run.

    A simulated microbatch costs what the profile measured for one of its batches, so callers
    profile at the microbatch size they will run.
    """
    from trainer.runtime.config import ConfigError
    from trainer.schedule import ScheduleError
    from trainer.schedule.costs import costs_from_plan, data_parallel_costs_from_plan
    from trainer.schedule.simulate import simulate as run_sim

    try:
        # dp: the whole model on every worker, all-reduce as the planner costs it.
        costs = data_parallel_costs_from_plan(plan_obj)[0] if schedule == "dp" else costs_from_plan(plan_obj)
        sched = runtime_schedule(plan_obj, schedule, microbatches, chunks=chunks, vertical_sync=vertical_sync,
                                 weight_grads=weight_grads)
        return sched, run_sim(sched, costs, samples_per_microbatch=samples_per_microbatch)
    except (ConfigError, ScheduleError, ValueError) as exc:
        raise ServiceError(f"schedule: {schedule!r} cannot run this plan: {exc}", status=422, field="schedule") from None


def predicted_summary(plan_obj: Any, sched: Any, sim: Any, microbatches: int, timeline_limit: int) -> dict[str, Any]:
    """What the dashboard's what-if shows: the simulated timeline and throughput against DP."""
    from app.services.downsample import evenly

    d = plan_obj.to_dict()
    timeline = [ev.to_dict() for ev in sim.timeline]
    pipeline_time = float(d.get("predicted_time_s") or 0.0)
    dp_time = float(d.get("data_parallel_time_s") or 0.0)
    single = float(d.get("single_worker_time_s") or 0.0)
    return {
        "iteration_time_s": float(sim.iteration_time_s),
        "throughput": float(sim.throughput),
        "throughput_unit": sim.throughput_unit,
        "samples_per_s": sim.samples_per_s,
        "bubble_fraction": float(sim.bubble_fraction),
        "utilization": [float(u) for u in sim.utilization],
        "peak_activations": [int(p) for p in sim.peak_activations],
        "peak_memory_bytes": sim.peak_memory_bytes,
        "workers": len(sim.utilization),
        "microbatches": microbatches,
        # What the simulated actions do (build's decision: dp and zb-h1 never batch).
        "batch_weight_grads": bool(sched.meta.get("batch_weight_grads")),
        # The planner's objective (seconds per minibatch at steady state) against data
        # parallel on the same workers: >1 means the pipeline is predicted to be faster.
        "planner_time_per_minibatch_s": pipeline_time,
        "data_parallel_time_per_minibatch_s": dp_time,
        "single_worker_time_per_minibatch_s": single,
        "speedup_vs_data_parallel": (dp_time / pipeline_time) if pipeline_time > 0 and dp_time > 0 else None,
        "speedup_vs_single_worker": (single / pipeline_time) if pipeline_time > 0 and single > 0 else None,
        "timeline_total": len(timeline),
        "timeline": evenly(timeline, timeline_limit) if len(timeline) > timeline_limit else timeline,
    }
