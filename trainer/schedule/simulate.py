"""Discrete-event simulation of a schedule: the predicted timeline of its action lists.

The model is the runtime the action lists are written for:
- a worker runs its list in order; computes, steps and all-reduces occupy it;
- a SEND is posted without blocking the worker; a RECV posts a receive without blocking; a
  transfer starts once both are posted and takes the stage's send time; the compute that needs
  the data waits for it to arrive (pre-posted receives overlap transfers with compute);
- transfers do not contend (full-duplex links, one per pair of workers);
- an ALLREDUCE starts when its whole group has reached it and takes the stage's all-reduce time.

The simulation walks each worker's list as far as it can and parks it on the first input that
has not been produced yet; producing that input wakes it. Every action is handled once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.schedule.actions import Kind, Schedule, ScheduleError, TimelineEvent
from trainer.schedule.costs import StageCosts
from trainer.schedule.stash import memory_profile
from trainer.schedule.stats import summarize

# integer codes keep the inner loop cheap
F, B, BI, W, SA, RA, SG, RG, AR, ST = range(10)
CODE = {
    Kind.FORWARD: F, Kind.BACKWARD: B, Kind.BACKWARD_INPUT: BI, Kind.BACKWARD_WEIGHT: W,
    Kind.SEND_ACT: SA, Kind.RECV_ACT: RA, Kind.SEND_GRAD: SG, Kind.RECV_GRAD: RG,
    Kind.ALLREDUCE: AR, Kind.STEP: ST,
}  # fmt: skip
NAME = {code: kind.value for kind, code in CODE.items()}


@dataclass
class SimResult:
    timeline: list[TimelineEvent]
    iteration_time_s: float  # makespan of the schedule (all its microbatches / minibatches)
    throughput: float  # microbatches per second over the iteration
    throughput_unit: str
    bubble_fraction: float  # idle share of worker-time within the iteration, averaged over workers
    utilization: list[float]  # per worker: share of the iteration spent in F/B/BI/W
    peak_activations: list[int]  # per worker, in-flight (microbatch, stage) pairs
    stashed_versions: list[int]  # per worker, weight versions held at once
    peak_memory_bytes: list[int] | None  # per worker, when the costs give bytes
    steady_bubble_fraction: float | None  # idle share once every worker runs 1F1B, before the drain
    samples_per_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Everything but the timeline, JSON-ready."""
        d = {k: v for k, v in self.__dict__.items() if k not in ("timeline", "extra")}
        return d | self.extra


def stage_costs(schedule: Schedule, costs: list[StageCosts]) -> list[StageCosts]:
    """One StageCosts per virtual stage; physical-stage costs are split evenly over chunks."""
    n = schedule.num_stages
    if len(costs) == n:
        return list(costs)
    p = schedule.meta.get("physical_stages", n)
    chunks = schedule.meta.get("chunks", 1)
    if chunks > 1 and len(costs) == p and p * chunks == n:
        return [costs[j % p].scaled(1 / chunks) for j in range(n)]
    raise ScheduleError(f"costs list {len(costs)} stages; the schedule has {n} (or {p} with chunks)")


def _durations(costs: list[StageCosts]) -> list[list[float]]:
    """dur[stage][code]."""
    return [
        [c.fwd_s, c.bwd_s, c.bi_s, c.w_s, c.send_act_s, 0.0, c.send_grad_s, 0.0, c.allreduce_s, c.step_s]
        for c in costs
    ]


def _run(schedule: Schedule, dur: list[list[float]]):
    """Core loop. Returns per-worker lists of (code, stage, mb, start, end) and the transfers."""
    S, M = schedule.num_stages, schedule.microbatches
    nw = len(schedule.actions)
    # data key: (mb * S + receiving stage) * 2 + is_grad
    nkeys = 2 * S * max(M, 1)
    send_post: list[float | None] = [None] * nkeys
    recv_post: list[float | None] = [None] * nkeys
    arrival: list[float | None] = [None] * nkeys
    sender: list[int] = [0] * nkeys
    parked: dict[int, int] = {}  # key -> worker waiting for it
    progs = []
    for acts in schedule.actions:
        prog, received = [], set()
        for a in acts:
            c, s, mb = CODE[a.kind], a.stage, a.microbatch
            key = -1
            if c == RA:
                key = (mb * S + s) * 2
                received.add(key)
            elif c == RG:
                key = (mb * S + s) * 2 + 1
                received.add(key)
            elif c == SA:
                key = (mb * S + s + 1) * 2
            elif c == SG:
                key = (mb * S + s - 1) * 2 + 1
            elif c == F:
                k = (mb * S + s) * 2
                key = k if k in received else -1
            elif c == B or c == BI:
                k = (mb * S + s) * 2 + 1
                key = k if k in received else -1
            elif c == AR:
                key = len(a.group or ())
            prog.append((c, s, mb, key, dur[s][c]))
        progs.append(prog)
    clock = [0.0] * nw
    pc = [0] * nw
    out: list[list[tuple]] = [[] for _ in range(nw)]
    transfers: list[tuple] = []
    collective: dict[tuple[int, int], list[int]] = {}
    ar_seen: dict[tuple[int, int], int] = {}
    ready = list(range(nw - 1, -1, -1))

    def complete(key: int) -> None:
        sp, rp = send_post[key], recv_post[key]
        start = sp if sp > rp else rp
        c = (key & 1) and SG or SA
        src = sender[key]
        stage = (key >> 1) % S + (1 if key & 1 else -1)  # the sender's stage
        d = dur[stage][c]
        arrival[key] = start + d
        if d > 0:
            transfers.append((src, c, stage, (key >> 1) // S, start, start + d))
        w = parked.pop(key, None)
        if w is not None:
            ready.append(w)

    while ready:
        w = ready.pop()
        prog, ev, t, i, n = progs[w], out[w], clock[w], pc[w], len(progs[w])
        while i < n:
            c, s, mb, key, d = prog[i]
            if c <= W:
                if key >= 0:
                    a = arrival[key]
                    if a is None:
                        parked[key] = w
                        break
                    if a > t:
                        t = a
                ev.append((c, s, mb, t, t + d))
                t += d
            elif c == SA or c == SG:
                send_post[key] = t
                sender[key] = w
                if recv_post[key] is not None:
                    complete(key)
            elif c == RA or c == RG:
                recv_post[key] = t
                if send_post[key] is not None:
                    complete(key)
            elif c == ST:
                ev.append((c, s, mb, t, t + d))
                t += d
            else:  # ALLREDUCE: the last member to arrive releases the group
                occ = ar_seen.get((w, s), 0)
                ar_seen[(w, s)] = occ + 1
                members = collective.setdefault((s, occ), [])
                members.append(w)
                clock[w], pc[w] = t, i
                if len(members) < key:
                    i = -1  # parked until the group is complete
                    break
                del collective[(s, occ)]
                begin = max(clock[m] for m in members)
                for m in members:
                    out[m].append((c, s, mb, begin, begin + d))
                    clock[m], pc[m] = begin + d, pc[m] + 1
                    if m != w:
                        ready.append(m)
                t, i = clock[w], pc[w]
                continue
            i += 1
        if i >= 0:
            clock[w], pc[w] = t, i
    stuck = [w for w in range(nw) if pc[w] < len(progs[w])]
    if stuck:
        raise ScheduleError(f"simulation stalled: workers {stuck[:8]} wait for data never sent (run validate)")
    return out, transfers


def simulate(schedule: Schedule, costs: list[StageCosts], *, samples_per_microbatch: int | None = None) -> SimResult:
    """Predict the timeline of ``schedule`` under per-stage ``costs``."""
    per_stage = stage_costs(schedule, costs)
    out, transfers = _run(schedule, _durations(per_stage))
    sync = schedule.meta.get("sync", True)
    timeline = []
    for w, evs in enumerate(out):
        replica = schedule.workers[w].replica
        last_mb = 0
        for c, s, mb, start, end in evs:
            if mb >= 0:
                last_mb = mb
            timeline.append(TimelineEvent(w, s, replica, mb, NAME[c], start, end, 0 if sync else last_mb))
    for src, c, s, mb, start, end in transfers:
        timeline.append(TimelineEvent(src, s, schedule.workers[src].replica, mb, NAME[c], start, end, 0 if sync else mb))
    stats = summarize(timeline, len(schedule.workers))
    activations, versions = memory_profile(schedule)
    memory = _peak_memory(schedule, per_stage, activations, versions)
    makespan = stats.makespan_s
    throughput = schedule.microbatches / makespan if makespan > 0 else float("inf")
    return SimResult(
        timeline=timeline,
        iteration_time_s=makespan,
        throughput=throughput,
        throughput_unit="microbatches/s",
        bubble_fraction=stats.bubble_fraction,
        utilization=stats.utilization,
        peak_activations=activations,
        stashed_versions=versions,
        peak_memory_bytes=memory,
        steady_bubble_fraction=stats.steady_bubble_fraction,
        samples_per_s=None if samples_per_microbatch is None else throughput * samples_per_microbatch,
        extra={"schedule": schedule.name, "workers": len(schedule.workers), "microbatches": schedule.microbatches},
    )


def _peak_memory(schedule: Schedule, per_stage: list[StageCosts], activations: list[int], versions: list[int]):
    """Upper bound per worker: peak in-flight activations plus peak stashed weight versions."""
    if not any(c.activation_bytes or c.weight_bytes for c in per_stage):
        return None
    out = []
    for spec, acts, vers in zip(schedule.workers, activations, versions):
        act = max(per_stage[s].activation_bytes for s in spec.stages)
        weights = sum(per_stage[s].weight_bytes for s in spec.stages)
        out.append(acts * act + vers * weights)
    return out
