"""Which worker's GPUs a cuda job runs on, and why one waits.

Workers report their GPUs with every heartbeat (``worker_heartbeats.devices``,
app/core/devices.py); an attempt that was placed holds its GPUs (``job_attempts.gpus``) while it
is queued for its worker or running, and an ended attempt holds none. From those two,
``place`` decides, as a pure function of the inventories:

- a cuda job needs one GPU per stage replica on its host (each process its own,
  ``CUDA_VISIBLE_DEVICES`` and ``LOCAL_RANK``), or ``gpus_per_host`` GPUs that its processes
  share when the job asks for that: then, given each process's predicted peak bytes, its
  processes are packed onto those GPUs by memory (trainer/runtime/gpu_share.py: largest first,
  each on the GPU with the most room left), and a worker whose free GPUs lack the room does not
  fit;
- it runs only on a worker with that many GPUs free; two jobs never share a GPU;
- among the workers that fit, the one left with the fewest free GPUs (best fit), so a large
  free block stays whole for a large job: an 8-GPU worker runs two 4-GPU jobs side by side, and
  two 1-GPU jobs on a 2-GPU worker take one GPU each;
- where none fits now the job waits, saying why in words the job page shows ("waiting for a
  worker with a GPU", "waiting: all 2 GPUs busy (needs 1)", "waiting: needs 4 GPUs, largest free
  block 2", or the memory a shared GPU lacks), and where no live worker could ever serve it (too
  few GPUs in all) it is refused.

Dispatch uses Celery's own routing: a placed attempt is meant for its worker (``prefer_node``,
which other workers' claims pass by) and its task goes to that worker's direct queue
(``worker_direct``), as a resumed attempt does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from pipeboard.app.core.config import get_settings
from pipeboard.app.models import JobAttempt, JobStatus, WorkerHeartbeat, utcnow
from pipeboard.app.services.tx import begin_read_write
from pipeboard.trainer.runtime.gpu_share import ShareError, pack

HOLDING = (JobStatus.QUEUED, JobStatus.RUNNING)  # an attempt in these states keeps its GPUs
WAITING_FOR_GPUS = "(waiting for GPUs)"  # prefer_node of a cuda attempt no worker may claim yet


@dataclass(frozen=True)
class WorkerInventory:
    """A live worker's GPUs: ``gpus`` the indices it reports, ``held`` index -> the job holding it."""

    worker: str  # Celery node name ("pipeboard@host")
    host: str
    gpus: tuple[int, ...]
    held: dict[int, int] = field(default_factory=dict)
    memory: dict[int, int] = field(default_factory=dict)  # index -> its memory in bytes, as reported

    @property
    def free(self) -> tuple[int, ...]:
        return tuple(i for i in self.gpus if i not in self.held)


@dataclass(frozen=True)
class GpuRequest:
    """A cuda job's need on one host: ``processes`` stage replicas there; ``gpus_per_host`` set
    when they share that many GPUs (None: one GPU each)."""

    job_id: int
    processes: int
    gpus_per_host: int | None = None
    process_bytes: tuple[int, ...] = ()  # each process's predicted peak: sharing packs by it (empty: not known)

    @property
    def gpus(self) -> int:
        return self.processes if self.gpus_per_host is None else self.gpus_per_host


@dataclass(frozen=True)
class GpuPlacement:
    worker: str
    devices: tuple[int, ...]
    ranks: tuple[int, ...] = ()  # shared GPUs packed by memory: each process's GPU (an index in devices' numbering)

    @property
    def visible(self) -> str:
        """``CUDA_VISIBLE_DEVICES`` for the run: its processes see these GPUs as cuda:0, 1, ..."""
        return ",".join(str(i) for i in self.devices)

    def as_row(self) -> dict[str, Any]:
        return {"worker": self.worker, "devices": list(self.devices), **({"ranks": list(self.ranks)} if self.ranks else {})}


@dataclass(frozen=True)
class Waiting:
    reason: str


def _plural(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def refusal(request: GpuRequest, workers: list[WorkerInventory]) -> str | None:
    """Why no live worker could ever serve ``request`` (even with every GPU free), else None."""
    if request.gpus_per_host is not None and not 1 <= request.gpus_per_host <= request.processes:
        return f"machine.gpus_per_host: must be 1 to {request.processes} (the job's processes on a host)"
    largest = max((len(w.gpus) for w in workers), default=0)
    if largest == 0:
        return "machine.device: device cuda: no live worker reports a GPU (GET /api/v1/workers)"
    if request.gpus > largest:
        return (f"layout.workers: the job needs {_plural(request.gpus)} on one worker (one per stage replica; "
                f"machine.gpus_per_host shares fewer); the largest live worker has {largest}")
    if request.gpus_per_host is not None and request.process_bytes:  # even with all its GPUs free
        why = [_packed(request, w, _room_first(w, w.gpus, request.gpus)) for w in workers if len(w.gpus) >= request.gpus]
        if why and all(isinstance(r, str) for r in why):
            return f"machine.gpus_per_host: {request.gpus_per_host} shared GPUs cannot hold the job's stages: {why[0]}"
    return None


def _packed(request: GpuRequest, w: WorkerInventory, devices: tuple[int, ...]) -> tuple[int, ...] | str:
    """Each process's GPU among ``devices`` of ``w`` by memory, or why they do not fit; () when the
    job does not share or its processes' memory is not known (one GPU each, or any share)."""
    if request.gpus_per_host is None or not request.process_bytes:
        return ()
    if any(i not in w.memory for i in devices):
        return f"worker {w.worker} does not report its GPUs' memory"
    try:
        return tuple(devices[g] for g in pack(list(request.process_bytes), [w.memory[i] for i in devices]))
    except ShareError as exc:
        return str(exc)


def _room_first(w: WorkerInventory, free: tuple[int, ...], need: int) -> tuple[int, ...]:
    """The free GPUs a shared job takes: those with the most memory (lowest index among equals)."""
    return tuple(sorted(sorted(free, key=lambda i: (-w.memory.get(i, 0), i))[:need]))


def place(request: GpuRequest, workers: list[WorkerInventory]) -> GpuPlacement | Waiting:
    """Where ``request`` runs now (best fit, the lowest free indices; a shared job's processes
    packed onto its GPUs by memory), or why it waits."""
    need = request.gpus
    fits = [w for w in workers if len(w.free) >= need]
    short: list[str] = []
    for w in sorted(fits, key=lambda w: (len(w.free) - need, w.worker)):
        devices = _room_first(w, w.free, need) if request.process_bytes and request.gpus_per_host else w.free[:need]
        ranks = _packed(request, w, devices)
        if isinstance(ranks, str):
            short.append(ranks)
            continue
        return GpuPlacement(w.worker, devices, ranks)
    return Waiting(waiting_reason(need, workers, short))


def waiting_reason(need: int, workers: list[WorkerInventory], short: list[str] = ()) -> str:
    """Why a job needing ``need`` GPUs on one worker waits, as the job page says it."""
    total = sum(len(w.gpus) for w in workers)
    if total == 0:
        return "waiting for a worker with a GPU (no live worker reports one)"
    if short:  # enough free GPUs somewhere, not enough memory on them
        return f"waiting: no free {_plural(need)} with the memory its stages need ({short[0]})"
    largest = max((len(w.free) for w in workers), default=0)
    if largest == 0:
        return f"waiting: all {_plural(total)} busy (needs {need})"
    return f"waiting: needs {_plural(need)}, largest free block {largest}"


def place_in_order(requests: list[GpuRequest], workers: list[WorkerInventory]) -> dict[int, GpuPlacement | Waiting]:
    """``place`` for queued jobs in turn (their queue order), each placement holding its GPUs
    for the ones after it: what the dispatcher does in one pass."""
    inventories = {w.worker: w for w in workers}
    out: dict[int, GpuPlacement | Waiting] = {}
    for r in requests:
        decision = place(r, list(inventories.values()))
        out[r.job_id] = decision
        if isinstance(decision, GpuPlacement):
            w = inventories[decision.worker]
            inventories[w.worker] = WorkerInventory(w.worker, w.host, w.gpus,
                                                    {**w.held, **{i: r.job_id for i in decision.devices}}, w.memory)
    return out


# ---- the database side: inventories from heartbeats and attempts ---------------------------------

def live_inventories(session: Session) -> list[WorkerInventory]:
    """Every live worker (fresh heartbeat) with the GPUs it reports and those its placed,
    unfinished attempts hold."""
    cutoff = utcnow() - timedelta(seconds=get_settings().stale_after_seconds)
    beats = session.scalars(select(WorkerHeartbeat).where(WorkerHeartbeat.seen_at >= cutoff)
                            .order_by(WorkerHeartbeat.hostname)).all()
    held: dict[str, dict[int, int]] = {}
    for job_id, gpus in session.execute(select(JobAttempt.job_id, JobAttempt.gpus)
                                        .where(JobAttempt.gpus.is_not(None), JobAttempt.status.in_(HOLDING))).all():
        for i in (gpus or {}).get("devices", []):  # JSON null: an attempt that gave its GPUs back
            held.setdefault(gpus.get("worker"), {})[int(i)] = job_id
    return [WorkerInventory(b.hostname, b.host or b.hostname, tuple(int(d["index"]) for d in (b.devices or [])),
                            held.get(b.hostname, {}),
                            {int(d["index"]): int(d["memory_bytes"]) for d in (b.devices or []) if d.get("memory_bytes")})
            for b in beats]


def gpu_workers(session: Session) -> int:
    """Live workers that report at least one GPU."""
    return sum(1 for w in live_inventories(session) if w.gpus)


def workers_view(session: Session) -> list[dict[str, Any]]:
    """Each live worker with its GPUs, each free or held by a job (``GET /api/v1/workers``)."""
    cutoff = utcnow() - timedelta(seconds=get_settings().stale_after_seconds)
    inventories = {w.worker: w for w in live_inventories(session)}
    rows = session.scalars(select(WorkerHeartbeat).where(WorkerHeartbeat.seen_at >= cutoff)
                           .order_by(WorkerHeartbeat.hostname)).all()
    out = []
    for b in rows:
        held = inventories[b.hostname].held if b.hostname in inventories else {}
        out.append({"worker": b.hostname, "host": b.host or b.hostname, "pool": b.pool, "concurrency": b.concurrency,
                    "started_at": b.started_at, "seen_at": b.seen_at, "devices_reported": b.devices is not None,
                    "devices": [{**d, "job_id": held.get(int(d["index"]))} for d in (b.devices or [])]})
    return out


def dispatch(session: Session, job_id: int, attempt: int, request: GpuRequest,
             send: Callable[[int, str, int], None]) -> GpuPlacement | Waiting:
    """Place a queued cuda attempt: on a fit, it holds its GPUs, is meant for its worker and
    ``send(job_id, worker, attempt)`` queues its task on that worker's direct queue; otherwise it
    waits, meant for no worker, with its reason. The caller commits (after a send that raised,
    it rolls back: the job is not left holding GPUs for a task that never went). What it reads of
    the GPUs held and what it writes are one locked transaction on SQLite: no commit between them
    fails the write, and two dispatches never place on the same free GPU."""
    begin_read_write(session)
    row = session.get(JobAttempt, (job_id, attempt))
    if row is None:
        raise LookupError(f"job {job_id} has no attempt {attempt}")
    decision = place(request, live_inventories(session))
    if isinstance(decision, GpuPlacement):
        row.gpus, row.prefer_node, row.waiting = decision.as_row(), decision.worker, None
        session.flush()
        send(job_id, decision.worker, attempt)
    else:
        row.gpus, row.prefer_node, row.waiting = None, WAITING_FOR_GPUS, decision.reason
    return decision


def unplace(session: Session, job_id: int, attempt: int) -> bool:
    """A queued cuda attempt placed on a worker that stopped heart-beating gives its GPUs back and
    waits to be placed again (never released to any worker, which could be one without a GPU);
    True where it held GPUs. The caller commits, then dispatches the waiting ones."""
    begin_read_write(session)
    row = session.get(JobAttempt, (job_id, attempt))
    if row is None or not row.gpus:
        return False
    gone = row.gpus.get("worker")
    row.gpus, row.prefer_node, row.waiting = None, WAITING_FOR_GPUS, f"waiting: its worker {gone} stopped heart-beating"
    return True


def held_devices(session: Session, job_id: int, attempt: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for an attempt that holds GPUs (the runner sets it for the
    training processes), None for one that holds none."""
    row = session.get(JobAttempt, (job_id, attempt))
    if row is None or not row.gpus:
        return None
    return ",".join(str(i) for i in row.gpus["devices"])
