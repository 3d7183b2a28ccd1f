"""`pipeboard plan`: split a profile across a cluster with PipeDream's DP or a baseline.

    pipeboard plan PROFILE|SPEC --workers N [N ...] --bandwidth B [B ...] [--schedule NAME [--microbatches M]
        [--weight-grads batched|immediate] [--recompute none|all|0,2] [--memory BYTES]
        [--optimizer adam|adamw|sgd|sgd-plain]]
        [--memory-constraint] [--straight] [--fewer-workers] [--activation-compression R]
        [--method pipedream|uniform|time|params|dp] [--json] [-o plan.json] [--compare]

With --schedule, the plan is the one `POST /plans` and a job choose for the same input
(trainer/choose.py: PipeDream's plan against the baselines under the cost model that predicts
the run; with --memory, the fastest that fits, recompute on where a stage would not), printed
with that prediction: time per step, memory per stage, the comparison against data parallel. PROFILE is a profile JSON or graph.txt. A model SPEC instead (a zoo name or a task factory, as
`pipeboard profile` takes, with --model-arg, --data, --batch-size and --precision) is profiled
first, in this process. Planning a profile imports no torch, so that command starts fast. Bad input ends
with one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import typer

from pipeboard.app.cli.common import fail, text_table, without_blas_threads
from typer.core import TyperCommand

# Options that take several values, as in `--workers 4 4`.
_MULTI = {"--workers", "-n", "--bandwidth", "-b"}
DEFAULT_METHOD = "pipedream"  # the planner's method when --method is not given


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def spread_multi_values(args: list[str]) -> list[str]:
    """Rewrite `--workers 4 4` as `--workers 4 --workers 4` (click takes one value per use).

    Only numbers are taken as extra values, so a PROFILE path after the list stays positional.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        out.append(token)
        i += 1
        if token in _MULTI and i < len(args):
            out.append(args[i])  # the first value, whatever it is (click reports a missing one)
            i += 1
            while i < len(args) and _is_number(args[i]):
                out.extend([token, args[i]])
                i += 1
    return out


class MultiValueCommand(TyperCommand):
    def parse_args(self, ctx, args):
        return super().parse_args(ctx, spread_multi_values(list(args)))



def _parse_numbers(values: list[str], name: str, kind) -> list:
    out = []
    for raw in values:
        try:
            value = float(raw)
        except ValueError:
            fail(f"{name}: {raw!r} is not a number")
        if kind is int:
            if not math.isfinite(value) or not value.is_integer():
                fail(f"{name}: {raw!r} is not a whole number of workers")
            value = int(value)
        out.append(value)
    return out


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def _print_plan(plan) -> None:
    exactness = "exact antichain states" if plan.exact else "linearised topological order (states exceeded the limit)"
    lines = [
        f"{plan.model or 'model'} · method {plan.method} · {plan.states} states, {exactness}",
        f"cluster {' x '.join(str(w) for w, _ in plan.cluster)} = {plan.total_workers} workers "
        f"({plan.workers_used} used), NOAM {plan.noam}",
        f"time per minibatch: pipeline {_fmt_s(plan.predicted_time_s)}, single worker "
        f"{_fmt_s(plan.single_worker_time_s)}, data parallel {_fmt_s(plan.data_parallel_time_s)}",
        f"speedup: {plan.speedup_vs_single:.3f}x vs one worker, {plan.speedup_vs_data_parallel:.3f}x vs data parallel",
        "",
    ]
    rows = []
    for st in plan.stages:
        layers = f"{len(st.layers)}: {st.layers[0]}.." if st.layers else "-"
        workers = ",".join(map(str, st.workers)) if len(st.workers) <= 4 else f"{st.workers[0]}..{st.workers[-1]}"
        rows.append([str(st.index), layers, f"{st.start_state}-{st.end_state}", str(st.replicas), workers,
                     f"{st.compute_s * 1e3:.2f}", f"{st.allreduce_s * 1e3:.2f}", f"{st.send_s * 1e3:.2f}",
                     f"{st.time_s * 1e3:.2f}", f"{st.memory_bytes / 1e9:.2f}"])
    lines += text_table("stages (times in ms per minibatch)",
                        ["#", "layers", "states", "x", "workers", "compute", "allreduce", "send", "time", "mem GB"],
                        rows, left={"layers", "workers"})
    lines.append("")
    for level in sorted(plan.levels, key=lambda lv: -lv.level):
        ranges = " ".join(f"[{s.start},{s.end})x{s.replicas}" for s in level.stages)
        lines.append(f"level {level.level} ({level.workers} @ {level.bandwidth / 1e9:g} GB/s): {ranges}")
    sys.stdout.write("\n".join(lines) + "\n")


def _print_comparison(plans) -> None:
    rows = [[p.method, str(len(p.stages)), str(p.workers_used), f"{p.predicted_time_s * 1e3:.3f}",
             f"{p.throughput_per_s:.2f}", f"{p.speedup_vs_single:.3f}x", f"{p.speedup_vs_data_parallel:.3f}x"]
            for p in plans]
    lines = text_table("predicted throughput per method",
                       ["method", "stages", "workers", "ms/minibatch", "minibatch/s", "vs 1 worker", "vs DP"],
                       rows, left={"method"})
    sys.stdout.write("\n" + "\n".join(lines) + "\n")


OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-plain")  # as POST /plans' optimizer


def parse_recompute(raw: str) -> str | list[int]:
    """--recompute as a job's layout.recompute: none, all, or stage numbers (0,2)."""
    if raw in ("none", "all"):
        return raw
    try:
        stages = [int(part) for part in raw.split(",")]
    except ValueError:
        stages = []
    if not stages or any(s < 0 for s in stages):
        fail(f"--recompute: none, all, or stage numbers from 0 (as 0,2); got {raw!r}")
    return stages


def _chosen(prof, levels, method: str, schedule: str, microbatches: int, weight_grads: str, *,
            memory: float | None = None, recompute: str | list[int] = "none", optimizer: str = "adam"):
    """(plan, predicted summary) as POST /plans makes them: trainer.choose, one function for both."""
    from pipeboard.app.services.planning import predicted_summary
    from pipeboard.trainer import choose
    from pipeboard.trainer.schedule import registry

    if not registry.known(schedule):
        fail(f"--schedule: unknown schedule {schedule!r} (known: {', '.join(registry.names())})")
    if weight_grads not in ("batched", "immediate"):
        fail(f"--weight-grads: batched or immediate, got {weight_grads!r}")
    if optimizer not in OPTIMIZERS:
        fail(f"--optimizer: one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if memory is not None and not memory > 0:
        fail(f"--memory: must be > 0 bytes, got {memory:g}")
    data = prof.to_dict()
    try:
        plan = choose.choose_plan(data, levels, memory_bytes=memory, method=method, schedule=schedule,
                                  microbatches=microbatches, weight_grads=weight_grads, recompute=recompute,
                                  optimizer=optimizer)
        sched, sim = choose.simulate_plan(plan, schedule, microbatches, samples_per_microbatch=prof.batch_size,
                                          weight_grads=weight_grads, profile_data=data, optimizer=optimizer,
                                          recompute=choose.chosen_recompute(plan, recompute))
    except choose.ChoiceError as exc:
        fail(str(exc))
    summary = predicted_summary(plan, sched, sim, microbatches, timeline_limit=0)
    summary.pop("timeline")
    return plan, summary


def _print_predicted(p: dict, schedule: str) -> None:
    """The one prediction: time per step, memory per stage, the comparison against data parallel."""
    step = p["steady_step_s"] if p["steady_step_s"] is not None else p["iteration_time_s"]
    memory = ", ".join(f"{b / 1e6:.1f}" for b in p["stage_memory_bytes"] or [])
    versus = p["speedup_vs_data_parallel"]
    redo = ",".join(map(str, p["recompute_stages"])) or "none"
    sys.stdout.write(f"\npredicted under {schedule}, {p['microbatches']} microbatches ({p['cost_model']} costs): "
                     f"{_fmt_s(step)} per step, bubble {p['bubble_fraction']:.1%}"
                     + (f", peak MB per stage {memory}" if memory else "") + f", recompute {redo}"
                     + (f"; {versus:.2f}x data parallel's speed" if versus else "") + "\n")


def _is_zoo_name(name: str) -> bool:
    from pipeboard.trainer import zoo

    return name in zoo.names()


def plan_command(
    profile: Path = typer.Argument(..., metavar="PROFILE|SPEC",
                                   help="Profile JSON or PipeDream graph.txt, or a model SPEC (zoo name, "
                                        "package.module:function, path/to/file.py:function) to profile first."),
    workers: list[str] = typer.Option(..., "--workers", "-n", help="Workers per level, innermost first: --workers 4 4."),
    bandwidth: list[str] = typer.Option(..., "--bandwidth", "-b", help="Bytes/s per level, innermost first."),
    memory: float = typer.Option(None, "--memory", help="Memory per worker in bytes (default 16e9 with --memory-constraint)."),
    memory_constraint: bool = typer.Option(False, "--memory-constraint", help="Reject stages whose stash exceeds --memory."),
    straight: bool = typer.Option(False, "--straight", help="No replication: one worker per stage."),
    fewer_workers: bool = typer.Option(False, "--fewer-workers", help="Allow leaving workers idle if that is faster."),
    activation_compression: float = typer.Option(1.0, "--activation-compression", help="Divide activation transfer times by R."),
    method: str | None = typer.Option(None, "--method", help=f"pipedream | uniform | time | params | dp (default {DEFAULT_METHOD})."),
    schedule: str = typer.Option(
        None, "--schedule",
        help="The schedule the run will have: the plan is the fastest candidate under the cost model that predicts "
             "it, as POST /plans chooses, with its predicted step and memory per stage. With --memory: the cap is "
             "checked by the memory model (weights by versions kept, gradients, optimizer state, activations in "
             "flight, boundary buffers) under this schedule, turning on activation recompute for the stages that "
             "would not fit."),
    microbatches: int = typer.Option(8, "--microbatches", help="With --schedule: microbatches per batch."),
    weight_grads: str = typer.Option("batched", "--weight-grads",
                                     help="With --schedule: batched or immediate, as the run's."),
    optimizer: str = typer.Option("adam", "--optimizer", help="With --schedule: adam, adamw, sgd or sgd-plain."),
    recompute: str = typer.Option("none", "--recompute",
                                  help="With --schedule: activation recompute as a job's layout.recompute: none, all, "
                                       "or stage numbers (0,2); with --memory more stages may be turned on."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
    output: Path = typer.Option(None, "-o", "--output", help="Also write the plan JSON here."),
    compare: bool = typer.Option(False, "--compare", help="Plan with every method and print a throughput table."),
    max_states: int = typer.Option(2000, "--max-states", help="Use exact antichain states up to this many."),
    model_arg: list[str] = typer.Option([], "--model-arg", help="SPEC: model argument k=v (repeatable)."),
    data: str = typer.Option(None, "--data", help="SPEC: data location handed to the task factory."),
    batch_size: int = typer.Option(None, "--batch-size", help="SPEC: samples per minibatch to profile."),
    precision: str = typer.Option("fp32", "--precision", help="SPEC: fp32 or bf16, as the runs will train."),
) -> None:
    """Plan a pipeline: stage boundaries and replication per level (PipeDream's optimizer)."""
    from pipeboard.trainer.plan import PlanError, levels_from_lists
    from pipeboard.trainer.plan import compare as compare_methods
    from pipeboard.trainer.plan import plan as make_plan
    from pipeboard.trainer.profile.files import load_profile
    from pipeboard.trainer.profile.schema import ProfileError

    prof, predicted = None, None
    if profile.is_file():
        without_blas_threads()
    else:
        spec = str(profile)
        if ":" not in spec and not _is_zoo_name(spec):
            fail(f"PROFILE: no such file {spec!r} (nor a zoo name or a task factory module:function)")
        from pipeboard.app.cli.common import parse_model_args
        from pipeboard.app.cli.profile import measure

        try:
            args = parse_model_args(model_arg)
        except ValueError as exc:
            fail(str(exc))
        prof = measure(spec, batch_size=batch_size, device="cpu", model_args=args, data=data, precision=precision,
                       warmup=2, repeats=5, seed=0, threads=1, cpu_matmul=None)
    try:
        prof = prof or load_profile(profile)
        levels = levels_from_lists(_parse_numbers(workers, "workers", int), _parse_numbers(bandwidth, "bandwidth", float))
        options = dict(memory_bytes=memory, memory_constraint=memory_constraint, straight=straight,
                       fewer_workers=fewer_workers, activation_compression=activation_compression,
                       max_states=max_states)
        if schedule is not None and microbatches < 1:
            fail(f"--microbatches: must be >= 1, got {microbatches}")
        if schedule is None and recompute != "none":
            fail("--recompute: give it with --schedule (the schedule decides what recompute saves)")
        planner_only = straight or fewer_workers or activation_compression != 1.0  # options POST /plans lacks
        if schedule is not None and memory is not None and planner_only:
            # the planner's own options under a cap: its plan and the baselines checked by memory_fit
            # (no choice POST /plans can make, so no prediction of the service's is printed)
            from pipeboard.trainer.plan.memory_fit import plan_under_cap

            if compare or method is not None or memory_constraint or recompute != "none":
                fail("--schedule: with --memory and --straight, --fewer-workers or --activation-compression, give "
                     "it without --compare, --method, --memory-constraint or --recompute")
            options.pop("memory_bytes"), options.pop("memory_constraint")
            result, _ = plan_under_cap(prof, levels, memory, schedule, microbatches, optimizer=optimizer, **options)
        elif schedule is not None:
            if compare or memory_constraint or planner_only:
                fail("--schedule: give it without --compare, --memory-constraint, --straight, --fewer-workers or "
                     "--activation-compression (the choice POST /plans makes has none), or with --memory")
            result, predicted = _chosen(prof, levels, method or DEFAULT_METHOD, schedule, microbatches, weight_grads,
                                        memory=memory, recompute=parse_recompute(recompute), optimizer=optimizer)
        elif compare:
            plans = compare_methods(prof, levels, **options)
            result = plans[0]
        else:
            result = make_plan(prof, levels, method=method or DEFAULT_METHOD, **options)
    except (PlanError, ProfileError) as exc:
        fail(str(exc))
    except UnicodeDecodeError:
        fail(f"PROFILE: {str(profile)!r} is not a text file (expected a profile JSON or a graph.txt)")
    if output is not None:
        try:
            result.save(output)
        except OSError as exc:
            fail(f"--output: cannot write {str(output)!r}: {exc.strerror}")
    if as_json:
        data = result.to_dict()
        if compare:
            data["comparison"] = [
                {"method": p.method, "predicted_time_s": p.predicted_time_s, "throughput_per_s": p.throughput_per_s,
                 "speedup_vs_single": p.speedup_vs_single, "speedup_vs_data_parallel": p.speedup_vs_data_parallel}
                for p in plans
            ]
        if predicted is not None:
            data["predicted"] = predicted
        sys.stdout.write(json.dumps(data) + "\n")
        return
    _print_plan(result)
    if predicted is not None:
        _print_predicted(predicted, schedule)
    if compare:
        _print_comparison(plans)


def register(cli: typer.Typer) -> None:
    """Add `pipeboard plan` to the `pipeboard` app."""
    cli.command(name="plan", cls=MultiValueCommand)(plan_command)
