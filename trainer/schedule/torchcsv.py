"""torch's schedule files (``torch.distributed.pipelining``'s ``_dump_csv``/``_load_csv``), in and out.

torch writes a schedule as a CSV with one row per rank and one action per cell: ``0F3`` (stage 0's
forward of microbatch 3), ``2I1`` (input gradient), ``2W1`` (weight gradient), ``2B1`` (full
backward), ``(0F3;3B1)OVERLAP_F_B`` (a pair one rank may overlap), an empty cell for an idle step;
with communication (``compute_comms``) also ``0SEND_F3``/``1RECV_F3`` and ``1SEND_B3``/``0RECV_B3``,
and the FSDP and data-parallel actions its lowering adds, ``UNSHARD``, ``RESHARD`` and
``REDUCE_GRAD``. torchtitan runs any such file (``pipeline_parallel_schedule_csv``).

- ``export_rows(schedule, comms)``: any built schedule as torch's rows, compute only or with its
  transfers (pipeboard's own, named as torch names them). ``W(-1)`` (batched weight gradients)
  has no torch form: build with immediate weight gradients to export.
- ``read(path)``/``parse(rows)``: a file as a ``TorchFile`` (each rank's compute order), checked:
  an unknown cell, a stage on two ranks, a missing or repeated action, an action before what it
  needs, a deadlock or (with transfers) a send without its receive is one line naming the rank
  and the action. A file's transfers are checked, then pipeboard places its own (the same
  pairs: each boundary crossing of a compute); ``UNSHARD``/``RESHARD`` (FSDP) and ``REDUCE_GRAD``
  (data parallel) are checked to name a stage of their rank and otherwise have nothing to do
  here: pipeboard's stages are neither sharded nor replicated in a file's schedule.
- ``register_file(path)``: the file as a schedule (its name: ``custom`` followed by the file's
  stem), built, validated, simulated and run like any other; ``PIPEBOARD_SCHEDULES`` takes
  ``.csv`` paths, so spawned workers and the service's runs know it too.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

from pipeboard.trainer.schedule.actions import Action, Kind, OverlapFB, Schedule, ScheduleError
from pipeboard.trainer.schedule.topology import PLACEMENTS, chunk_stages

# pipeboard's kind -> torch's letters (transfers are named by the stage that sends or receives)
TORCH = {Kind.FORWARD: "F", Kind.BACKWARD: "B", Kind.BACKWARD_INPUT: "I", Kind.BACKWARD_WEIGHT: "W",
         Kind.SEND_ACT: "SEND_F", Kind.RECV_ACT: "RECV_F", Kind.SEND_GRAD: "SEND_B", Kind.RECV_GRAD: "RECV_B"}
OURS = {v: k for k, v in TORCH.items()}
ELSEWHERE = ("UNSHARD", "RESHARD", "REDUCE_GRAD")  # torch's FSDP and data-parallel actions
_CELL = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD|F|I|B|W)(\d*)$")
_PAIR = re.compile(r"^\((.*);(.*)\)OVERLAP_F_B$")
FORMATS = ("compute_only", "compute_comms")


def text(a: Action) -> str:
    """One action as torch writes it: ``0F3``, ``1SEND_B2``."""
    if a.kind not in TORCH:
        raise ScheduleError(f"{a} has no torch form")
    if a.kind is Kind.BACKWARD_WEIGHT and a.microbatch < 0:
        raise ScheduleError(f"stage {a.stage}'s batched weight gradients (W(-1)) have no torch form; "
                            "build with immediate weight gradients (weight_grads='immediate') to export")
    return f"{a.stage}{TORCH[a.kind]}{a.microbatch}"


def export_rows(schedule: Schedule, comms: bool = False) -> list[list[str]]:
    """Each worker's actions as torch's cells: its computes (``comms``: and transfers) in order,
    an overlapped pair as one ``(F;B)OVERLAP_F_B`` cell where its forward was (a transfer listed
    between its two halves: a receive before the cell, a send after it). Updates and all-reduces
    are not torch's schedule's business (its optimizer steps outside), so they are left out."""
    if not schedule.meta.get("sync", True):
        raise ScheduleError(f"{schedule.name} is asynchronous (weight stashing); torch's files hold synchronous schedules")
    pairs = schedule.meta.get("overlap_f_b") or [[] for _ in schedule.workers]
    rows = []
    for acts, mine in zip(schedule.actions, pairs):
        heads = {(fs, fm): (bs, bm) for fs, fm, bs, bm in mine}
        row: list[str] = []
        open_pair: tuple[str, Action] | None = None  # (the forward's text, the backward to close it)
        after: list[str] = []
        for a in acts:
            if a.kind is Kind.STEP or a.kind is Kind.ALLREDUCE or (not comms and a.kind.is_comm):
                continue
            if open_pair is not None:
                if a == open_pair[1]:
                    row.append(f"({open_pair[0]};{text(a)})OVERLAP_F_B")
                    row += after
                    open_pair, after = None, []
                elif a.kind in (Kind.RECV_ACT, Kind.RECV_GRAD):
                    row.append(text(a))
                else:
                    after.append(text(a))
                continue
            if a.kind is Kind.FORWARD and (a.stage, a.microbatch) in heads:
                bs, bm = heads[(a.stage, a.microbatch)]
                partner = next(b for b in acts if b.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT)
                               and (b.stage, b.microbatch) == (bs, bm))
                open_pair = (text(a), partner)
                continue
            row.append(text(a))
        rows.append(row)
    return rows


def dumps(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue()


@dataclass(frozen=True)
class TorchFile:
    """A checked torch schedule: each rank's compute order (``Action`` and ``OverlapFB``)."""

    programs: list[list[Action | OverlapFB]]
    stages: list[tuple[int, ...]]  # per rank, its stages in order
    num_stages: int
    microbatches: int
    placement: str
    has_comms: bool

    @property
    def ranks(self) -> int:
        return len(self.programs)

    @property
    def chunks(self) -> int:
        return self.num_stages // self.ranks


def read(path: str | Path) -> TorchFile:
    p = Path(path)
    try:
        content = p.read_text()
    except OSError as exc:
        raise ScheduleError(f"{p}: cannot read: {exc.strerror or exc}") from None
    return loads(content)


def loads(content: str) -> TorchFile:
    """A file's text, checked as ``read`` checks a file (a job's ``layout.schedule_file``)."""
    try:
        rows = list(csv.reader(io.StringIO(content)))
    except csv.Error as exc:
        raise ScheduleError(f"not a CSV file: {exc}") from None
    return parse(rows)


def _cell(rank: int, col: int, cell: str) -> tuple | None:
    """(kind text, stage, microbatch) or ("PAIR", forward, backward); None for an empty cell."""
    cell = cell.strip()
    if not cell:
        return None
    pair = _PAIR.match(cell)
    if pair:
        halves = [_cell(rank, col, h) for h in pair.groups()]
        if any(h is None or h[0] not in ("F", "B", "I") for h in halves) or halves[0][0] != "F":
            raise ScheduleError(f"rank {rank}, column {col + 1}: {cell!r} is not a forward paired with a backward")
        return ("PAIR", halves[0], halves[1])
    m = _CELL.match(cell)
    if not m:
        raise ScheduleError(f"rank {rank}, column {col + 1}: {cell!r} is not a torch action (e.g. 0F3, 2I1, 1SEND_F0)")
    kind, stage, mb = m.group(2), int(m.group(1)), m.group(3)
    if kind not in ELSEWHERE and not mb:
        raise ScheduleError(f"rank {rank}, column {col + 1}: {cell!r} names no microbatch")
    return (kind, stage, int(mb) if mb else -1)


def parse(rows: list[list[str]]) -> TorchFile:
    """The rows of a torch file, checked (see the module docstring)."""
    rows = [r for r in rows]
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    if not rows:
        raise ScheduleError("the file holds no rank's actions")
    cells = [[(col, c) for col, raw in enumerate(row) if (c := _cell(rank, col, raw)) is not None]
             for rank, row in enumerate(rows)]
    owner: dict[int, int] = {}
    for rank, mine in enumerate(cells):
        for col, c in mine:
            for kind, stage, _ in ([c[1], c[2]] if c[0] == "PAIR" else [c]):
                if kind in ("F", "B", "I", "W"):
                    if owner.setdefault(stage, rank) != rank:
                        raise ScheduleError(f"rank {rank}: {stage}{kind}{_} runs stage {stage}, which rank "
                                            f"{owner[stage]} runs too")
    ranks = len(rows)
    num_stages = max(owner, default=-1) + 1
    if sorted(owner) != list(range(num_stages)) or num_stages % ranks:
        missing = sorted(set(range(num_stages)) - set(owner))
        raise ScheduleError(f"the file's {num_stages} stages do not lie evenly on its {ranks} ranks"
                            + (f" (no rank runs stage {missing[0]})" if missing else ""))
    chunks = num_stages // ranks
    stages = [tuple(sorted(s for s, r in owner.items() if r == rank)) for rank in range(ranks)]
    placement = next((pl for pl in PLACEMENTS
                      if all(set(chunk_stages(r, ranks, chunks, pl)) == set(stages[r]) for r in range(ranks))), None)
    if placement is None:
        raise ScheduleError(f"the file places stages {[list(s) for s in stages]} on its ranks: neither a loop "
                            f"nor a V, the placements pipeboard's runtime lays out")
    stages = [chunk_stages(r, ranks, chunks, placement) for r in range(ranks)]
    has_comms = any(c[0] in OURS and OURS[c[0]].is_comm for mine in cells for _, c in mine)
    programs: list[list[Action | OverlapFB]] = []
    for rank, mine in enumerate(cells):
        program: list[Action | OverlapFB] = []
        for col, c in mine:
            if c[0] == "PAIR":
                f, b = (Action(OURS[k], s, m) for k, s, m in c[1:])
                try:
                    program.append(OverlapFB(f, b))
                except ScheduleError as exc:
                    raise ScheduleError(f"rank {rank}, column {col + 1}: {exc}") from None
            elif c[0] in ELSEWHERE:
                if c[1] not in stages[rank]:
                    raise ScheduleError(f"rank {rank}: {c[1]}{c[0]} names stage {c[1]}, which rank {owner.get(c[1])} runs")
            elif not OURS[c[0]].is_comm:
                program.append(Action(OURS[c[0]], c[1], c[2]))
        programs.append(program)
    microbatches = 1 + max((a.microbatch for p in programs for x in p
                            for a in ((x.forward, x.backward) if isinstance(x, OverlapFB) else (x,))), default=-1)
    _check_complete(programs, num_stages, microbatches)
    _check_order(programs, num_stages)
    if has_comms:
        _check_transfers(cells, owner)
    return TorchFile(programs, stages, num_stages, microbatches, placement, has_comms)


def _flat(program: list[Action | OverlapFB]) -> list[Action]:
    return [a for x in program for a in ((x.forward, x.backward) if isinstance(x, OverlapFB) else (x,))]


def _name(a: Action) -> str:
    return f"{a.stage}{TORCH[a.kind]}{a.microbatch}"


def _check_complete(programs: list, num_stages: int, microbatches: int) -> None:
    """Every (stage, microbatch) has one forward and one backward: B, or I and then its W."""
    for rank, program in enumerate(programs):
        seen: dict[tuple, int] = {}
        for a in _flat(program):
            key = (a.kind, a.stage, a.microbatch)
            if key in seen:
                raise ScheduleError(f"rank {rank}: {_name(a)} appears twice")
            seen[key] = 1
        for s in {a.stage for a in _flat(program)}:
            for mb in range(microbatches):
                if (Kind.FORWARD, s, mb) not in seen:
                    raise ScheduleError(f"rank {rank}: {s}F{mb} is missing (stage {s} runs microbatches up to {microbatches - 1})")
                full, half, weight = ((k, s, mb) in seen for k in (Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT))
                if full and (half or weight):
                    raise ScheduleError(f"rank {rank}: {s}B{mb} and {s}{'I' if half else 'W'}{mb} both compute its gradients")
                if not full and not (half and weight):
                    need = f"{s}B{mb}" if not (half or weight) else f"{s}{'W' if half else 'I'}{mb}"
                    raise ScheduleError(f"rank {rank}: {need} is missing")


def _check_order(programs: list, num_stages: int) -> None:
    """Replay the ranks on the dependencies alone (a forward after the previous stage's, a
    backward after its forward and the next stage's backward, a W after its I); stuck ranks are
    a deadlock, named by the first stuck rank's action and what it waits for."""
    flat = [_flat(p) for p in programs]
    done: set[tuple] = set()
    at = [0] * len(flat)

    def needs(a: Action) -> list[tuple]:
        s, mb = a.stage, a.microbatch
        if a.kind is Kind.FORWARD:
            return [("F", s - 1, mb)] if s > 0 else []
        if a.kind is Kind.BACKWARD_WEIGHT:
            return [("I", s, mb)]
        return [("F", s, mb)] + ([("G", s + 1, mb)] if s < num_stages - 1 else [])

    progress = True
    while progress:
        progress = False
        for rank, acts in enumerate(flat):
            while at[rank] < len(acts) and all(n in done for n in needs(acts[at[rank]])):
                a = acts[at[rank]]
                done.add(("F" if a.kind is Kind.FORWARD else "I" if a.kind is not Kind.BACKWARD_WEIGHT else "W", a.stage, a.microbatch))
                if a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
                    done.add(("G", a.stage, a.microbatch))
                at[rank] += 1
                progress = True
    stuck = {}  # rank -> (its action, what it waits for, the rank that holds that)
    for rank, acts in enumerate(flat):
        if at[rank] < len(acts):
            a = acts[at[rank]]
            kind, s, mb = next(n for n in needs(a) if n not in done)
            wanted = {"F": f"{s}F{mb}", "I": f"{s}I{mb}", "G": f"{s}B{mb}"}[kind]
            holder = next(r for r, other in enumerate(flat) if any(
                (b.stage, b.microbatch) == (s, mb) and (b.kind is Kind.FORWARD) == (kind == "F")
                and (kind != "I" or b.kind is Kind.BACKWARD_INPUT) for b in other))
            if kind == "G":  # name the backward that rank runs: a full one or its input half
                wanted = next(_name(b) for b in flat[holder] if (b.stage, b.microbatch) == (s, mb)
                              and b.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT))
            stuck[rank] = (_name(a), wanted, holder)
    if stuck:
        # a rank waiting for its own later action is the cause; else name the first and whom it waits on
        for rank, (name, wanted, holder) in stuck.items():
            if holder == rank:
                raise ScheduleError(f"deadlock: rank {rank} waits at {name} for {wanted}, which it runs only later")
        rank, (name, wanted, holder) = next(iter(stuck.items()))
        other = stuck.get(holder)
        raise ScheduleError(f"deadlock: rank {rank} waits at {name} for {wanted} on rank {holder}"
                            + (f", which waits at {other[0]} for {other[1]}" if other else ""))


def _check_transfers(cells: list, owner: dict[int, int]) -> None:
    """Each SEND has its RECV on the rank of the stage it goes to, and each RECV its SEND."""
    listed = {(rank, c[0], c[1], c[2]) for rank, mine in enumerate(cells) for _, c in mine if c[0] in OURS}
    for rank, kind, stage, mb in sorted(listed):
        other = {"SEND_F": ("RECV_F", stage + 1), "SEND_B": ("RECV_B", stage - 1),
                 "RECV_F": ("SEND_F", stage - 1), "RECV_B": ("SEND_B", stage + 1)}.get(kind)
        if other is None:
            continue
        peer = owner.get(other[1])
        if peer is None or (peer, other[0], other[1], mb) not in listed:
            raise ScheduleError(f"rank {rank}: {stage}{kind}{mb} has no {other[1]}{other[0]}{mb} on "
                                f"{'any rank' if peer is None else f'rank {peer}'}")


def schedule_name(path: str | Path) -> str:
    """``custom-<stem>``, in the registry's alphabet."""
    stem = re.sub(r"[^a-z0-9._-]", "-", Path(path).stem.lower()).strip("-.") or "file"
    return f"custom-{stem}"[:40]


def register_file(path: str | Path, name: str | None = None, *, replace: bool = False):
    """Register the checked file as a schedule; returns its spec. Its builder answers only the
    configuration the file is written for (ranks, chunks, microbatches)."""
    return _register(read(path), name or schedule_name(path), f"torch's schedule file {Path(path).name}", replace)


def text_schedule_name(content: str) -> str:
    """A job's own file's schedule name: ``custom-`` and its content's hash, so that two jobs'
    files in one process are two schedules, and one file is the same schedule in every process."""
    return f"custom-{hashlib.sha256(content.encode()).hexdigest()[:12]}"


_registered_texts: dict[str, str] = {}  # name -> the text registered under it (this process)


def register_text(content: str, name: str | None = None):
    """Register a file's text (a job's ``layout.schedule_file``, handed to every process of its
    run in its run file) as the schedule ``name`` (default ``text_schedule_name``); once per
    process for the same text. Returns its spec."""
    from pipeboard.trainer.schedule.registry import _JOB_SPECS

    name = name or text_schedule_name(content)
    if _registered_texts.get(name) == content and name in _JOB_SPECS:  # not unregistered since
        return _JOB_SPECS[name]
    spec = _register(loads(content), name, "a job's schedule file", replace=True, job=True)
    _registered_texts[name] = content
    return spec


def _register(tf: TorchFile, name: str, source: str, replace: bool, job: bool = False):
    """``job``: a job's own file, found by name but never listed (registry.register_job_schedule)."""
    from pipeboard.trainer.schedule.registry import ScheduleSpec, register, register_job_schedule

    def builder(ctx) -> list[list[Action | OverlapFB]]:
        if (ctx.stages, ctx.chunks, ctx.microbatches) != (tf.ranks, tf.chunks, tf.microbatches):
            raise ScheduleError(f"{name} is written for {tf.ranks} workers x {tf.chunks} chunks and "
                                f"{tf.microbatches} microbatches; got {ctx.stages} x {ctx.chunks} and {ctx.microbatches}")
        return [list(p) + [Action(Kind.STEP, s, -1, 1) for s in tf.stages[r]] for r, p in enumerate(tf.programs)]

    capabilities = dict(description=f"{source}: {tf.ranks} workers x {tf.chunks} "
                                f"chunks, {tf.microbatches} microbatches, placed in a {tf.placement}.",
                        replication=False, chunks=tf.chunks > 1, default_chunks=tf.chunks,
                        weight_grads=(), placement=tf.placement if tf.chunks > 1 else "loop")
    if job:
        return register_job_schedule(ScheduleSpec(name, builder, **capabilities))
    return register(name, builder, replace=replace, **capabilities)
