"""Checkpoints: every worker saves its stages atomically; a step counts once all workers have.

Layout: ``DIR/step-00000120/rank-0.pt`` ... and ``DIR/step-00000120/COMPLETE``. Each rank file is
written to a temporary name and renamed (atomic on POSIX), holding the stage weights, optimizer
state, step and RNG state. After a barrier, rank 0 writes ``COMPLETE`` (also by rename) with the
layout it belongs to; resuming picks the newest step directory that has it, so a run killed
halfway through writing a checkpoint resumes from the previous complete one. Older complete
checkpoints beyond the newest ``keep`` (default ``KEEP``) are deleted, and with them any
incomplete ones older than the newest complete one (left by a run killed while writing).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

KEEP = 2


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


def mark_complete(root: str | Path, step: int, layout: dict[str, Any], keep: int = KEEP) -> None:
    """Called by rank 0 once every rank has saved ``step``."""
    d = step_dir(root, step)
    _atomic_write(d / "COMPLETE", lambda p: p.write_text(json.dumps({"step": step, **layout})))
    complete = complete_steps(root)
    kept = set(complete[-keep:])
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
    return torch.load(step_dir(root, step) / f"rank-{rank}.pt", weights_only=False)


def assemble_model(cfg, root: str | Path, step: int | None = None, rank_filter=None):
    """The whole model of a run, rebuilt from its checkpoint at ``step`` (default: the latest
    complete one): each stage's weights from the first rank that holds it, or from every rank
    ``rank_filter(rank)`` accepts. Returns (model, {rank: state})."""
    from pipeboard.trainer.runtime import model as model_mod
    from pipeboard.trainer.runtime.layout import resolve

    layout = resolve(cfg)
    step = complete_steps(root)[-1] if step is None else step
    task = model_mod.load_task(cfg)
    example = task.example_input(cfg.microbatch_size)
    stages = model_mod.build_stages(task.model, example, model_mod.stage_layers(cfg, task, layout.virtual_stages))
    states = {r: load_rank(root, step, r) for r in range(layout.world) if rank_filter is None or rank_filter(r)}
    loaded = set()
    for r, state in states.items():
        for s, st in state["stages"].items():
            if s not in loaded:
                stages[s].load_state_dict(st["module"])
                loaded.add(s)
    return task.model, states
