"""Plan a profile for a cluster and simulate the chosen schedule: what POST /plans answers and
what a job runs. The choice and the prediction are the engine's (trainer/choose.py, which
`pipeboard plan` calls too); here they become HTTP errors naming the field, and the what-if's
summary. Pure computation on plain data, fast enough to answer inline.
"""

from __future__ import annotations

from typing import Any, Sequence

from pipeboard.app.services.errors import ServiceError
from pipeboard.trainer import choose
# the engine's names, importable from here as before (bench/, tests/, app/services/fidelity.py)
from pipeboard.trainer.choose import (  # noqa: F401
    EVEN_SPLITS, PIPEDREAM_METHOD, chosen_recompute, profile_costs, ranked_candidates, recompute_stages, runtime_schedule, stage_replicas,
    virtual_levels)

# Bandwidth assumed between local worker processes when a job gives `workers` rather than
# cluster levels (shared memory through gloo: a few GB/s).
LOCAL_BANDWIDTH = 5e9


def levels_of(levels: Sequence[Any] | None, workers: int | None) -> list[tuple[int, float]]:
    if levels:
        return [(int(lv.workers if hasattr(lv, "workers") else lv["workers"]), float(lv.bandwidth if hasattr(lv, "bandwidth") else lv["bandwidth"])) for lv in levels]
    return [(int(workers or 1), LOCAL_BANDWIDTH)]


def _refused(exc: Any) -> ServiceError:
    """A ChoiceError as the 422 naming its field (a stored profile is the request's profile_id)."""
    if exc.field == "profile":
        return ServiceError(f"profile_id: stored profile is {str(exc).split(': ', 1)[1]}", status=422, field="profile_id")
    return ServiceError(str(exc), status=422, field=exc.field)


def make_plan(profile_data: dict[str, Any], levels: list[tuple[int, float]], *, memory_bytes: float | None, method: str,
              schedule: str | None = None, microbatches: int | None = None, weight_grads: str = "batched",
              chunks: int = 1, recompute: str | list[int] | None = None, optimizer: str = "adam") -> Any:
    """trainer.choose.choose_plan (the one the CLI calls too); its errors become 422 naming the field."""
    try:
        return choose.choose_plan(profile_data, levels, memory_bytes=memory_bytes, method=method, schedule=schedule,
                                  microbatches=microbatches, weight_grads=weight_grads, chunks=chunks,
                                  recompute=recompute, optimizer=optimizer)
    except choose.ChoiceError as exc:
        raise _refused(exc) from None


def split_plan(profile_data: dict[str, Any], split: list[dict[str, Any]], levels: list[tuple[int, float]], *,
               chunks: int = 1) -> Any:
    """A job's ``layout.split`` as its plan (trainer.tune.given: the stages as given, costed as the
    planner costs its own; with chunks, one stage per virtual stage); 422 naming ``layout.split``."""
    from pipeboard.trainer.profile.schema import Profile, ProfileError
    from pipeboard.trainer.tune import TuneError
    from pipeboard.trainer.tune.given import split_plan as given_plan

    try:
        profile = Profile.from_dict(profile_data)
    except ProfileError as exc:
        raise ServiceError(f"profile_id: stored profile is invalid: {exc}", status=422, field="profile_id") from None
    (workers, bandwidth), = virtual_levels(levels, chunks) if chunks > 1 else levels[:1]
    try:
        return given_plan(profile, split, workers, bandwidth)
    except TuneError as exc:
        raise ServiceError(f"layout.{exc}", status=422, field="layout.split") from None


def simulate(plan_obj: Any, schedule: str, microbatches: int, *, samples_per_microbatch: int | None = None, chunks: int = 1,
             vertical_sync: bool = False, weight_grads: str = "batched",
             profile_data: dict[str, Any] | None = None, recompute: str | list[int] | None = None,
             optimizer: str = "adam") -> tuple[Any, Any]:
    """trainer.choose.simulate_plan: (Schedule, SimResult) of the step a run executes; 422 naming the field."""
    try:
        return choose.simulate_plan(plan_obj, schedule, microbatches, samples_per_microbatch=samples_per_microbatch,
                                    chunks=chunks, vertical_sync=vertical_sync, weight_grads=weight_grads,
                                    profile_data=profile_data, recompute=recompute, optimizer=optimizer)
    except choose.ChoiceError as exc:
        raise _refused(exc) from None


def predicted_summary(plan_obj: Any, sched: Any, sim: Any, microbatches: int, timeline_limit: int) -> dict[str, Any]:
    """What the dashboard's what-if shows: the simulated timeline and throughput against DP."""
    from pipeboard.app.services.downsample import evenly

    d = plan_obj.to_dict()
    timeline = [ev.to_dict() for ev in sim.timeline]
    pipeline_time = float(d.get("predicted_time_s") or 0.0)
    dp_time = float(d.get("data_parallel_time_s") or 0.0)
    single = float(d.get("single_worker_time_s") or 0.0)
    steady, dp_step = sim.steady_step_s, sim.data_parallel_step_s
    if steady and dp_step:  # the profile cost model: data parallelism under the same model as the step
        versus_dp = dp_step / steady
    else:  # the plan's costs: the planner's own objective for both
        versus_dp = (dp_time / pipeline_time) if pipeline_time > 0 and dp_time > 0 else None
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
        # Where the simulated action costs came from: "profile" (per-layer measurements, link and
        # runtime overhead through pipeboard.trainer.schedule.predict) or "plan" (per-stage compute only).
        "cost_model": sim.cost_model or "plan",
        # With the profile cost model: seconds per step when steps run back to back (what the
        # run's samples/s measures); None otherwise.
        "steady_step_s": steady,
        # data parallelism's step on the same workers under the step's own cost model (profile costs)
        "data_parallel_step_s": dp_step,
        # peak bytes per (virtual) stage (the most of the workers holding it) and the stages that
        # recompute their activations, as the run will
        "stage_memory_bytes": choose.stage_memory(sched, sim),
        "recompute_stages": list(sim.recompute),
        # The planner's objective (seconds per minibatch at steady state), kept for the record; the
        # comparison against data parallel (>1: the pipeline is predicted faster) is the step's own
        # cost model's where the profile gives one, else the planner's.
        "planner_time_per_minibatch_s": pipeline_time,
        "data_parallel_time_per_minibatch_s": dp_time,
        "single_worker_time_per_minibatch_s": single,
        "speedup_vs_data_parallel": versus_dp,
        "speedup_vs_single_worker": (single / pipeline_time) if pipeline_time > 0 and single > 0 else None,
        "timeline_total": len(timeline),
        "timeline": evenly(timeline, timeline_limit) if len(timeline) > timeline_limit else timeline,
    }
