"""`pipeboard simulate`: predict a schedule's timeline from a plan or from uniform stage times.

    pipeboard simulate [PLAN.json] [--stages P --fwd T --bwd T] --schedule NAME --microbatches M
                       [--chunks V] [--comm T] [--weight-grads batched|immediate] [--per-update K]
                       [--trace out.json] [--gantt out.html] [--json]

Times on the command line are milliseconds per microbatch per stage. Numbers are parsed here,
not by click, so that every bad value gets one line naming the option and exit code 2. The
schedules, and which options each takes, come from the registry (trainer/schedule/registry.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from pipeboard.app.cli.common import RegistryHelpCommand, without_blas_threads


class UsageError(ValueError):
    """A bad command line; the message names the option."""


def _number(name: str, raw: str | None, kind: type, *, minimum: float, default: Any = None) -> Any:
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise UsageError(f"{name}: expected {'an integer' if kind is int else 'a number'}, got {raw!r}") from None
    if value != value or value < minimum or value == float("inf"):
        raise UsageError(f"{name}: must be >= {minimum}, got {raw}")
    return value


def _replicas(raw: str | None) -> list[int] | None:
    if raw is None:
        return None
    try:
        reps = [int(x) for x in raw.split(",")]
    except ValueError:
        raise UsageError(f"--replicas: expected comma-separated integers like 1,2,1, got {raw!r}") from None
    if any(r < 1 for r in reps):
        raise UsageError(f"--replicas: every stage needs >= 1 replica, got {raw}")
    return reps


def _batch_weight_grads(weight_grads: str | None, split_backward: bool | None) -> bool:
    from pipeboard.trainer.schedule.registry import WEIGHT_GRADS  # `pipeboard train --weight-grads`

    """--weight-grads as build's batch_weight_grads; build() alone decides where it applies (where
    the schedule honours it: not dp, not zb-h1), as it does for `pipeboard train`. The default is batched, as train's, except with
    --split-backward, which asks for each W on its own (build refuses it with batched)."""
    if weight_grads is None:
        return not split_backward
    if weight_grads not in WEIGHT_GRADS:
        raise UsageError(f"--weight-grads: must be one of {', '.join(WEIGHT_GRADS)}, got {weight_grads!r}")
    return weight_grads == "batched"


def _plan_costs(path: Path, schedule: str):
    from pipeboard.trainer.schedule import registry

    from pipeboard.trainer.schedule.actions import ScheduleError
    from pipeboard.trainer.schedule.action_costs import costs_from_plan, data_parallel_costs_from_plan, plan_replicas

    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"PLAN: cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"PLAN: {path} is not JSON (line {exc.lineno}: {exc.msg})") from None
    try:
        if registry.is_data_parallel(schedule):  # the whole model on every worker of the plan
            costs, workers = data_parallel_costs_from_plan(data)
            return costs, [workers]
        return costs_from_plan(data), plan_replicas(data)
    except ScheduleError as exc:
        raise UsageError(f"PLAN: {exc}") from None


def simulate_command(
    plan: Optional[Path],
    stages: str | None,
    fwd: str | None,
    bwd: str | None,
    comm: str | None,
    allreduce: str | None,
    replicas: str | None,
    schedule: str | None,
    microbatches: str | None,
    chunks: str | None,
    vertical_sync: bool,
    split_backward: bool | None,
    shared_links: bool = False,
    weight_grads: str | None = None,
    per_update: str | None = None,
) -> tuple[Any, Any]:
    """Build and simulate; returns (schedule, SimResult). Raises UsageError or ScheduleError."""
    from pipeboard.trainer.schedule import build, registry
    from pipeboard.trainer.schedule.action_costs import costs_uniform
    from pipeboard.trainer.schedule.simulator import simulate

    if schedule is None:
        raise UsageError(f"--schedule: required, one of {', '.join(registry.names())}")
    if not registry.known(schedule):
        raise UsageError(f"--schedule: unknown schedule {schedule!r} (known: {', '.join(registry.names())})")
    spec = registry.get(schedule)
    asynchronous = registry.either(registry.having(synchronous=False), quote="")
    m = _number("--microbatches", microbatches, int, minimum=1)
    if m is None:
        raise UsageError(f"--microbatches: required (microbatches per iteration, or in total for {asynchronous})")
    k = _number("--per-update", per_update, int, minimum=1, default=1)
    if per_update is not None and spec.synchronous:
        raise UsageError(f"--per-update: {asynchronous} only ({schedule} updates once per iteration of its microbatches)")
    v = _number("--chunks", chunks, int, minimum=1, default=1)
    batch_w = _batch_weight_grads(weight_grads, split_backward)
    comm_s = _number("--comm", comm, float, minimum=0, default=0.0) / 1e3
    allreduce_s = _number("--allreduce", allreduce, float, minimum=0, default=0.0) / 1e3
    reps = _replicas(replicas)
    if plan is not None:
        if stages is not None or fwd is not None or bwd is not None:
            raise UsageError("PLAN: give either a plan or --stages/--fwd/--bwd, not both")
        costs, plan_reps = _plan_costs(plan, schedule)
        reps = reps or plan_reps
        p = len(costs)
    else:
        p = _number("--stages", stages, int, minimum=1)
        f = _number("--fwd", fwd, float, minimum=0)
        b = _number("--bwd", bwd, float, minimum=0)
        missing = [n for n, x in (("--stages", p), ("--fwd", f), ("--bwd", b)) if x is None]
        if missing:
            raise UsageError(f"{missing[0]}: required without a PLAN.json (ms per microbatch per stage)")
        costs = costs_uniform(1 if spec.data_parallel else p, f / 1e3, b / 1e3, comm_s=comm_s, allreduce_s=allreduce_s)
    if plan is not None and (comm is not None or allreduce is not None):
        from dataclasses import replace

        costs = [
            replace(c, **({"send_act_s": comm_s, "send_grad_s": comm_s} if comm is not None else {}),
                    **({"allreduce_s": allreduce_s} if allreduce is not None else {}))
            for c in costs
        ]  # fmt: skip
    built = build(
        schedule, p, m, replicas=reps, chunks=v, vertical_sync=vertical_sync, split_backward=split_backward,
        batch_weight_grads=batch_w, per_update=k,
    )
    return built, simulate(built, costs, shared_links=shared_links)


def _print_human(schedule: Any, result: Any) -> None:
    s = result.summary()
    p = schedule.meta["physical_stages"]
    typer.echo(
        f"{schedule.name}: {p} stage{'s' if p != 1 else ''}"
        + (f" x {schedule.meta['chunks']} chunks" if schedule.meta["chunks"] > 1 else "")
        + f", {len(schedule.workers)} workers, {schedule.microbatches} microbatches"
        + (f", {schedule.meta['per_update']} per update" if "per_update" in schedule.meta else "")
        + (", weight gradients batched before each update" if schedule.meta.get("batch_weight_grads") else "")
    )
    typer.echo(
        f"iteration {s['iteration_time_s'] * 1e3:.3f} ms   throughput {s['throughput']:.2f} {s['throughput_unit']}"
        f"   bubble {s['bubble_fraction']:.1%}"
    )
    typer.echo("worker  stage  replica  utilization  peak activations  weight versions")
    for w, spec in enumerate(schedule.workers):
        stages = "+".join(str(x) for x in spec.stages)
        typer.echo(
            f"{w:>6}  {stages:>5}  {spec.replica:>7}  {s['utilization'][w]:>10.1%}"
            f"  {s['peak_activations'][w]:>16}  {s['stashed_versions'][w]:>15}"
        )


def register(cli: typer.Typer) -> None:
    """Add `pipeboard simulate` to the app."""

    opt = typer.Option
    asynchronous = "{schedules synchronous=False}"
    chunked = "{schedules chunks=True}"
    ignoring = "{schedules and weight_grads=()}"

    @cli.command("simulate", cls=RegistryHelpCommand, epilog="{schedules listed}")
    def simulate_cmd(
        plan: Optional[Path] = typer.Argument(
            None, metavar="PLAN.json", help="A plan JSON from `pipeboard plan` (or use --stages)."
        ),
        stages: Optional[str] = opt(None, "--stages", metavar="P", help="Pipeline stages (uniform)."),
        fwd: Optional[str] = opt(None, "--fwd", metavar="MS", help="Forward ms per microbatch per stage."),
        bwd: Optional[str] = opt(None, "--bwd", metavar="MS", help="Backward ms per microbatch per stage."),
        comm: Optional[str] = opt(None, "--comm", metavar="MS", help="Ms per activation or gradient transfer (0)."),
        allreduce: Optional[str] = opt(None, "--allreduce", metavar="MS", help="Ms per all-reduce among replicas."),
        replicas: Optional[str] = opt(None, "--replicas", metavar="R,R,...", help="Replicas per stage, e.g. 1,2,1."),
        schedule: Optional[str] = opt(None, "--schedule", metavar="NAME", help="{schedules} (listed below)."),
        microbatches: Optional[str] = opt(
            None, "--microbatches", metavar="M",
            help=f"Microbatches per iteration; {asynchronous}: minibatches/microbatches in total, --per-update of "
                 "them per weight update."),
        chunks: Optional[str] = opt(None, "--chunks", metavar="V", help=f"Model chunks per worker ({chunked})."),
        vertical_sync: bool = opt(False, "--vertical-sync",
                                  help="{schedules vertical_sync=True}: one weight version per minibatch."),
        split_backward: Optional[bool] = opt(None, "--split-backward/--no-split-backward", help="B as BI and W."),
        weight_grads: Optional[str] = opt(
            None, "--weight-grads", metavar="batched|immediate",
            help="As `pipeboard train`: batched (default) runs each B as input gradients and one pass per update "
                 f"the weight gradients of all its microbatches; immediate: each B does both. {ignoring} ignore "
                 "it; with --split-backward the default is immediate."),
        per_update: Optional[str] = opt(
            None, "--per-update", metavar="K",
            help=f"{asynchronous} only: microbatches per weight update (one batch; default 1, PipeDream's original, "
                 "one update per minibatch). To predict `pipeboard train --schedule pipedream --microbatches K` "
                 "(K microbatches per batch, one update per batch) over N batches, pass --per-update K "
                 "--microbatches K*N."),
        shared_links: bool = opt(False, "--shared-links", help="Both directions between two workers share a link."),
        trace: Optional[Path] = opt(None, "--trace", help="Write the predicted timeline as Chrome trace JSON."),
        gantt: Optional[Path] = opt(None, "--gantt", help="Write the predicted Gantt chart as HTML."),
        as_json: bool = opt(False, "--json", help="Print the results as JSON."),
    ) -> None:
        """Predict iteration time, bubble, utilisation and memory of a pipeline schedule."""
        import gc

        # A one-shot command that builds up to millions of acyclic objects (actions, columns):
        # the cyclic collector would only rescan them (docs/schedules.md, "Building fast").
        gc.disable()
        without_blas_threads()
        from pipeboard.trainer.schedule.actions import ScheduleError

        try:
            built, result = simulate_command(
                plan, stages, fwd, bwd, comm, allreduce, replicas, schedule, microbatches, chunks,
                vertical_sync, split_backward, shared_links, weight_grads, per_update,
            )  # fmt: skip
            if trace is not None:
                from pipeboard.trainer.schedule.trace import to_chrome_trace

                doc = to_chrome_trace(result.timeline, label="predicted", metadata=result.summary())
                trace.write_text(json.dumps(doc))
            if gantt is not None:
                from pipeboard.trainer.schedule.gantt import figure, write_html

                title = f"{built.name}: predicted, bubble {result.bubble_fraction:.1%}"
                write_html(figure(result.timeline, title=title), str(gantt))
        except (UsageError, ScheduleError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        except OSError as exc:
            typer.echo(f"error: cannot write {exc.filename}: {exc.strerror}", err=True)
            raise typer.Exit(2) from None
        if as_json:
            extra = {"batch_weight_grads": bool(built.meta.get("batch_weight_grads"))}
            if "per_update" in built.meta:  # an asynchronous schedule
                extra["per_update"] = built.meta["per_update"]
            typer.echo(json.dumps({**result.summary(), **extra}))
        else:
            _print_human(built, result)
