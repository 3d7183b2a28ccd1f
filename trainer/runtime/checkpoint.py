"""Checkpoints: every worker saves its stages atomically; a step counts once all workers have.

Layout: ``DIR/step-00000120/rank-0.pt`` ... and ``DIR/step-00000120/COMPLETE``. Each rank file is
written to a temporary name and renamed (atomic on POSIX), holding the stage weights, optimizer
state, step and RNG state. After a barrier, rank 0 writes ``COMPLETE`` (also by rename) with the
layout it belongs to; resuming picks the newest step directory that has it, so a run killed
halfway through writing a checkpoint resumes from the previous complete one. Older complete
checkpoints beyond the newest ``keep`` (default ``KEEP``) are deleted once a newer one has
settled (completed ``SETTLE_S`` ago), and with them any incomplete ones older than the newest
complete one (left by a run killed while writing).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

KEEP = 2
# A service run resumes from a checkpoint at or before the last step the service has recorded,
# and it records steps about a second after the run takes them (trainer/sink.py writes once a
# second, the workers report every quarter second). A fast model checkpoints several times in that
# second, so keeping only the newest two could keep none that old (measured: docs/api.md,
# "Faults"). So an old checkpoint goes only once a newer one is this old; ten times the lag, for a
# loaded machine.
SETTLE_S = 10.0


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def save_rank(root: str | Path, step: int, rank: int, state: dict[str, Any]) -> None:
    d = step_dir(root, step)
    d.mkdir(parents=True, exist_ok=True)
    _atomic_write(d / f"rank-{rank}.pt", lambda p: torch.save(state, p))


def mark_complete(root: str | Path, step: int, layout: dict[str, Any], keep: int = KEEP,
                  settle_s: float = SETTLE_S) -> None:
    """Called by rank 0 once every rank has saved ``step``."""
    d = step_dir(root, step)
    _atomic_write(d / "COMPLETE", lambda p: p.write_text(json.dumps({"step": step, **layout})))
    complete = complete_steps(root)
    kept = set(complete[-keep:])
    now = time.time()
    settled = [s for s in complete if now - (step_dir(root, s) / "COMPLETE").stat().st_mtime >= settle_s]
    # every checkpoint at or after the newest settled one stays
    kept.update(s for s in complete if s >= (settled[-1] if settled else 0))
    for old in Path(root).glob("step-*"):
        try:
            number = int(old.name.split("-", 1)[1])
        except ValueError:
            continue
        if number not in kept and number < complete[-1]:
            shutil.rmtree(old, ignore_errors=True)


def complete_steps(root: str | Path) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for d in root.glob("step-*"):
        if (d / "COMPLETE").is_file():
            try:
                steps.append(int(d.name.split("-", 1)[1]))
            except ValueError:
                continue
    return sorted(steps)


def latest(root: str | Path, layout: dict[str, Any], at_most: int | None = None) -> int | None:
    """The newest complete step (at or before ``at_most``, when given) whose layout matches
    ``layout``; a mismatch is an error naming the differing field."""
    steps = [s for s in complete_steps(root) if at_most is None or s <= at_most]
    if not steps:
        return None
    step = steps[-1]
    saved = json.loads((step_dir(root, step) / "COMPLETE").read_text())
    for key, value in layout.items():
        if saved.get(key) != value:
            raise ValueError(f"checkpoint_dir: checkpoint at step {step} was written with {key}={saved.get(key)!r}, "
                             f"this run has {key}={value!r}")
    return step


def load_rank(root: str | Path, step: int, rank: int) -> dict[str, Any]:
    """A rank's saved state, its tensors on the CPU whatever device saved them: a checkpoint of a
    GPU run loads on a machine without one (or on another GPU); ``load_state_dict`` then copies
    each tensor to the device of the parameter it fills."""
    return torch.load(step_dir(root, step) / f"rank-{rank}.pt", map_location="cpu", weights_only=False)


def rng_state(device: torch.device) -> dict[str, Any]:
    """The random state a resumed run needs to draw what this one would have drawn: the CPU
    generator's, and on a GPU that device's generator (dropout on a GPU draws from it)."""
    state = {"rng": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Set the generators ``rng_state`` saved. A CPU checkpoint resumed on a GPU keeps the GPU's
    seed-derived state (there is none saved to restore)."""
    torch.set_rng_state(state["rng"])
    if device.type == "cuda" and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"].cpu(), device)


def inventory(root: str | Path, at_most: int | None = None) -> dict[int, list[int]]:
    """{step: ranks whose files this folder holds} for its complete steps (at or before ``at_most``)."""
    out = {}
    for step in complete_steps(root):
        if at_most is None or step <= at_most:
            out[step] = sorted(int(p.stem.split("-", 1)[1]) for p in step_dir(root, step).glob("rank-*.pt"))
    return out


def agree(root: str | Path, layout: dict[str, Any], at_most: int | None, rank: int, world: int,
          group: Any = None) -> tuple[int | None, dict[str, Any] | None]:
    """Collective over ``group`` (every rank calls it): the step to resume from and this rank's
    state at it, or (None, None) to start afresh.

    Under torchrun each host keeps the files of its own ranks and marks them complete itself, and
    a retried launch may place ranks on other hosts than before. So the ranks pool what their
    folders hold, pick the newest step (at or before ``at_most``) whose files they hold between
    them for every rank, and a rank whose host lacks its file receives it from one that has it.
    On one host (every rank reading one folder) that is simply the newest complete step."""
    import io

    import torch.distributed as dist

    held: list[Any] = [None] * world
    dist.all_gather_object(held, inventory(root, at_most), group=group)
    holder: dict[int, dict[int, int]] = {}  # step -> rank file -> the first rank whose folder has it
    for r, steps in enumerate(held):
        for step, files in steps.items():
            for f in files:
                holder.setdefault(step, {}).setdefault(f, r)
    usable = [step for step, files in holder.items() if len(files) == world]
    if not usable:
        return None, None
    step = max(usable)
    if step in held[rank]:
        latest(root, layout, at_most=step)  # the layout check, naming a differing field
    state = load_rank(root, step, rank) if rank in held[rank].get(step, ()) else None
    for f in range(world):  # the same transfers, in the same order, on every rank
        if f in held[f].get(step, ()):
            continue
        src = holder[step][f]
        payload = [(step_dir(root, step) / f"rank-{f}.pt").read_bytes() if rank == src else None]
        dist.broadcast_object_list(payload, src=src, group=group)
        if rank == f:
            state = torch.load(io.BytesIO(payload[0]), map_location="cpu", weights_only=False)
    return step, state


def assemble_model(cfg, root: str | Path, step: int | None = None, rank_filter=None):
    """The whole model of a run, rebuilt from its checkpoint at ``step`` (default: the latest
    complete one): each stage's weights from the first rank that holds it, or from every rank
    ``rank_filter(rank)`` accepts. Returns (model, {rank: state})."""
    from pipeboard.trainer.runtime import stage_modules
    from pipeboard.trainer.runtime.layout import resolve

    layout = resolve(cfg)
    step = complete_steps(root)[-1] if step is None else step
    task = stage_modules.load_task(cfg)
    example = task.example_input(cfg.microbatch_size)
    stages = stage_modules.build_stages(task.model, example,
                                        stage_modules.stage_layers(cfg, task, layout.virtual_stages),
                                        task.layers, task.varying_dims(cfg.microbatch_size))
    states = {r: load_rank(root, step, r) for r in range(layout.world) if rank_filter is None or rank_filter(r)}
    loaded = set()
    for r, state in states.items():
        for s, st in state["stages"].items():
            if s not in loaded:
                stages[s].load_state_dict(st["module"])
                loaded.add(s)
    return task.model, states
