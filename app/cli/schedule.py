"""`pipeboard schedule export|import`: torch's schedule files (trainer/schedule/torchcsv.py).

    pipeboard schedule export NAME --stages P --microbatches M [--chunks V] [--comms]
                              [--weight-grads batched|immediate] [--output FILE.csv]
    pipeboard schedule import FILE.csv [--fwd MS --bwd MS [--comm MS] [--overlap-f-b]] [--json]

`export` writes any registered schedule as torch's ``_dump_csv`` does (compute only, or with
pipeboard's transfers under ``--comms``), for torchtitan's ``pipeline_parallel_schedule_csv`` or
torch's ``_load_csv``. `import` reads a torch-written file (or ours), checks it (a deadlock or a
missing action is one line naming the rank and the action, exit 2), builds and validates it as
the schedule ``custom-<stem>``, simulates it when given stage times, and says how to train with
it (``PIPEBOARD_SCHEDULES=FILE.csv``, which spawned workers and the service inherit).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from pipeboard.app.cli.common import fail

app = typer.Typer(help="torch's schedule files (torch.distributed.pipelining's CSV), out and in.",
                  no_args_is_help=True, pretty_exceptions_enable=False)


def _positive(name: str, raw: str | None, kind: type = int) -> float | int | None:
    if raw is None:
        return None
    try:
        value = kind(raw)
    except ValueError:
        fail(f"{name}: expected {'an integer' if kind is int else 'a number'}, got {raw!r}")
    if not value > 0 or value == float("inf"):
        fail(f"{name}: must be > 0, got {raw}")
    return value


@app.command("export")
def export_cmd(
    name: str = typer.Argument(..., metavar="NAME", help="A registered schedule (pipeboard simulate --help lists them)."),
    stages: str = typer.Option(..., "--stages", metavar="P", help="Workers (physical stages)."),
    microbatches: str = typer.Option(..., "--microbatches", metavar="M", help="Microbatches per iteration."),
    chunks: Optional[str] = typer.Option(None, "--chunks", metavar="V", help="Chunks per worker (default: the schedule's)."),
    comms: bool = typer.Option(False, "--comms", help="With the transfers (torch's compute_comms format)."),
    weight_grads: str = typer.Option("immediate", "--weight-grads", metavar="batched|immediate",
                                     help="immediate (default): torch has no batched weight-gradient action."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here instead of standard output."),
) -> None:
    """Write a registered schedule as torch's CSV."""
    from pipeboard.trainer.schedule import ScheduleError, build
    from pipeboard.trainer.schedule.registry import WEIGHT_GRADS
    from pipeboard.trainer.schedule.torchcsv import dumps, export_rows

    if weight_grads not in WEIGHT_GRADS:
        fail(f"--weight-grads: must be one of {', '.join(WEIGHT_GRADS)}, got {weight_grads!r}")
    p, m = _positive("--stages", stages), _positive("--microbatches", microbatches)
    v = _positive("--chunks", chunks) or 1
    try:
        schedule = build(name, p, m, chunks=v, batch_weight_grads=weight_grads == "batched")
        text = dumps(export_rows(schedule, comms=comms))
    except ScheduleError as exc:
        fail(str(exc))
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text)
    except OSError as exc:
        fail(f"--output: cannot write {output}: {exc.strerror or exc}")
    typer.echo(f"wrote {output}: {schedule.name}, {len(schedule.workers)} ranks, {schedule.num_stages} stages, "
               f"{schedule.microbatches} microbatches ({'compute and transfers' if comms else 'compute only'})",
               err=True)


@app.command("import")
def import_cmd(
    path: Path = typer.Argument(..., metavar="FILE.csv", help="A schedule written by torch's _dump_csv (or by export)."),
    fwd: Optional[str] = typer.Option(None, "--fwd", metavar="MS", help="Forward ms per microbatch per worker's stage: simulate."),
    bwd: Optional[str] = typer.Option(None, "--bwd", metavar="MS", help="Backward ms per microbatch per worker's stage."),
    comm: Optional[str] = typer.Option(None, "--comm", metavar="MS", help="Ms per activation or gradient transfer (0)."),
    overlap_f_b: bool = typer.Option(False, "--overlap-f-b",
                                     help="Time OVERLAP_F_B pairs overlapped (pipeboard's runtime runs them in sequence)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Check torch's CSV, build it as a custom schedule, and simulate it."""
    from pipeboard.trainer.schedule import ScheduleError, build, costs_uniform, simulate, validate
    from pipeboard.trainer.schedule.torchcsv import read, register_file, schedule_name

    if (fwd is None) != (bwd is None):
        fail("--fwd and --bwd: give both to simulate, or neither")
    f_ms, b_ms = _positive("--fwd", fwd, float), _positive("--bwd", bwd, float)
    c_ms = 0.0 if comm is None else _positive("--comm", comm, float)
    try:
        tf = read(path)
        spec = register_file(path, replace=True)
        schedule = build(spec.name, tf.ranks, tf.microbatches, chunks=tf.chunks)  # the file's own configuration
        report = validate(schedule)
        out = {"schedule": spec.name, "file": str(path), "ranks": tf.ranks, "chunks": tf.chunks,
               "stages": tf.num_stages, "microbatches": tf.microbatches, "placement": tf.placement,
               "transfers_in_file": tf.has_comms, "overlapped_pairs": sum(map(len, schedule.meta.get("overlap_f_b", []))),
               "peak_activations": report.peak_activations,
               "train": f"PIPEBOARD_SCHEDULES={path} pipeboard train --schedule {schedule_name(path)} "
                        f"--stages {tf.ranks} --microbatches {tf.microbatches} ..."}
        if f_ms is not None:
            costs = costs_uniform(tf.ranks, fwd_s=f_ms / 1e3, bwd_s=b_ms / 1e3, comm_s=c_ms / 1e3)
            result = simulate(schedule, costs, overlap_f_b=overlap_f_b)
            out |= {"iteration_ms": result.iteration_time_s * 1e3, "bubble_fraction": result.bubble_fraction,
                    "overlap_f_b": overlap_f_b}
    except ScheduleError as exc:
        fail(f"{path}: {exc}")
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"{path}: {out['ranks']} ranks x {out['chunks']} chunks ({out['placement']}), {out['microbatches']} "
               f"microbatches, {'with' if out['transfers_in_file'] else 'without'} transfers, "
               f"{out['overlapped_pairs']} overlapped pairs: valid, as schedule {out['schedule']}")
    if "iteration_ms" in out:
        typer.echo(f"iteration {out['iteration_ms']:.3f} ms   bubble {out['bubble_fraction']:.1%}"
                   f"   pairs {'overlapped' if overlap_f_b else 'in sequence'}")
    typer.echo(f"train with it: {out['train']}")


def register(cli: typer.Typer) -> None:
    """Add `pipeboard schedule` to the app."""
    cli.add_typer(app, name="schedule")
