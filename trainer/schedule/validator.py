"""Check that a schedule can run, and measure what it keeps in memory.

``validate`` replays the action lists in the strictest model a runtime may use: every action
blocks, a SEND completes only when its peer stands at the matching RECV (rendezvous, in order on
each pair of workers) and an ALLREDUCE only when all of its group stands at it. A schedule that
finishes in this model also finishes when sends are buffered or receives are posted early.
Along the way it checks every dependency (a forward after the previous stage's forward of the
same microbatch, a backward after the next stage's, W after BI), that updates are in order (STEP
versions count up by one; replicated stages all-reduce before stepping) and that forwards and
backwards use the weight version the schedule promises (weight stashing, vertical sync).

Split backwards: every BI needs its weight gradients before the stage's next update (ALLREDUCE
or STEP) and before the program ends, from its own ``W(mb)`` or from a ``W(-1)`` (the weight
gradients of every BI of the stage since its last W), which needs at least one such BI and
names the version the stage holds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

from pipeboard.trainer.schedule.actions import Action, Kind, Schedule, ScheduleError
from pipeboard.trainer.schedule.engine import gc_paused
from pipeboard.trainer.schedule.stash import memory_profile

COMPUTE = frozenset((Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT))
POINT_TO_POINT = frozenset((Kind.SEND_ACT, Kind.RECV_ACT, Kind.SEND_GRAD, Kind.RECV_GRAD))
PAIR = {Kind.SEND_ACT: (Kind.RECV_ACT, 1), Kind.SEND_GRAD: (Kind.RECV_GRAD, -1)}


@dataclass
class ValidationReport:
    workers: int
    actions: int
    peak_activations: list[int]  # per worker: (microbatch, stage) pairs with forward done, backward not
    stashed_versions: list[int]  # per worker: most weight versions held at once (max over its stages)

    def to_dict(self) -> dict:
        return asdict(self)


def _where(schedule: Schedule) -> dict[tuple[Kind, int, int], int]:
    """(kind, stage, microbatch) -> worker, checking each compute appears once on a holder of its stage."""
    where: dict[tuple[Kind, int, int], int] = {}
    for w, acts in enumerate(schedule.actions):
        held = set(schedule.workers[w].stages)
        for a in acts:
            if a.kind in COMPUTE or a.kind is Kind.STEP or a.kind is Kind.ALLREDUCE:
                if a.stage not in held:
                    raise ScheduleError(f"worker {w} runs {a} but holds stages {sorted(held)}")
            if a.kind not in COMPUTE or (a.kind is Kind.BACKWARD_WEIGHT and a.microbatch == -1):
                continue
            key = (a.kind, a.stage, a.microbatch)
            if key in where:
                raise ScheduleError(f"{a} appears twice (workers {where[key]} and {w})")
            where[key] = w
    # Each (stage, microbatch) has a forward and one backward: a full B or a BI (a schedule may
    # split some backwards and not others, as DualPipeV does; a BI's W, per microbatch or
    # batched, is checked by the replay).
    split = any(k[0] is Kind.BACKWARD_INPUT for k in where)
    full = not split or any(k[0] is Kind.BACKWARD for k in where)
    for s in range(schedule.num_stages):
        for mb in range(schedule.microbatches):
            if (Kind.FORWARD, s, mb) not in where:
                raise ScheduleError(f"missing {Kind.FORWARD.value}{mb}@s{s}: no worker runs it")
            has_full, has_half = (Kind.BACKWARD, s, mb) in where, (Kind.BACKWARD_INPUT, s, mb) in where
            if has_full and has_half:
                raise ScheduleError(f"B{mb}@s{s} and BI{mb}@s{s} both compute one input gradient")
            if not (has_full or has_half):
                kind = Kind.BACKWARD if full and not split else Kind.BACKWARD_INPUT
                raise ScheduleError(f"missing {kind.value}{mb}@s{s}: no worker runs it")
    allowed = (Kind.FORWARD,) + ((Kind.BACKWARD,) if full else ()) + ((Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT) if split else ())
    extra = [k for k in where if k[0] not in allowed or not 0 <= k[2] < schedule.microbatches]
    if extra:
        raise ScheduleError(f"unexpected compute actions, e.g. {extra[0][0].value}{extra[0][2]}@s{extra[0][1]}")
    return where


def _check_structure(schedule: Schedule) -> None:
    n = len(schedule.workers)
    if len(schedule.actions) != n:
        raise ScheduleError(f"actions has {len(schedule.actions)} lists for {n} workers")
    for w, spec in enumerate(schedule.workers):
        if spec.rank != w:
            raise ScheduleError(f"workers[{w}] has rank {spec.rank}; ranks must be 0..{n - 1} in order")
        for a in schedule.actions[w]:
            if not 0 <= a.stage < schedule.num_stages:
                raise ScheduleError(f"worker {w}: {a} names stage {a.stage} outside 0..{schedule.num_stages - 1}")
            if a.kind in POINT_TO_POINT:
                if a.peer is None or not 0 <= a.peer < n or a.peer == w:
                    raise ScheduleError(f"worker {w}: {a} has peer {a.peer}, not another worker")
            if a.kind is Kind.ALLREDUCE and (not a.group or w not in a.group):
                raise ScheduleError(f"worker {w}: {a} has group {a.group} without this worker")


class _Replay:
    """The strict (all-blocking) execution, one program counter per worker."""

    def __init__(self, schedule: Schedule, where: dict[tuple[Kind, int, int], int]) -> None:
        self.s = schedule
        self.where = where
        self.last = schedule.num_stages - 1
        self.n = len(schedule.workers)
        self.pc = [0] * self.n
        self.have: list[set[tuple[int, int, int]]] = [set() for _ in range(self.n)]
        self.done: set[tuple[Kind, int, int]] = set()
        self.version: dict[tuple[Kind, int, int], int] = {}
        self.cur = [dict.fromkeys(w.stages, 0) for w in schedule.workers]
        self.reduced = [dict.fromkeys(w.stages, False) for w in schedule.workers]
        self.vsync = bool(schedule.meta.get("vertical_sync"))
        # per worker and stage: microbatches whose BI ran and whose weight gradients did not yet
        self.pending = [{st: set() for st in w.stages} for w in schedule.workers]
        self.holders = [0] * schedule.num_stages
        for spec in schedule.workers:
            for st in spec.stages:
                self.holders[st] += 1

    def at(self, w: int) -> Action | None:
        acts = self.s.actions[w]
        return acts[self.pc[w]] if self.pc[w] < len(acts) else None

    def compute(self, w: int, a: Action) -> None:
        s, mb, k = a.stage, a.microbatch, a.kind
        if k is Kind.BACKWARD_WEIGHT and mb == -1:
            return self.batched_weights(w, a)
        if k is Kind.FORWARD:
            if s > 0 and (0, s, mb) not in self.have[w]:
                raise ScheduleError(f"worker {w}: {a} runs before its input from stage {s - 1} arrived")
            want = self.version.get((Kind.FORWARD, 0, mb)) if (self.vsync and s > 0) else self.cur[w][s]
            if a.version != want or a.version > self.cur[w][s]:
                raise ScheduleError(f"worker {w}: {a} uses weight version {a.version}, expected {want}")
            if s < self.last and self.where[(Kind.FORWARD, s + 1, mb)] == w:
                self.have[w].add((0, s + 1, mb))
        else:
            fwd = (Kind.FORWARD, s, mb)
            if fwd not in self.done:
                raise ScheduleError(f"worker {w}: {a} runs before its forward")
            if k is Kind.BACKWARD_WEIGHT:
                if (Kind.BACKWARD_INPUT, s, mb) not in self.done:
                    raise ScheduleError(f"worker {w}: {a} runs before its BI")
                if mb not in self.pending[w][s]:
                    raise ScheduleError(f"worker {w}: {a} runs after a W(-1) of stage {s} already covered it")
                self.pending[w][s].discard(mb)
            elif k is Kind.BACKWARD_INPUT:
                self.pending[w][s].add(mb)
            elif s < self.last and (1, s, mb) not in self.have[w]:
                raise ScheduleError(f"worker {w}: {a} runs before its gradient from stage {s + 1} arrived")
            if a.version != self.version[fwd]:
                raise ScheduleError(
                    f"worker {w}: {a} uses version {a.version} but its forward used {self.version[fwd]} "
                    "(weight stashing)"
                )
            if k is not Kind.BACKWARD_WEIGHT and s > 0 and self.where[(Kind.FORWARD, s - 1, mb)] == w:
                self.have[w].add((1, s - 1, mb))
        self.done.add((k, s, mb))
        self.version[(k, s, mb)] = a.version

    def batched_weights(self, w: int, a: Action) -> None:
        s = a.stage
        if not self.pending[w][s]:
            raise ScheduleError(f"worker {w}: {a} (weight gradients of every pending BI) with no BI of stage {s} pending")
        if a.version != self.cur[w][s]:
            raise ScheduleError(f"worker {w}: {a} names version {a.version}; stage {s} holds {self.cur[w][s]}")
        self.pending[w][s].clear()

    def weights_done(self, w: int, a: Action) -> None:
        """An update (or the end of the program) needs every BI's weight gradients first."""
        left = self.pending[w][a.stage]
        if left:
            raise ScheduleError(f"worker {w}: {a} comes before the weight gradients (W) of BI "
                                f"{', '.join(map(str, sorted(left)[:4]))} of stage {a.stage}")

    def step(self, w: int, a: Action) -> None:
        s = a.stage
        self.weights_done(w, a)
        if a.version != self.cur[w][s] + 1:
            raise ScheduleError(f"worker {w}: {a} produces version {a.version} after {self.cur[w][s]}")
        if self.holders[s] > 1 and not self.reduced[w][s]:
            raise ScheduleError(f"worker {w}: {a} steps a replicated stage without an all-reduce first")
        self.cur[w][s] += 1
        self.reduced[w][s] = False

    def send(self, w: int, a: Action) -> bool:
        """Try the rendezvous of a SEND; True when both sides moved on."""
        if a.kind is Kind.SEND_ACT:
            produced = (Kind.FORWARD, a.stage, a.microbatch) in self.done
        else:
            produced = any((k, a.stage, a.microbatch) in self.done for k in (Kind.BACKWARD, Kind.BACKWARD_INPUT))
        if not produced:
            raise ScheduleError(f"worker {w}: {a} sends before computing what it sends")
        recv_kind, delta = PAIR[a.kind]
        dst_stage = a.stage + delta
        if not 0 <= dst_stage <= self.last:
            raise ScheduleError(f"worker {w}: {a} sends past the end of the pipeline")
        expect = self.where[(Kind.FORWARD, dst_stage, a.microbatch)]
        if a.peer != expect:
            raise ScheduleError(f"worker {w}: {a} goes to worker {a.peer}, but worker {expect} runs its consumer")
        b = self.at(a.peer)
        if b is None or b.kind is not recv_kind or b.peer != w:
            return False  # the peer re-queues this worker when it reaches a receive from it
        if b.stage != dst_stage or b.microbatch != a.microbatch:
            raise ScheduleError(
                f"worker {w} sends {a} while worker {a.peer} waits for {b} from it: "
                "out of order, deadlock with blocking sends"
            )
        self.have[a.peer].add((0 if a.kind is Kind.SEND_ACT else 1, dst_stage, a.microbatch))
        self.advance(a.peer)
        return True

    def allreduce(self, w: int, a: Action) -> bool:
        self.weights_done(w, a)
        group = a.group or ()
        if any(not (b := self.at(m)) or b.kind is not Kind.ALLREDUCE for m in group):
            return False  # the last member to arrive completes it
        for m in group:
            b = self.at(m)
            if b.stage != a.stage or tuple(b.group or ()) != tuple(group):
                raise ScheduleError(
                    f"worker {w} all-reduces {a} group {group} while worker {m} is at {b} group {b.group}"
                )
        for m in group:
            self.reduced[m][a.stage] = True
            if m != w:
                self.advance(m)
        return True

    def advance(self, w: int) -> None:
        """Move a worker past a rendezvous another worker completed; it continues from the queue."""
        self.pc[w] += 1
        self.queue.append(w)

    def run(self) -> None:
        # A worker that reaches a RECV re-queues its sender, which may be parked at the SEND;
        # the last member to reach an ALLREDUCE completes it. So nobody needs a wake-up list.
        self.queue = deque(range(self.n))
        while self.queue:
            w = self.queue.popleft()
            while (a := self.at(w)) is not None:
                if a.kind in COMPUTE:
                    self.compute(w, a)
                elif a.kind is Kind.STEP:
                    self.step(w, a)
                elif a.kind in PAIR:
                    if not self.send(w, a):
                        break
                elif a.kind is Kind.ALLREDUCE:
                    if not self.allreduce(w, a):
                        break
                else:  # a RECV: its sender moves both sides, so wake the sender if it waits at a send
                    b = self.at(a.peer)
                    if b is not None and b.kind in PAIR and b.peer == w:
                        self.queue.append(a.peer)
                    break
                self.pc[w] += 1
        stuck = [w for w in range(self.n) if self.at(w) is not None]
        if stuck:
            where = "; ".join(f"worker {w} at {self.at(w)} (peer {self.at(w).peer})" for w in stuck[:4])
            raise ScheduleError(f"deadlock with blocking sends: {where}")
        for w in range(self.n):
            for s, left in self.pending[w].items():
                if left:
                    raise ScheduleError(f"worker {w}: BI {', '.join(map(str, sorted(left)[:4]))} of stage {s} "
                                        "never get their weight gradients (no W after them)")


def validate(schedule: Schedule) -> ValidationReport:
    """Raise ScheduleError on a broken dependency or possible deadlock; report memory."""
    with gc_paused():
        _check_structure(schedule)
        where = _where(schedule)
        _Replay(schedule, where).run()
        activations, versions = memory_profile(schedule)
    return ValidationReport(
        workers=len(schedule.workers),
        actions=sum(len(a) for a in schedule.actions),
        peak_activations=activations,
        stashed_versions=versions,
    )
