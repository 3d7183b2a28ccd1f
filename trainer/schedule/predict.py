"""Predicted seconds per training step of a pipeline, from the model's profile(s).

``predict_step_s(profile, stages, schedule, microbatches, ...)`` turns a profile into one
``StageCosts`` per stage (``stage_costs``), builds the schedule and simulates it in steady state.

Where each cost comes from (profile times are per minibatch of the profile's ``batch_size``,
which must be the microbatch size here):

- ``fwd_s``, ``bwd_s``: the stage's layers' ``forward_ms`` and ``backward_ms`` summed;
- ``bwd_input_s``: their ``backward_input_ms`` (input gradients only); the weight gradients
  are the rest of the backward;
- ``bwd_weight_batched_s`` (W(-1), batched weight gradients): the weight-gradient part of the
  backward measured at the whole batch (``batch_profile``, profiled at microbatches x the
  microbatch size: W(-1) is one matmul per layer over all the microbatches' rows), per microbatch;
- ``step_s``: the layers' ``optimizer_ms`` summed; ``stash_copy_s`` (with ``overhead``): weight
  stashing's copy of the stage's weights, charged to the steps that keep the version they replace
  (``stash_copy_ms``);
- transfers, from the measured ``link`` (the argument, else the profile's): a stage's output
  activation (and, backwards, its gradient, of the same size) takes ``latency + bytes /
  bandwidth``; posting a send occupies the sender for ``post_ms``, charged to the compute that
  precedes every send (F before SEND_ACT; BI, or B, before SEND_GRAD);
- ``allreduce_s`` (replicas > 1): a ring all-reduce of the stage's parameters (``Link.allreduce_ms``:
  from the link's measured two-process all-reduce where it has one, else 2 (r - 1) / r of their
  bytes each way plus 2 (r - 1) point-to-point latencies).

- the profile's ``pilot`` (optional): a pilot run's factor per kind of action, the runtime's time
  between actions and a replicated stage's wait in the all-reduce (``pipeboard.trainer.runtime.pilot``),
  applied to every cost above, the replicated pilot's to replicated stages. Pilots run batched weight
  gradients, so they measure BI and W, not a whole B: a B (data parallelism's, an unsplit run's) is
  its input-gradient part times BI's factor plus the rest times W's (BI's factor on the whole B
  over-charged data parallelism where the two factors differ: docs/planner.md has the measurement);

- ``overhead`` (optional, per stage): what the runtime adds to each action beyond the compute
  the profile measures (its Python bookkeeping, the loss on the last stage), measured by the
  caller, e.g. ``bench/predict.py``'s tiny-stage measurement, or ``profile_overhead`` from the
  profile's own ``overhead`` calibration (``pipeboard.trainer.runtime.overhead.calibrate``); and
  W's own cost per microbatch for each parameterised layer that is not a plain Linear (W takes
  those one layer and one microbatch at a time); outside the actions: the executor's walk past
  each action (charged to every compute action, send and step) and, once per step on the step,
  the executor's set-up, the step report and the stage's data loading.

A missing measurement (an old profile) counts as zero, except ``backward_input_ms``, which then
takes the simulator's default (half the backward).

Steady state: a synchronous schedule's step is the difference between simulating K and 1
iterations back to back (the runtime walks the same list every step, so iteration k + 1's first
forwards overlap iteration k's drain), divided by K - 1; an asynchronous one's (pipedream) is the
difference between runs of K and 1 batches of ``microbatches``, divided by K - 1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeboard.trainer.profile.calibration_records import Link
from pipeboard.trainer.profile.schema import Profile
from pipeboard.trainer.schedule import registry
from pipeboard.trainer.schedule.actions import Schedule, ScheduleError
from pipeboard.trainer.schedule.builder import build
from pipeboard.trainer.schedule.action_costs import StageCosts
from pipeboard.trainer.schedule.simulator import simulate

STEADY_ITERATIONS = 4


@dataclass(frozen=True)
class ActionOverhead:
    """Seconds the runtime adds to one action of a stage beyond the profiled compute."""

    forward_s: float = 0.0
    backward_s: float = 0.0  # a full backward (B)
    backward_input_s: float = 0.0  # BI
    weight_call_s: float = 0.0  # one W(-1) call, whatever the number of microbatches it covers
    step_s: float = 0.0
    executor_s: float = 0.0  # the executor's walk past each action it runs (sends included)
    weight_per_microbatch_s: float = 0.0  # W's own cost per microbatch beyond one call (non-Linear layers)
    per_step_s: float = 0.0  # once per step: the executor's set-up, the step report, loading data


def _layers(profile: Profile, stage: list[str], k: int):
    by_name = {layer.name: layer for layer in profile.layers}
    missing = [n for n in stage if n not in by_name]
    if missing:
        raise ScheduleError(f"stage {k}: layer(s) {missing[:4]} are not in the profile of {profile.model!r}")
    return [by_name[n] for n in stage]


def profile_overhead(profile: Profile, stages: list[list[str]]) -> list[ActionOverhead] | None:
    """Per-stage ActionOverhead from the profile's ``overhead`` calibration (None without one):
    each stage's count of parameterised layers (``parameter_bytes`` > 0, at least 1), the last
    stage with the loss."""
    if profile.overhead is None:
        return None
    o = profile.overhead
    out = []
    for k, stage in enumerate(stages):
        layers = _layers(profile, stage, k)
        n = max(1, sum(1 for layer in layers if layer.parameter_bytes > 0))
        # W computes these one layer and one microbatch at a time (a Linear: one matmul for all)
        generic = sum(1 for layer in layers if layer.parameter_bytes > 0 and not layer.desc.startswith("Linear("))
        ms = o.at(n, k == len(stages) - 1)
        # the first stage loads inputs and targets (all of a one-stage model's data), the last targets
        load = (o.load_first_ms if k == 0 else o.load_last_ms if k == len(stages) - 1 else 0.0) or 0.0
        out.append(ActionOverhead(forward_s=ms["forward_ms"] / 1e3, backward_s=ms["backward_ms"] / 1e3,
                                  backward_input_s=ms["backward_input_ms"] / 1e3,
                                  weight_call_s=ms["weight_call_ms"] / 1e3, step_s=ms["step_ms"] / 1e3,
                                  executor_s=o.executor_action_ms / 1e3, per_step_s=(o.executor_step_ms + load) / 1e3,
                                  weight_per_microbatch_s=generic * o.generic_weight_ms / 1e3))
    return out


def kept_bytes(layers, output_bytes: float) -> dict[str, int]:
    """What one microbatch keeps on a stage of ``layers`` (profile layers), as StageCosts and
    StageMemory name it: ``activation_bytes`` until its backward, what autograd saved in the
    layers (``saved_bytes``) and the stage's output, held for the gradient that comes back (on the
    last stage, its model output: the size of what the loss saves from the logits); from a
    profile without saved bytes, the layers' outputs stand in. ``weight_grad_bytes`` and
    ``weight_input_bytes``: what a split or batched weight pass keeps from BI to W."""
    if any(layer.saved_bytes is None for layer in layers):
        activation = sum(layer.activation_total for layer in layers)
    else:
        activation = sum(layer.saved_bytes for layer in layers) + output_bytes
    return {"activation_bytes": int(activation),
            "weight_grad_bytes": int(sum(layer.weight_grad_bytes or 0.0 for layer in layers)),
            "weight_input_bytes": int(sum(layer.weight_input_bytes or 0.0 for layer in layers))}


def stage_output_bytes(profile: Profile, stages: list[list[str]]) -> list[float]:
    """Bytes of each stage's output a microbatch holds for its backward: what leaves for later
    stages, and on the last stage its last layer's output (the model's)."""
    out = _boundary_bytes(profile, stages)
    if stages and stages[-1]:
        out[-1] = _layers(profile, stages[-1], len(stages) - 1)[-1].activation_total
    return out


def _boundary_bytes(profile: Profile, stages: list[list[str]]) -> list[float]:
    """Bytes leaving stage k for later stages, per microbatch (each producer counted once)."""
    where = {n: k for k, st in enumerate(stages) for n in st}
    by_name = {layer.name: layer for layer in profile.layers}
    out = [0.0] * len(stages)
    counted: set[str] = set()
    for a, b in profile.edges:
        ka, kb = where.get(a), where.get(b)
        if ka is not None and kb is not None and kb > ka and a not in counted:
            counted.add(a)
            out[ka] += by_name[a].activation_total
    return out


def stage_costs(
    profile: Profile,
    stages: list[list[str]],
    *,
    microbatches: int = 1,
    batch_profile: Profile | None = None,
    link: Link | None = None,
    replicas: list[int] | None = None,
    overhead: list[ActionOverhead] | None = None,
    pilot: bool = True,
) -> list[StageCosts]:
    """One StageCosts per stage (layer names per stage) from the microbatch profile; see the
    module docstring for where each field comes from. ``pilot``: apply the profile's pilot runs
    (when it has them; ``pipeboard.trainer.runtime.pilot`` measures them with ``pilot=False``)."""
    if batch_profile is not None and None not in (profile.batch_size, batch_profile.batch_size):
        if batch_profile.batch_size != profile.batch_size * microbatches:
            raise ScheduleError(f"batch_profile is for {batch_profile.batch_size} samples; W(-1) batches "
                                f"{microbatches} microbatches of {profile.batch_size}")
    link = link if link is not None else profile.link
    replicas = replicas or [1] * len(stages)
    if len(replicas) != len(stages):
        raise ScheduleError(f"replicas: {len(replicas)} counts for {len(stages)} stages")
    if overhead is not None and len(overhead) != len(stages):
        raise ScheduleError(f"overhead: {len(overhead)} entries for {len(stages)} stages")
    # the profile's own batched weight-gradient times count only for the batch they were measured at
    own_batched = (profile.weight_batch_size is not None and profile.batch_size is not None
                   and profile.weight_batch_size == profile.batch_size * microbatches)
    out_bytes = _boundary_bytes(profile, stages)
    last = len(stages) - 1
    longest = profile.at_longest()  # lengths that vary: time is the expected cost, memory the longest's
    kept_out = stage_output_bytes(longest, stages)
    costs = []
    for k, stage in enumerate(stages):
        layers = _layers(profile, stage, k)
        fwd = sum(layer.forward_ms for layer in layers)
        bwd = sum(layer.backward_ms for layer in layers)
        # a layer with no backward (a model input) has nothing to split
        split = all(layer.backward_input_ms is not None or layer.backward_ms == 0 for layer in layers)
        bi = sum(layer.backward_input_ms or 0.0 for layer in layers) if split else None
        w_batched = None
        if batch_profile is not None:
            big = _layers(batch_profile, stage, k)
            if all(layer.backward_weight_ms is not None for layer in big):
                w_batched = sum(layer.backward_weight_ms for layer in big) / microbatches
        elif own_batched and all(layer.weight_batched_ms is not None or not layer.parameter_bytes for layer in layers):
            # a layer without parameters has no weight gradient to compute in W(-1)
            w_batched = sum(layer.weight_batched_ms or 0.0 for layer in layers if layer.parameter_bytes) / microbatches
        step = sum(layer.optimizer_ms or 0.0 for layer in layers)
        send_act = send_grad = allreduce = 0.0
        if link is not None:
            if k < last:
                send_act = link.transfer_ms(out_bytes[k])
                fwd += link.post_ms
            if k > 0:
                send_grad = link.transfer_ms(out_bytes[k - 1])
                bwd += link.post_ms
                bi = None if bi is None else bi + link.post_ms
            allreduce = link.allreduce_ms(sum(layer.parameter_bytes for layer in layers), replicas[k])
        w = None if bi is None else max(0.0, bwd - bi)
        if overhead is not None:
            o = overhead[k]
            ex = o.executor_s * 1e3
            # each compute action, the sends after it (F then SEND_ACT, B or BI then SEND_GRAD) and
            # the step are one executor walk each; a W(-1) is one call for all the microbatches
            sends_act, sends_grad = ex * (k < last), ex * (k > 0)
            fwd += o.forward_s * 1e3 + ex + sends_act
            step += o.step_s * 1e3 + ex + o.per_step_s * 1e3
            if bi is not None:
                bi += o.backward_input_s * 1e3 + ex + sends_grad
                # B = BI + W in compute; a split W is an action of its own, walked once more
                w = w + max(0.0, o.backward_s - o.backward_input_s) * 1e3 + ex + o.weight_per_microbatch_s * 1e3
            bwd += o.backward_s * 1e3 + ex + sends_grad
            if w_batched is not None:
                w_batched += (o.weight_call_s * 1e3 + ex) / microbatches + o.weight_per_microbatch_s * 1e3
            if allreduce:
                allreduce += ex
        run = profile.pilot.kind(replicas[k]) if pilot and profile.pilot is not None else None
        if run is not None:  # what the pilot run measured beyond these, per kind of action
            f, gap = run.factors, run.gaps_ms
            fwd = fwd * f.get("forward", 1.0) + gap
            f_w = f.get("weight", f.get("weight_batched", 1.0))
            if "backward" in f or bi is None:
                bwd = bwd * f.get("backward", f.get("backward_input", 1.0)) + gap
            else:  # pilots split the backward: a whole B is the same work, each part corrected by its own factor
                bwd = bi * f.get("backward_input", 1.0) + (bwd - bi) * f_w + gap
            bi = None if bi is None else bi * f.get("backward_input", 1.0) + gap
            w = None if w is None else w * f_w + gap
            if w_batched is not None:
                w_batched = w_batched * f.get("weight_batched", 1.0) + gap / microbatches
            step *= f.get("step", 1.0)
            if allreduce and run.allreduce_wait_ms:
                allreduce += run.allreduce_wait_ms
        kept_layers = layers if longest is profile else _layers(longest, stage, k)  # memory: the longest's
        weight_bytes = int(sum(layer.parameter_bytes for layer in layers))
        costs.append(StageCosts(
            fwd_s=fwd / 1e3, bwd_s=bwd / 1e3,
            bwd_input_s=None if bi is None else bi / 1e3,
            bwd_weight_s=None if w is None else w / 1e3,
            bwd_weight_batched_s=None if w_batched is None else w_batched / 1e3,
            send_act_s=send_act / 1e3, send_grad_s=send_grad / 1e3, allreduce_s=allreduce / 1e3,
            step_s=step / 1e3, stash_copy_s=stash_copy_ms(profile, weight_bytes) / 1e3 if overhead is not None else 0.0,
            **kept_bytes(kept_layers, kept_out[k]),
            weight_bytes=weight_bytes,
        ))
    return costs


def stash_copy_ms(profile: Profile, weight_bytes: int) -> float:
    """What weight stashing's copy of ``weight_bytes`` of a stage's weights costs a step that keeps
    the version it replaces, from the profile's calibration (``Overhead.stash_copy``). Plain SGD
    writes its update to the fresh storage directly (runtime/versions.py ``sgd_out_of_place``): no
    copy."""
    if profile.overhead is None or str(profile.meta.get("optimizer", "")).lower() == "sgd":
        return 0.0
    return profile.overhead.stash_copy_ms(weight_bytes)


def recomputed(c: StageCosts, forward_s: float | None = None, first: bool = False) -> StageCosts:
    """A stage's costs under activation recompute, as the runtime (trainer/runtime/stage.py) runs it.

    ``forward_s``: the replayed forward (default ``c.fwd_s``). A full backward (B) first replays
    the forward through torch.utils.checkpoint: it costs one forward more. A weight-gradient pass
    (W) of a recomputing stage cannot reuse the BI's graph (it let it go, that is the memory
    recompute saves): it replays the forward from the kept inputs and backpropagates to the
    weights, which runs the interior input gradients again, so it costs a forward, a BI and a W;
    a batched W(-1) replays one microbatch at a time, so it is no cheaper per microbatch. An
    input-gradient backward (BI) replays the forward and computes the input gradients, except on
    the ``first`` stage, whose inputs (the data) want none: there it computes nothing, and W does
    all of the backward."""
    f = c.fwd_s if forward_s is None else forward_s
    w = f + c.bi_s + c.w_s
    return replace(c, bwd_s=c.bwd_s + f, bwd_input_s=0.0 if first else c.bi_s + f, bwd_weight_s=w,
                   bwd_weight_batched_s=w)


def recomputed_costs(costs: list[StageCosts], redo) -> list[StageCosts]:
    """``costs`` (one per virtual stage, the first first) with the stages listed in ``redo``
    recomputing (``recomputed``)."""
    out = list(costs)
    for st in set(redo or ()):
        out[st] = recomputed(out[st], first=st == 0)
    return out


def repeat_iterations(schedule: Schedule, k: int) -> Schedule:
    """``k`` iterations of a synchronous schedule back to back on each worker, as the runtime
    runs them: microbatches and weight versions numbered on."""
    m = schedule.microbatches
    actions = [[replace(a, microbatch=a.microbatch + i * m if a.microbatch >= 0 else a.microbatch, version=a.version + i)
                for i in range(k) for a in acts] for acts in schedule.actions]
    return Schedule(schedule.name, schedule.num_stages, m * k, schedule.workers, actions, schedule.meta)


def _schedule(name: str, p: int, microbatches: int, batches: int, replicas, batch_weight_grads: bool,
              chunks: int) -> Schedule:
    spec = registry.get(name)
    if not spec.synchronous:  # microbatches in total, one update per batch of them
        return build(name, p, microbatches * batches, replicas=replicas, batch_weight_grads=batch_weight_grads,
                     per_update=microbatches)
    if spec.data_parallel:  # one stage on the first count's workers
        p, replicas = 1, [replicas[0] if replicas else 1]
    one = build(name, p, microbatches, replicas=replicas, chunks=chunks, batch_weight_grads=batch_weight_grads)
    return repeat_iterations(one, batches)


def predict_step_s(
    profile: Profile,
    stages: list[list[str]],
    schedule: str,
    microbatches: int,
    *,
    batch_profile: Profile | None = None,
    batch_weight_grads: bool = False,
    replicas: list[int] | None = None,
    link: Link | None = None,
    chunks: int = 1,
    overhead: list[ActionOverhead] | None = None,
    length: float | None = None,
) -> float:
    """Predicted seconds per step (one batch: ``microbatches`` microbatches of the profile's
    batch size) of ``schedule`` over ``stages`` (layer names per stage, one entry per physical
    stage, or per virtual stage for interleaved-1f1b), in steady state. ``pipedream`` updates
    once per batch (``microbatches=1``: PipeDream's one update per minibatch).
    ``batch_weight_grads``: each backward is BI and one W(-1) precedes each update (costed from
    ``batch_profile`` when given). ``replicas``: workers per stage; ``link``: overrides the
    profile's measured link; ``overhead``: the runtime's own cost per action, per stage.
    ``length``: a step whose batch is padded to that length, from the layers' costs at it
    (``Profile.at_length``; the profile must have been measured at several lengths); without it,
    the profile's layers (for a profile with lengths, the expected costs over its data's lengths)."""
    if microbatches < 1:
        raise ScheduleError(f"microbatches must be >= 1, got {microbatches}")
    if length is not None:
        if profile.lengths is None:
            raise ScheduleError(f"length: the profile of {profile.model!r} was measured at one length")
        profile = profile.at_length(length)
        if batch_profile is not None and batch_profile.lengths is not None:
            batch_profile = batch_profile.at_length(length)
    costs = stage_costs(profile, stages, microbatches=microbatches, batch_profile=batch_profile, link=link,
                        replicas=None if replicas is None or chunks > 1 else replicas, overhead=overhead)
    return steady_step_s(costs, schedule, microbatches, batch_weight_grads=batch_weight_grads, replicas=replicas,
                         chunks=chunks)


def steady_step_s(costs: list[StageCosts], schedule: str, microbatches: int, *, batch_weight_grads: bool = False,
                  replicas: list[int] | None = None, chunks: int = 1, cores: int | None = None,
                  build_schedule=None) -> float:
    """The simulator's steady-state seconds per step of ``schedule`` under ``costs`` (one per
    physical stage, or per virtual stage for interleaved-1f1b); see the module docstring.
    ``cores``: the cores the workers share; with more workers than cores a step takes at least
    every worker's busy time per step spread over the cores (the simulator gives each worker a
    core of its own). ``build_schedule``: what builds the simulated schedules (the arguments of
    ``_schedule``), for a caller that reuses them across many costs (the tuner)."""
    build_schedule = build_schedule or _schedule
    p = len(costs) // chunks
    one = simulate(build_schedule(schedule, p, microbatches, 1, replicas, batch_weight_grads, chunks), costs)
    more = simulate(build_schedule(schedule, p, microbatches, STEADY_ITERATIONS, replicas, batch_weight_grads, chunks),
                    costs)
    step = (more.iteration_time_s - one.iteration_time_s) / (STEADY_ITERATIONS - 1)
    workers = more.extra["workers"]
    if cores is not None and 0 < cores < workers:
        def busy(r):  # every worker's time in actions, summed
            return (1.0 - r.bubble_fraction) * r.iteration_time_s * workers

        step = max(step, (busy(more) - busy(one)) / (STEADY_ITERATIONS - 1) / cores)
    return step
