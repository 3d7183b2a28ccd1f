"""What each stage's actions cost, for the simulator: seconds per microbatch, bytes optional.

``costs_uniform`` makes a synthetic pipeline of equal stages; ``costs_from_plan`` reads a
``pipeboard.trainer.plan`` Plan (or its JSON dict). Where a schedule splits the backward and the costs do
not say how, BI and W take half of B each (the zero-bubble paper's T_B = T_W assumption).
A batched ``W(-1)`` costs ``w_batched_s`` per microbatch it covers (default: W's cost).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from pipeboard.trainer.schedule.actions import ScheduleError


@dataclass(frozen=True)
class StageCosts:
    fwd_s: float  # forward of one microbatch
    bwd_s: float  # full backward of one microbatch (BI + W)
    bwd_input_s: float | None = None  # BI; default half of bwd_s
    bwd_weight_s: float | None = None  # W; default bwd_s - BI
    # W(-1): seconds per microbatch when the weight gradients of several are computed in one
    # batch (one matmul per layer over all of them); default: bwd_weight_s
    bwd_weight_batched_s: float | None = None
    send_act_s: float = 0.0  # moving this stage's output activation to the next stage
    send_grad_s: float = 0.0  # moving the gradient of this stage's input to the previous stage
    allreduce_s: float = 0.0  # all-reduce of this stage's gradients among its replicas
    step_s: float = 0.0  # optimizer step
    # weight stashing: a STEP whose replaced version is still used later first moves the weights
    # to fresh storage (runtime/versions.py), a copy of them (stash.steps_keeping_version)
    stash_copy_s: float = 0.0
    activation_bytes: int = 0  # kept per in-flight microbatch between forward and backward
    weight_bytes: int = 0  # one version of the stage's weights
    weight_grad_bytes: int = 0  # kept from a microbatch's BI to its W (its weighted outputs' gradients)
    weight_input_bytes: int = 0  # and the weighted ops' inputs W reads with them

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and value < 0:
                raise ScheduleError(f"{name} must be >= 0, got {value}")

    @property
    def bi_s(self) -> float:
        return self.bwd_s / 2 if self.bwd_input_s is None else self.bwd_input_s

    @property
    def w_s(self) -> float:
        return self.bwd_s - self.bi_s if self.bwd_weight_s is None else self.bwd_weight_s

    @property
    def w_batched_s(self) -> float:
        return self.w_s if self.bwd_weight_batched_s is None else self.bwd_weight_batched_s

    def scaled(self, factor: float) -> StageCosts:
        """The compute and memory of one of ``1/factor`` equal chunks of this stage."""
        return replace(
            self,
            fwd_s=self.fwd_s * factor,
            bwd_s=self.bwd_s * factor,
            bwd_input_s=None if self.bwd_input_s is None else self.bwd_input_s * factor,
            bwd_weight_s=None if self.bwd_weight_s is None else self.bwd_weight_s * factor,
            bwd_weight_batched_s=None if self.bwd_weight_batched_s is None else self.bwd_weight_batched_s * factor,
            step_s=self.step_s * factor,
            stash_copy_s=self.stash_copy_s * factor,
            activation_bytes=int(self.activation_bytes * factor),
            weight_bytes=int(self.weight_bytes * factor),
            weight_grad_bytes=int(self.weight_grad_bytes * factor),
            weight_input_bytes=int(self.weight_input_bytes * factor),
        )


def costs_uniform(
    p: int,
    fwd_s: float,
    bwd_s: float,
    *,
    comm_s: float = 0.0,
    bwd_input_s: float | None = None,
    bwd_weight_s: float | None = None,
    bwd_weight_batched_s: float | None = None,
    allreduce_s: float = 0.0,
    step_s: float = 0.0,
    activation_bytes: int = 0,
    weight_bytes: int = 0,
) -> list[StageCosts]:
    """``p`` identical stages; ``comm_s`` is the transfer time of one activation or gradient."""
    if p < 1:
        raise ScheduleError(f"stages must be >= 1, got {p}")
    one = StageCosts(
        fwd_s=fwd_s,
        bwd_s=bwd_s,
        bwd_input_s=bwd_input_s,
        bwd_weight_s=bwd_weight_s,
        bwd_weight_batched_s=bwd_weight_batched_s,
        send_act_s=comm_s,
        send_grad_s=comm_s,
        allreduce_s=allreduce_s,
        step_s=step_s,
        activation_bytes=activation_bytes,
        weight_bytes=weight_bytes,
    )
    return [one] * p


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        if not isinstance(obj, dict) and hasattr(obj, name):
            return getattr(obj, name)
    return default


def costs_from_plan(plan: Any) -> list[StageCosts]:
    """Per-stage costs of a ``pipeboard.trainer.plan`` Plan (the object, its ``to_dict()`` or its JSON dict).

    A simulated microbatch is one of the profile's minibatches, so the plan's per-minibatch times
    are used as they are: ``forward_s``, ``backward_s``, ``allreduce_s``; ``send_s`` covers the
    activation going forward and its gradient coming back, so each direction takes half.
    Memory: ``activation_bytes`` per microbatch in flight, ``parameter_bytes`` per weight version.
    """
    if hasattr(plan, "to_dict"):
        plan = plan.to_dict()
    stages = _get(plan, "stages")
    if not stages:
        raise ScheduleError("plan: field 'stages' is empty or missing")
    out = []
    for i, st in enumerate(stages):
        fwd = _get(st, "forward_s", "fwd_s")
        bwd = _get(st, "backward_s", "bwd_s")
        if fwd is None or bwd is None:
            raise ScheduleError(f"plan: stages[{i}] lacks 'forward_s'/'backward_s'")
        out.append((st, float(fwd), float(bwd)))
    costs = []
    for i, (st, fwd, bwd) in enumerate(out):
        send_out = float(_get(st, "send_s", default=0.0) or 0.0) / 2
        send_in = float(_get(out[i - 1][0], "send_s", default=0.0) or 0.0) / 2 if i > 0 else 0.0
        costs.append(
            StageCosts(
                fwd_s=fwd,
                bwd_s=bwd,
                send_act_s=send_out if i < len(out) - 1 else 0.0,
                send_grad_s=send_in,
                allreduce_s=float(_get(st, "allreduce_s", default=0.0) or 0.0),
                activation_bytes=int(_get(st, "activation_bytes", default=0) or 0),
                weight_bytes=int(_get(st, "parameter_bytes", "weight_bytes", default=0) or 0),
            )
        )
    return costs


def plan_replicas(plan: Any) -> list[int]:
    """Replicas per stage of a plan."""
    if hasattr(plan, "to_dict"):
        plan = plan.to_dict()
    return [int(_get(st, "replicas", default=1) or 1) for st in _get(plan, "stages") or []]


def data_parallel_costs_from_plan(plan: Any) -> tuple[list[StageCosts], int]:
    """The whole model on every worker, for schedule ``dp``: (one StageCosts, workers).

    The planner's ``data_parallel_time_s`` is seconds per minibatch with all ``total_workers``
    running the whole model and all-reducing after each minibatch, i.e.
    (single-worker time + all-reduce) / workers; the all-reduce is recovered from that.
    """
    if hasattr(plan, "to_dict"):
        plan = plan.to_dict()
    stages = costs_from_plan(plan)
    workers = int(_get(plan, "total_workers", default=0) or sum(plan_replicas(plan)))
    compute = sum(c.fwd_s + c.bwd_s for c in stages)
    dp_time = _get(plan, "data_parallel_time_s")
    allreduce = max(0.0, float(dp_time) * workers - compute) if dp_time is not None and workers > 1 else 0.0
    whole = StageCosts(
        fwd_s=sum(c.fwd_s for c in stages),
        bwd_s=sum(c.bwd_s for c in stages),
        allreduce_s=allreduce,
        activation_bytes=sum(c.activation_bytes for c in stages),
        weight_bytes=sum(c.weight_bytes for c in stages),
    )
    return [whole], workers
