"""The plan a run takes, and its prediction: one function for `pipeboard plan`, `POST /plans` and a
job (the service calls it through app/services/planning.py, the CLI directly), so one input gives
one plan everywhere.

``choose_plan`` plans a profile (PipeDream's planner or a baseline); given the schedule and the
microbatches the run will have, PipeDream's plan competes with the baselines' under the cost
model that predicts the run (``ranked_candidates``: the simulator on ``profile_costs``, the
profile's measured layers, link and per-action overhead, and ``steady_step_s``). ``simulate_plan``
is that prediction for one plan: the step the runtime executes (``runtime_schedule``: the
runtime's own layout) under those costs, memory per worker included.

It lives beside the planner rather than in it because the runtime's layout decides the schedule
a plan runs (trainer/plan never imports the runtime). Errors are ``ChoiceError`` naming the
field they concern (``memory_bytes``, ``levels``, ``chunks``, ``profile``, ``schedule``,
``recompute``).
"""

from __future__ import annotations

from typing import Any

from pipeboard.trainer.predicted_memory import stage_memory_inputs, steady_state_memory, with_profile_bytes
from pipeboard.trainer.schedule import registry
from pipeboard.trainer.schedule.tied_splits import tied_refusal

# The planner method (PipeDream's dynamic program), not the schedule of the same name.
PIPEDREAM_METHOD = "pipedream"
EVEN_SPLITS = ("time", "uniform", "params")  # the planner's methods that split without replicas


class ChoiceError(ValueError):
    """A plan that cannot be made or run as asked; ``field`` names the input at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def choose_plan(profile_data: dict[str, Any], levels: list[tuple[int, float]], *, memory_bytes: float | None,
                method: str, schedule: str | None = None, microbatches: int | None = None,
                weight_grads: str = "batched", chunks: int = 1, recompute: str | list[int] | None = None,
                optimizer: str = "adam") -> Any:
    """A pipeboard.trainer.plan.Plan. With ``schedule`` and ``microbatches`` (what the run runs),
    method ``pipedream``, no memory cap and a profile that carries the measurements
    ``profile_costs`` needs, the plan is the fastest of the candidates (``ranked_candidates``)
    under the cost model the run's prediction uses. With a memory cap too (``memory_bytes`` per
    worker) the plan is the fastest candidate that fits it (``fit_under_cap``), activation
    recompute turned on, beyond the stages ``recompute`` asks for, where a stage would not fit; the
    plan's options record ``recompute`` (per plan stage) and ``stage_memory_bytes``."""
    from pipeboard.trainer.plan import PlanError, plan
    from pipeboard.trainer.profile.schema import Profile, ProfileError

    try:
        profile = Profile.from_dict(profile_data)
    except ProfileError as exc:
        raise ChoiceError("profile", f"invalid: {exc}") from None
    if chunks > 1:  # one plan stage per virtual stage: chunks for every worker
        levels = virtual_levels(levels, chunks)
    capped = memory_bytes is not None and schedule is not None and microbatches is not None
    try:
        # under a cap and a schedule, the memory model checks the candidates; PipeDream's stash
        # formula alone (without a schedule) would miss gradients, optimizer state and recompute
        chosen = plan(profile, levels=levels, memory_bytes=memory_bytes,
                      memory_constraint=memory_bytes is not None and not capped, method=method)
        # a replicated, merged or parameterless stage cannot be a chunk: the even splits instead
        for even in EVEN_SPLITS if chunks > 1 and not one_worker_per_stage(chosen, levels[0][0], profile) else ():
            try:
                chosen = plan(profile, levels=levels, method=even)
            except PlanError:  # this split cannot make that many stages: the next, else the error below
                continue
            if one_worker_per_stage(chosen, levels[0][0], profile):
                break
    except PlanError as exc:
        text = str(exc)
        raise ChoiceError("memory_bytes" if "memory" in text.lower() else "levels", text) from None
    if chunks > 1 and not one_worker_per_stage(chosen, levels[0][0], profile):
        trainable = sum(1 for layer in profile.layers if layer.parameter_bytes > 0)
        raise ChoiceError("chunks", f"{chunks} chunks on each of {levels[0][0] // chunks} workers need "
                                    f"{levels[0][0]} stages with parameters; the model has {trainable} layers with "
                                    "parameters, or no even split gives each stage some")
    if schedule is None or microbatches is None:
        return chosen
    ranked = ranked_candidates(profile_data, levels, chosen, schedule, microbatches, weight_grads=weight_grads,
                               chunks=chunks) if method == PIPEDREAM_METHOD else []
    candidates = [cand for _, cand in ranked] or [chosen]
    if not capped:
        return candidates[0]
    if method == PIPEDREAM_METHOD:  # PipeDream's own stash-constrained plan may fit where the others do not
        try:
            candidates.append(plan(profile, levels=levels, memory_bytes=memory_bytes, memory_constraint=True))
        except PlanError:
            pass
    return fit_under_cap(candidates, schedule, microbatches, memory_bytes, profile_data=profile_data,
                         weight_grads=weight_grads, chunks=chunks, recompute=recompute, optimizer=optimizer)


def stage_memory(sched: Any, sim: Any) -> list[int] | None:
    """Predicted peak bytes per (virtual) stage: the most of the workers that hold it (a worker's
    memory counts every stage it holds), from the simulation's memory per worker."""
    if sim.peak_memory_bytes is None:
        return None
    out = [0] * sched.num_stages
    for spec, total in zip(sched.workers, sim.peak_memory_bytes):
        for st in spec.stages:
            out[st] = max(out[st], int(total))
    return out


def fit_under_cap(candidates: list[Any], schedule: str, microbatches: int, cap: float, *,
                  profile_data: dict[str, Any] | None, weight_grads: str = "batched", chunks: int = 1,
                  recompute: str | list[int] | None = None, optimizer: str = "adam") -> Any:
    """The first of ``candidates`` (fastest first) whose predicted memory per worker
    (``simulate_plan``'s, the one every view shows) fits ``cap``: with the stages ``recompute``
    asks for, and where that is over, recompute also on the stages over the cap whose memory it
    lowers. ChoiceError on ``memory_bytes`` naming the smallest memory any candidate needs."""
    def sim(cand, redo):
        sched, result = simulate_plan(cand, schedule, microbatches, weight_grads=weight_grads, chunks=chunks,
                                      profile_data=profile_data, recompute=redo, optimizer=optimizer,
                                      compare_data_parallel=False)
        return sched, stage_memory(sched, result)

    smallest = None
    for cand in candidates:
        sched, plain = sim(cand, recompute)
        if plain is None:
            raise ChoiceError("memory_bytes", "this profile gives no memory to check a cap against")
        floor = recompute_stages(recompute, sched.num_stages)
        redo, memory = floor, plain
        if max(plain) > cap:
            _, every = sim(cand, "all")
            redo = sorted(set(floor) | {s for s, (off, on) in enumerate(zip(plain, every)) if off > cap and on < off})
            memory = sim(cand, redo)[1] if redo != floor else plain
            least = max(min(off, on) for off, on in zip(plain, every))
            if smallest is None or least < smallest[0]:
                smallest = (least, cand.method)
        if max(memory) <= cap:
            cand.options = {**cand.options, "memory_cap_bytes": cap, "memory_schedule": schedule,
                            "memory_microbatches": microbatches, "optimizer": optimizer,
                            "recompute": [s in redo for s in range(sched.num_stages)], "stage_memory_bytes": memory}
            return cand
    raise ChoiceError("memory_bytes", f"no plan fits in {int(cap)} bytes per worker under {schedule}; the smallest any "
                                      f"plan needs is {smallest[0]} bytes ({smallest[1]}, recompute where it helps)")


def chosen_recompute(plan_obj: Any, recompute: str | list[int] | None) -> str | list[int] | None:
    """What a run of the plan recomputes: the stages a capped choice turned on (its options),
    else what was asked."""
    flags = (getattr(plan_obj, "options", None) or {}).get("recompute")
    return [s for s, on in enumerate(flags) if on] if flags else recompute


def virtual_levels(levels: list[tuple[int, float]], chunks: int) -> list[tuple[int, float]]:
    """The one level an interleaved run's plan is made for: a stage per virtual stage, ``chunks``
    on each of the cluster's workers (over its slowest link)."""
    from pipeboard.trainer.plan.cluster import total_workers

    return [(total_workers(levels) * chunks, min(bw for _, bw in levels))]


def one_worker_per_stage(plan_obj: Any, stages: int, profile: Any) -> bool:
    """Whether the plan has ``stages`` stages of one replica each, every one with parameters."""
    d = plan_obj.to_dict()
    weighted = {layer.name for layer in profile.layers if layer.parameter_bytes > 0}
    return (len(d.get("stages") or []) == stages and all(int(st.get("replicas") or 1) == 1 for st in d["stages"])
            and all(weighted.intersection(st.get("layers") or []) for st in d["stages"]))


def ranked_candidates(profile_data: dict[str, Any], levels: list[tuple[int, float]], planned: Any, schedule: str,
                      microbatches: int, *, weight_grads: str = "batched", chunks: int = 1) -> list[tuple[float, Any]]:
    """(predicted steady seconds per step, plan) of PipeDream's plan (``planned``) and each
    baseline's distinct one (even splits by layers, time or parameters; data parallel) whose
    every stage has parameters and, under an asynchronous schedule, that keeps tied layers on
    one stage (``schedule.tied_splits``), fastest first, as ``simulate_plan`` predicts them for ``schedule``
    (the profile cost model); PipeDream's first among equals. Empty when the profile lacks what
    that model needs (then the planner's own objective stands) or no candidate can run the
    schedule."""
    from pipeboard.trainer.plan import METHODS, PlanError, plan
    from pipeboard.trainer.profile.schema import Profile

    if registry.is_data_parallel(schedule):  # the runtime's own layout, not the plan's stages
        return []
    profile = Profile.from_dict(profile_data)
    weighted = {layer.name for layer in profile.layers if layer.parameter_bytes > 0}
    candidates, seen = [], set()
    for method in METHODS:
        try:
            cand = planned if method == PIPEDREAM_METHOD else plan(profile, levels=levels, method=method)
        except PlanError:
            continue
        d = cand.to_dict()
        key = tuple((tuple(st.get("layers") or []), int(st.get("replicas") or 1)) for st in d.get("stages") or [])
        # a stage without parameters cannot train (its optimizer would have none to step); an
        # asynchronous schedule cannot keep tied weights on two stages (the runtime refuses it)
        if key in seen or any(not weighted.intersection(layers) for layers, _ in key) or \
                tied_refusal(profile.meta.get("tied"), [list(layers) for layers, _ in key], schedule):
            continue
        if chunks > 1 and not one_worker_per_stage(cand, levels[0][0], profile):  # levels: virtual_levels
            continue
        seen.add(key)
        try:
            _, sim = simulate_plan(cand, schedule, microbatches, weight_grads=weight_grads, profile_data=profile_data,
                                   chunks=chunks, compare_data_parallel=False)
        except ChoiceError:
            continue
        if sim.steady_step_s is None:
            return []
        candidates.append((sim.steady_step_s, len(candidates), cand))
    return [(t, cand) for t, _, cand in sorted(candidates, key=lambda c: (c[0], c[1]))]


def stage_replicas(plan_obj: Any) -> list[int]:
    from pipeboard.trainer.schedule.action_costs import plan_replicas

    return plan_replicas(plan_obj)


def runtime_schedule(plan_obj: Any, schedule: str, microbatches: int, *, chunks: int = 1, vertical_sync: bool = False,
                     weight_grads: str = "batched") -> Any:
    """The Schedule `pipeboard train --plan` runs for one step of ``microbatches``: the runtime's own
    layout (trainer.runtime.layout.resolve, then Layout.build), so that what is predicted is what a
    run executes: batched weight gradients where the runtime batches them (not dp, not zb-h1),
    pipedream's one update per batch, interleaved's chunks over the plan's stages. Raises
    ConfigError or ScheduleError."""
    from pipeboard.trainer.runtime.run_config import RunConfig
    from pipeboard.trainer.runtime.layout import resolve

    d = plan_obj.to_dict() if hasattr(plan_obj, "to_dict") else plan_obj
    stages = [list(st.get("layers") or [f"stage{i}"]) for i, st in enumerate(d.get("stages") or [])]
    cfg = RunConfig(model="", schedule=schedule, batch_size=microbatches, microbatches=microbatches, chunks=chunks,
                    vertical_sync=vertical_sync, weight_grads=weight_grads)
    if registry.is_data_parallel(schedule):  # the whole model on every worker the planner costs data parallel with
        cfg.workers = data_parallel_workers(d)
    else:
        cfg.stages, cfg.replicas = stages, stage_replicas(d)
    return resolve(cfg).build(microbatches)


def profile_costs(plan_obj: Any, schedule: str, microbatches: int, profile_data: dict[str, Any] | None,
                  chunks: int = 1, *, bytes_only: bool = False) -> list[Any] | None:
    """StageCosts from the plan's profile through trainer.schedule.predict.stage_costs (forward,
    input- and weight-gradient backward, batched W(-1), optimizer step, transfers over the
    measured link, the runtime's per-action overhead), or None when the profile does not carry
    what that needs (an imported graph.txt: no input-gradient split, no optimizer step, no link).
    ``bytes_only``: for the costs' memory fields alone, which need none of that."""
    from pipeboard.trainer.profile.schema import Profile, ProfileError
    from pipeboard.trainer.schedule.predict import profile_overhead, stage_costs

    # interleaved-1f1b: the plan's stages are the run's virtual stages, in order (chunks x workers
    # of them; trainer.runtime.layout.resolve), one StageCosts each
    if profile_data is None:
        return None
    try:
        prof = Profile.from_dict(profile_data)
    except ProfileError:
        return None
    if not bytes_only and (prof.link is None or any(layer.backward_input_ms is None or layer.optimizer_ms is None
                                                    for layer in prof.layers if layer.parameter_bytes > 0)):
        return None
    d = plan_obj.to_dict() if hasattr(plan_obj, "to_dict") else plan_obj
    stages = [list(st.get("layers") or []) for st in d.get("stages") or []]
    if not stages or not all(stages) or len(stages) % chunks:
        return None
    replicas = stage_replicas(d)
    if registry.is_data_parallel(schedule):  # the whole model, replicated on every worker the plan has
        stages, replicas = [[name for st in stages for name in st]], [data_parallel_workers(d)]
    return stage_costs(prof, stages, microbatches=microbatches, replicas=replicas,
                       overhead=None if bytes_only else profile_overhead(prof, stages))


def data_parallel_workers(plan_dict: dict[str, Any]) -> int:
    return int(plan_dict.get("total_workers") or sum(stage_replicas(plan_dict)))


def data_parallel_step_s(plan_obj: Any, microbatches: int, *, profile_data: dict[str, Any] | None,
                         weight_grads: str = "batched", recompute: str | list[int] | None = None,
                         chunks: int = 1) -> float | None:
    """Predicted seconds per step of data parallelism on the plan's workers, the whole model on
    each (schedule ``dp``), under the same cost model as the plan's own prediction: the one
    comparison against data parallelism. None without the profile cost model. With ``chunks``,
    the plan's workers are virtual (chunks on each of the run's): dp gets the run's workers."""
    d = plan_obj.to_dict() if hasattr(plan_obj, "to_dict") else dict(plan_obj)
    if chunks > 1:
        d = {**d, "total_workers": data_parallel_workers(d) // chunks}
    redo = "all" if recompute == "all" else None  # dp's one stage recomputes only when every stage does
    _, sim = simulate_plan(d, "dp", microbatches, weight_grads=weight_grads, profile_data=profile_data,
                           recompute=redo, compare_data_parallel=False)
    return sim.steady_step_s


def recompute_stages(recompute: str | list[int] | None, stages: int) -> list[int]:
    """A job's ``layout.recompute`` (``none``, ``all`` or stage numbers) as the virtual stages of a
    schedule of ``stages`` that recompute (as RunConfig.with_plan resolves it for the run)."""
    if recompute in (None, "none"):
        return []
    if recompute == "all":
        return list(range(stages))
    return list(recompute)


def recomputed_costs(costs: list[Any], redo: list[int]) -> list[Any]:
    """``costs`` with the listed stages recomputing, charged by the cost model's one formula
    (trainer.schedule.predict.recomputed: a replayed forward in B and BI, and a W that replays
    the forward and the input gradients again)."""
    from pipeboard.trainer.schedule.predict import recomputed_costs as charged

    return charged(costs, redo) if redo else costs


def simulate_plan(plan_obj: Any, schedule: str, microbatches: int, *, samples_per_microbatch: int | None = None,
                  chunks: int = 1, vertical_sync: bool = False, weight_grads: str = "batched",
                  profile_data: dict[str, Any] | None = None, recompute: str | list[int] | None = None,
                  optimizer: str = "adam", compare_data_parallel: bool = True) -> tuple[Any, Any]:
    """(Schedule, SimResult) of the step a run of ``schedule`` on the plan executes (see
    runtime_schedule); ChoiceError naming ``schedule`` if it cannot run. The result's
    ``cost_model`` says where the action costs came from: ``"profile"`` (``profile_costs``),
    else ``"plan"`` (the plan's per-stage forward and backward, no optimizer step, transfers or
    runtime overhead); ``steady_step_s`` is the time per step when steps run back to back (None
    under the plan's costs). ``recompute`` as ``recompute_stages`` takes it: the predicted memory
    counts it (and its time: ``recomputed_costs``); the result's ``recompute`` lists the stages
    that recompute. With ``compare_data_parallel`` and the profile cost model, the result's
    ``data_parallel_step_s`` is data parallelism's step on the same workers under that model
    (``data_parallel_step_s``): the one comparison every view shows.

    A simulated microbatch costs what the profile measured for one of its batches, so callers
    profile at the microbatch size they will run.
    """
    from pipeboard.trainer.runtime.run_config import ConfigError
    from pipeboard.trainer.schedule import ScheduleError
    from pipeboard.trainer.schedule.action_costs import costs_from_plan, data_parallel_costs_from_plan
    from pipeboard.trainer.schedule.simulator import simulate as run_sim

    try:
        costs = profile_costs(plan_obj, schedule, microbatches, profile_data, chunks)
        cost_model = "profile" if costs is not None else "plan"
        if costs is None:
            # dp: the whole model on every worker, all-reduce as the planner costs it.
            costs = (data_parallel_costs_from_plan(plan_obj)[0] if registry.is_data_parallel(schedule)
                     else costs_from_plan(plan_obj))
            # memory needs no link nor timing: the profile's bytes where it has them
            costs = with_profile_bytes(costs, profile_costs(plan_obj, schedule, microbatches, profile_data, chunks,
                                                            bytes_only=True))
        sched = runtime_schedule(plan_obj, schedule, microbatches, chunks=chunks, vertical_sync=vertical_sync,
                                 weight_grads=weight_grads)
        if recompute in (None, "none") and chunks == 1 and not registry.is_data_parallel(schedule):
            recompute = chosen_recompute(plan_obj, recompute)  # as RunConfig.with_plan: the plan's own choice
        redo = recompute_stages(recompute, sched.num_stages)
        if any(st >= sched.num_stages for st in redo):  # a job's door bounds it only by its workers
            raise ChoiceError("recompute", f"stage {max(redo)} is not a stage of this plan (0..{sched.num_stages - 1})")
        costs = recomputed_costs(costs, redo)
        if len(set(redo)) != len(redo):
            raise ChoiceError("recompute", f"stage numbers repeat: {list(recompute)}")
        memory = stage_memory_inputs(costs, plan_obj, profile_data) if len(costs) == sched.num_stages else None
        sim = run_sim(sched, costs, samples_per_microbatch=samples_per_microbatch, recompute=redo, optimizer=optimizer,
                      memory=memory)
        if not registry.get(schedule).synchronous:
            steady_state_memory(sim, sched, costs, schedule, microbatches, stage_replicas(plan_obj), weight_grads,
                                redo, optimizer, memory)
        sim.cost_model, sim.recompute = cost_model, sorted(redo)
        if cost_model == "profile":
            from pipeboard.trainer.schedule.predict import steady_step_s

            # The runtime runs step after step, the next step's first forwards overlapping this
            # one's drain: its time per step (batch_size / samples_per_s) is the steady state.
            # the profiled machine's cores (profile_run records them): the run's workers share them
            cores = (profile_data.get("meta") or {}).get("cores")
            cores = cores if isinstance(cores, int) else None
            replicas = stage_replicas(plan_obj) if chunks == 1 else None  # interleaved: none replicated
            if registry.is_data_parallel(schedule):
                replicas = [data_parallel_workers(plan_obj.to_dict() if hasattr(plan_obj, "to_dict") else plan_obj)]
            sim.steady_step_s = steady_step_s(costs, schedule, microbatches,
                                              batch_weight_grads=bool(sched.meta.get("batch_weight_grads")),
                                              replicas=replicas, chunks=chunks, cores=cores)
            if profile_data.get("pilot"):  # what the pilots' steps took beyond their actions
                from pipeboard.trainer.profile.calibration_records import Pilot

                sim.steady_step_s *= Pilot.from_dict(profile_data["pilot"]).step_factor(
                    len(sched.workers), cores, replicated=any(r > 1 for r in replicas or []),
                    stages=len(replicas) if replicas else len(sched.workers))
            if compare_data_parallel and not registry.is_data_parallel(schedule):
                sim.data_parallel_step_s = data_parallel_step_s(plan_obj, microbatches, profile_data=profile_data,
                                                                weight_grads=weight_grads, recompute=recompute,
                                                                chunks=chunks)
            elif registry.is_data_parallel(schedule):
                sim.data_parallel_step_s = sim.steady_step_s
        return sched, sim
    except (ConfigError, ScheduleError, ValueError) as exc:
        if isinstance(exc, ChoiceError):
            raise
        raise ChoiceError("schedule", f"{schedule!r} cannot run this plan: {exc}") from None
