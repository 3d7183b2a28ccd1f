"""The memory per stage that every view shows (``choose.simulate_plan``: `pipeboard plan`, POST
/plans, the plan page, the new-job card, a cap's check), counted as the tuner and ``plan_memory``
count it: from the profile's bytes, over the schedule as a run holds it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

# StageCosts' memory fields: what a stage keeps, none of them a time
BYTE_FIELDS = ("activation_bytes", "weight_bytes", "weight_grad_bytes", "weight_input_bytes")


def with_profile_bytes(costs: list[Any], from_profile: list[Any] | None) -> list[Any]:
    """``costs`` (the plan's own, where the profile lacks what the time model needs: a link, the
    input-gradient split) with the memory fields of ``from_profile`` (the profile's saved and
    weight-pass bytes, ``predict.kept_bytes``), not the plan's stage outputs: what crosses a cut
    is not what a stage keeps (a block of the zoo's transformer-text saves 16 x its output)."""
    if from_profile is None or len(from_profile) != len(costs):
        return costs
    return [replace(c, **{f: getattr(p, f) for f in BYTE_FIELDS}) for c, p in zip(costs, from_profile)]


def stage_memory_inputs(costs: list[Any], plan_obj: Any, profile_data: dict[str, Any] | None) -> list[Any] | None:
    """memory_model's inputs per (virtual) stage: the costs' bytes and the boundary tensors, the
    previous cut's output and the stage's own (what a recomputing stage keeps per microbatch, and
    the gradient a backward receives), from the profile at its longest length as the tuner takes
    them (``predict.stage_output_bytes``), else the plan's. None for one stage (no cut) or costs
    that are not one per plan stage."""
    from pipeboard.trainer.profile.schema import Profile, ProfileError
    from pipeboard.trainer.schedule.memory_model import StageMemory
    from pipeboard.trainer.schedule.predict import stage_output_bytes

    d = plan_obj.to_dict() if hasattr(plan_obj, "to_dict") else plan_obj
    stages = [list(st.get("layers") or []) for st in d.get("stages") or []]
    if len(costs) < 2 or len(stages) != len(costs):
        return None
    outs = [float(st.get("activation_bytes_out") or 0.0) for st in d["stages"]]
    if profile_data is not None and all(stages):
        try:
            outs = stage_output_bytes(Profile.from_dict(profile_data).at_longest(), stages)
        except (ProfileError, KeyError):
            pass
    last = len(costs) - 1
    return [StageMemory(weight_bytes=c.weight_bytes, activation_bytes=c.activation_bytes,
                        input_bytes=int(outs[k - 1]) if k else 0, output_bytes=int(outs[k]) if k < last else 0,
                        weight_grad_bytes=c.weight_grad_bytes, weight_input_bytes=c.weight_input_bytes)
            for k, c in enumerate(costs)]


def steady_state_memory(sim: Any, sched: Any, costs: list[Any], schedule: str, microbatches: int,
                        replicas: list[int], weight_grads: str, redo: list[int], optimizer: str,
                        memory: list[Any] | None = None) -> None:
    """An asynchronous schedule's memory in ``sim`` as its steady state holds it: one step of it
    stashes no weight version (its update follows every microbatch of the step), a run keeps one
    per batch in flight. The walk is ``memory_model.run_schedule``'s over several batches, the
    one the tuner and ``plan_memory`` read, over ``memory`` (``stage_memory_inputs``) where given;
    ``sim`` is left as it is when the walk lays the stages on the workers otherwise than ``sched``."""
    from pipeboard.trainer.schedule.memory_model import run_schedule, stage_memory_from_costs, worker_memory
    from pipeboard.trainer.schedule.simulator import stage_costs

    if sim.peak_memory_bytes is None:
        return
    walk = run_schedule(schedule, len(replicas), microbatches,
                        replicas=replicas if any(r > 1 for r in replicas) else None, weight_grads=weight_grads)
    if [w.stages for w in walk.workers] != [w.stages for w in sched.workers]:
        return
    inputs = memory if memory is not None else stage_memory_from_costs(stage_costs(walk, costs))
    parts = worker_memory(walk, inputs, optimizer=optimizer, recompute=redo)
    sim.peak_memory_bytes = [w.total for w in parts]
    sim.extra["memory"] = [w.as_dict() for w in parts]
