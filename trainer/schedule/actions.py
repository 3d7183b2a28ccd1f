"""A pipeline schedule as data: an ordered list of actions per worker.

This is the one representation that three consumers share: the simulator gives each action a
predicted start and end, the runtime executes the same actions in the same order, and the
dashboard draws the resulting timelines. A new schedule is one file: a builder (a function that
writes each worker's list of actions) and one ``register`` call declaring what it can do
(registry.py); ``build``, the runtime, the simulator, the API, the CLI and the dashboard read the
registry, so nothing else changes (docs/schedules.md, "Adding a schedule").

Conventions
- A *worker* is one process (one stage replica). ``Schedule.workers[w]`` says which stage(s) it
  holds and which replica of them it is. With interleaving a worker holds several model chunks,
  so actions carry the *virtual* stage they belong to (``stage``), 0 ... num_stages-1.
- ``microbatch`` numbers microbatches within an iteration (sync schedules) or minibatches
  globally (``pipedream``, ``dp``); -1 for actions not tied to one (``STEP``, ``ALLREDUCE``).
- ``version`` is the weight version the action uses: for ``F``/``B``/``W`` the version it runs
  against (weight stashing: a backward names the version its forward used), for ``STEP`` the
  version it produces.
- Communication actions name the peer worker. A ``SEND_*`` is posted asynchronously; the matching
  ``RECV_*`` on the peer completes when the data has arrived. ``ALLREDUCE`` is collective over
  ``group`` (the workers holding replicas of ``stage``).
- ``stage`` on a transfer is the acting worker's own stage: SEND_ACT(s) sends stage s's output,
  RECV_ACT(s) receives stage s's input, SEND_GRAD(s) sends the gradient of s's input back,
  RECV_GRAD(s) receives the gradient of s's output.
- A runtime may post each RECV when it reaches it and wait only when the consuming compute comes
  up; the lists also run when every send and receive blocks (see docs/schedules.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class ScheduleError(ValueError):
    """A schedule that cannot run: bad arguments, a broken dependency, or a possible deadlock."""


class Kind(str, Enum):
    FORWARD = "F"
    BACKWARD = "B"  # full backward: input and weight gradients together
    BACKWARD_INPUT = "BI"  # zero bubble: gradient w.r.t. the stage input only
    BACKWARD_WEIGHT = "W"  # zero bubble: gradient w.r.t. the weights, deferred
    SEND_ACT = "send_act"
    RECV_ACT = "recv_act"
    SEND_GRAD = "send_grad"
    RECV_GRAD = "recv_grad"
    ALLREDUCE = "allreduce"
    STEP = "step"  # optimizer step (weight update)

    @property
    def is_compute(self) -> bool:
        return self in _COMPUTE

    @property
    def is_comm(self) -> bool:
        return self in _COMM


_COMPUTE = frozenset((Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT))
_COMM = frozenset((Kind.SEND_ACT, Kind.RECV_ACT, Kind.SEND_GRAD, Kind.RECV_GRAD, Kind.ALLREDUCE))


@dataclass(slots=True, unsafe_hash=True)
class Action:
    """One step of one worker's program. A value: compared and hashed by its fields, and never
    changed once made (not ``frozen``: a frozen dataclass is built through ``object.__setattr__``,
    three times slower, and a schedule of 64 stages x 1,024 microbatches makes half a million)."""

    kind: Kind
    stage: int
    microbatch: int = -1
    version: int = 0
    peer: int | None = None
    group: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": self.kind.value, "stage": self.stage, "microbatch": self.microbatch, "version": self.version}
        if self.peer is not None:
            d["peer"] = self.peer
        if self.group is not None:
            d["group"] = list(self.group)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Action:
        group = d.get("group")
        return cls(
            kind=Kind(d["kind"]),
            stage=int(d["stage"]),
            microbatch=int(d.get("microbatch", -1)),
            version=int(d.get("version", 0)),
            peer=d.get("peer"),
            group=tuple(group) if group is not None else None,
        )

    def __str__(self) -> str:  # compact, for logs and test failures: "F3@s1v2"
        mb = "" if self.microbatch < 0 else str(self.microbatch)
        return f"{self.kind.value}{mb}@s{self.stage}v{self.version}"


@dataclass(frozen=True, slots=True)
class OverlapFB:
    """A forward and a backward one worker may run at the same time (torch's ``OVERLAP_F_B``,
    written ``(0F3;3B1)OVERLAP_F_B``; DualPipeV's pairs): one element of a builder's program.

    ``build`` writes it into the worker's list as its two actions, the forward first, and notes
    the pair in ``meta["overlap_f_b"]`` (per worker, ``[forward stage, forward microbatch,
    backward stage, backward microbatch]``), so every consumer of the lists runs it as it is: the
    runtime in sequence, the validator and the memory walk as two actions. The simulator times
    the pair overlapped (the backward may start with the forward, the worker is free when both
    have ended) when asked to, ``simulate(..., overlap_f_b=True)``, and in sequence otherwise;
    pipeboard's runtime runs a pair's two halves one after the other on every device (one
    thread, one stream), so its own predictions time them in sequence.
    """

    forward: Action
    backward: Action

    def __post_init__(self) -> None:
        if self.forward.kind is not Kind.FORWARD or self.backward.kind not in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
            raise ScheduleError(f"an overlapped pair is a forward and a backward (B or BI), "
                                f"got {self.forward} and {self.backward}")
        if (self.forward.stage, self.forward.microbatch) == (self.backward.stage, self.backward.microbatch):
            raise ScheduleError(f"an overlapped pair cannot hold a backward and its own forward, {self.forward}")

    def __str__(self) -> str:
        return f"({self.forward};{self.backward})"


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Worker ``rank`` holds virtual stages ``stages`` (one unless interleaved) as replica ``replica``."""

    rank: int
    stages: tuple[int, ...]
    replica: int = 0


@dataclass
class ActionColumns:
    """One worker's actions as columns, as ``build`` writes them (transfers.py, hoist.py).

    The simulator reads these columns; making an ``Action`` for each of the hundreds of thousands
    of transfers only to read its fields back cost more than simulating them. ``code`` numbers
    kinds as ``KINDS``; ``source[i]`` is the builder's own Action where the program has one (a
    compute, all-reduce or step: kept as it is, group included), None for a transfer the placement
    wrote (its peer worker in ``peer``, -1 on the others).
    """

    code: list[int]
    stage: list[int]
    microbatch: list[int]
    version: list[int]
    peer: list[int]
    source: list[Action | None]

    def actions(self) -> list[Action]:
        kinds = KINDS
        return [
            a if a is not None else Action(kinds[c], s, m, v, p)
            for a, c, s, m, v, p in zip(self.source, self.code, self.stage, self.microbatch, self.version, self.peer)
        ]


KINDS = tuple(Kind)  # ActionColumns.code -> Kind (the simulator's codes, stash.CODES, number them alike)


@dataclass
class Schedule:
    """The workers' action lists, and what they were built with.

    ``build`` makes a schedule from columns (``from_columns``): its ``actions`` are made on first
    read, and from then on ``columns()`` is None, since the lists handed out may be changed; so
    the simulator reads the columns of a schedule that nobody has read, the lists otherwise.
    """

    name: str
    num_stages: int  # virtual stages (= physical stages x chunks when interleaved)
    microbatches: int  # per iteration (sync) or minibatches in total (async)
    workers: list[WorkerSpec]
    actions: list[list[Action]]  # actions[w] runs on worker w, in order
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_columns(cls, name: str, num_stages: int, microbatches: int, workers: list[WorkerSpec],
                     table: list[ActionColumns], meta: dict[str, Any]) -> Schedule:
        schedule = cls(name, num_stages, microbatches, workers, [], meta)
        schedule.__dict__["_table"] = table
        return schedule

    def columns(self) -> list[ActionColumns] | None:
        """The columns built with it, while ``actions`` has not been read (else None)."""
        return self.__dict__.get("_table")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "num_stages": self.num_stages,
            "microbatches": self.microbatches,
            "workers": [asdict(w) | {"stages": list(w.stages)} for w in self.workers],
            "actions": [[a.to_dict() for a in acts] for acts in self.actions],
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Schedule:
        return cls(
            name=d["name"],
            num_stages=int(d["num_stages"]),
            microbatches=int(d["microbatches"]),
            workers=[WorkerSpec(rank=w["rank"], stages=tuple(w["stages"]), replica=w.get("replica", 0)) for w in d["workers"]],
            actions=[[Action.from_dict(a) for a in acts] for acts in d["actions"]],
            meta=d.get("meta", {}),
        )


def _read_actions(schedule: Schedule) -> list[list[Action]]:
    table = schedule.__dict__.pop("_table", None)
    if table is not None:
        schedule.__dict__["_actions"] = [t.actions() for t in table]
    return schedule.__dict__["_actions"]


def _write_actions(schedule: Schedule, actions: list[list[Action]]) -> None:
    schedule.__dict__.pop("_table", None)
    schedule.__dict__["_actions"] = actions


# A property over the dataclass field (``__init__``, ``==``, ``asdict`` and ``replace`` go through
# it): the lists of a schedule built from columns are made when first read.
Schedule.actions = property(_read_actions, _write_actions, doc="actions[w]: worker w's actions, in order")  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One executed (or predicted) action: the same record for simulator and runtime.

    Times are seconds on a common clock (the run's start, or the simulation's zero).
    ``step`` is the iteration (sync) or, for pipedream, the batch (``microbatch // per_update``) the action belongs to.
    """

    worker: int
    stage: int
    replica: int
    microbatch: int
    kind: str  # a Kind value
    start: float
    end: float
    step: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimelineEvent:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})
