"""`pipeboard profile` and `pipeboard models`.

    pipeboard profile MODEL [--batch-size N] [--device cpu|cuda] [--model-arg k=v ...] [--data PATH]
        [--precision fp32|bf16] [--calibrate [--workers W] [--microbatches M] [--weight-grads batched|immediate]
        [--optimizer NAME]] -o profile.json
    pipeboard profile import graph.txt -o profile.json
    pipeboard profile export profile.json -o graph.txt
    pipeboard models

MODEL is a zoo name (`pipeboard models`) or a task factory `package.module:function` or
`path/to/file.py:function` (pipeboard.trainer.spec). click
cannot give a group both a positional MODEL and the subcommands `import`/`export`, so the group
routes any first word that is not a subcommand to a hidden `model` command. torch is imported
inside the commands that need it. Bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperGroup

from pipeboard.app.cli.common import fail, parse_model_args

_MODEL_COMMAND = "model"


class ProfileGroup(TyperGroup):
    """Treats `pipeboard profile MODEL ...` as `pipeboard profile model MODEL ...`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = [_MODEL_COMMAND, *args]
        return super().parse_args(ctx, args)


profile_app = typer.Typer(
    cls=ProfileGroup,
    name="profile",
    help="Profile MODEL (a zoo name, or a task factory package.module:function or path/to/file.py:function), "
    "or import/export PipeDream graph.txt.\n\n"
    "Usage: pipeboard profile MODEL [--batch-size N] [--device cpu|cuda] [--model-arg k=v] [--data PATH] "
    "[--precision fp32|bf16] -o profile.json",
    no_args_is_help=True,
    add_completion=False,
)


def calibration_options(spec: str, batch_size: int, workers: int, microbatches: int, weight_grads: str,
                        optimizer: str | None) -> dict:
    """trainer.calibrate's options for a run of ``workers`` local processes, ``microbatches``
    microbatches of ``batch_size`` per step: the flags a job's profiling child gets
    (profiles.calibration_args), read by that child's own parser, so both measure the same."""
    from pipeboard.app.services import profile_run, profiles

    flags = profiles.calibration_args(workers, batch_size * microbatches, weight_grads, optimizer=optimizer,
                                      microbatches=microbatches)
    return profile_run.options_of(profile_run.parser().parse_args(["--source", spec, "-o", "-", *flags]))


def measure(spec: str, *, batch_size: int | None, device: str, model_args: dict, data: str | None,
            precision: str, warmup: int, repeats: int, seed: int, threads: int, cpu_matmul: str | None,
            calibration: dict | None = None):
    """Build SPEC's task, check it, and profile its model: the Profile (one-line errors via
    ``fail``). Shared by `pipeboard profile` and `pipeboard plan SPEC`. ``calibration``
    (``calibration_options``): trainer.calibrate's calibrated profile, as a job's."""
    if device not in ("cpu", "cuda"):
        fail(f"--device must be 'cpu' or 'cuda', got {device!r}")
    if batch_size is not None and batch_size < 1:
        fail(f"--batch-size must be >= 1, got {batch_size}")
    if warmup < 0 or repeats < 1:
        fail("--warmup must be >= 0 and --repeats >= 1")
    if threads < 1:
        fail(f"--threads must be >= 1, got {threads}")
    from pipeboard.trainer.precision import PRECISIONS

    if precision not in PRECISIONS:
        fail(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from pipeboard.trainer import cpu_matmul as matmul
    from pipeboard.trainer.spec import load_task
    from pipeboard.trainer.task import TaskError, check_task

    import torch

    # a calibrated profile times the layers on the threads each of the run's workers will have
    torch.set_num_threads((calibration or {}).get("threads") or threads)
    try:
        backend = matmul.configured(cpu_matmul)  # checked on every device, used on the CPU
        if device == "cpu":
            matmul.use(backend)
    except ValueError as exc:
        fail(str(exc).replace("cpu_matmul:", "--cpu-matmul:"))
    except RuntimeError as exc:
        fail(f"--cpu-matmul: {exc}")
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: CUDA is not available on this machine")
    try:
        task = load_task(spec, model_args, data, seed)
        bs = batch_size or task.batch_size
        check_task(task, bs)
    except TaskError as exc:
        fail(str(exc))
    try:
        console = Console(stderr=True)
        with Progress(TextColumn("profiling {task.fields[model]}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                      TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True) as bar:
            job = bar.add_task("capturing", total=warmup + repeats, model=spec)

            def progress(done: int, total: int, what: str) -> None:
                bar.update(job, completed=done, total=total, description=what)

            if calibration is not None:
                from pipeboard.trainer.calibrate import calibrated_profile

                prof = calibrated_profile(spec, model_args, bs, device, repeats, warmup=warmup, task=task,
                                          progress=progress, precision=precision, **calibration)
            else:
                from pipeboard.trainer.calibrate import profile_task

                prof = profile_task(task, bs, device=device, warmup=warmup, repeats=repeats, progress=progress,
                                    model_name=spec, precision=precision, layers=task.layers,
                                    optimizer=task.optimizer_name if task.optimizer_name != "custom" else "adam")
    except (KeyboardInterrupt, typer.Exit):
        raise
    except Exception as exc:  # one line, never a traceback (the message names what failed)
        fail(str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}")
    prof.meta["model_args"] = dict(model_args)
    if data is not None:
        prof.meta["data"] = data
    return prof


@profile_app.command(_MODEL_COMMAND, hidden=True)
def profile_cmd(
    model: str = typer.Argument(..., metavar="MODEL",
                                help="zoo name, or a task factory package.module:function or path/to/file.py:function"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", "-b", help="samples per minibatch (the task's default if unset)"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    model_arg: list[str] = typer.Option([], "--model-arg", "-a", help="model argument key=value (repeatable)"),
    data: Optional[str] = typer.Option(None, "--data", help="data location, handed to the task factory as data="),
    precision: str = typer.Option("fp32", "--precision", help="fp32 or bf16 (autocast): the precision the runs will use"),
    output: Path = typer.Option(Path("profile.json"), "--output", "-o", help="where to write the profile JSON"),
    warmup: int = typer.Option(3, "--warmup", help="steps run before measuring"),
    repeats: int = typer.Option(10, "--repeats", help="measured steps (medians are reported)"),
    seed: int = typer.Option(0, "--seed", help="weight seed of the task's model"),
    threads: int = typer.Option(1, "--threads", help="torch intra-op threads (a pipeline worker uses one)"),
    cpu_matmul: Optional[str] = typer.Option(
        None, "--cpu-matmul",
        help="float32 matrix products: default (PyTorch's BLAS) or onednn, as the runs it plans will use "
             "(default: $PIPEBOARD_CPU_MATMUL, else default)"),
    calibrate: bool = typer.Option(
        False, "--calibrate",
        help="Also measure what a job's profile measures for its run (--batch-size is the microbatch): the link "
             "between two worker processes, the runtime's per-action overhead and data loading, the layers with the "
             "other workers training meanwhile on the threads each has, W(-1) at the whole batch (batched weight "
             "gradients) and the pilot runs; `pipeboard plan` then predicts with them."),
    workers: int = typer.Option(2, "--workers", help="With --calibrate: the run's local worker processes."),
    microbatches: int = typer.Option(4, "--microbatches", help="With --calibrate: microbatches per step of the run."),
    weight_grads: str = typer.Option("batched", "--weight-grads", help="With --calibrate: batched or immediate."),
    optimizer: Optional[str] = typer.Option(None, "--optimizer",
                                            help="With --calibrate: the optimizer the run steps (default: the model's)."),
) -> None:
    """Measure MODEL layer by layer and write a profile JSON."""
    try:
        args = parse_model_args(model_arg)
    except ValueError as exc:
        fail(str(exc))
    calibration = None
    if calibrate:
        if workers < 1 or microbatches < 1:
            fail(f"--workers and --microbatches must be >= 1, got {workers} and {microbatches}")
        if weight_grads not in ("batched", "immediate"):
            fail(f"--weight-grads: batched or immediate, got {weight_grads!r}")
        if batch_size is None:
            fail("--calibrate: give --batch-size (the microbatch the run's workers compute)")
        calibration = calibration_options(model, batch_size, workers, microbatches, weight_grads, optimizer)
    prof = measure(model, batch_size=batch_size, device=device, model_args=args, data=data, precision=precision,
                   warmup=warmup, repeats=repeats, seed=seed, threads=threads, cpu_matmul=cpu_matmul,
                   calibration=calibration)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        prof.save(output)
    except OSError as exc:
        fail(f"--output: cannot write {str(output)!r}: {exc.strerror}")
    typer.echo(f"wrote {output}: {len(prof.layers)} layers, {len(prof.edges)} edges, batch size {prof.batch_size}, "
               f"device {prof.device}, {precision}, {prof.meta['wall_s']:.1f} s")
    from pipeboard.trainer.profile.profiler import self_check_line

    typer.echo(self_check_line(prof))


@profile_app.command("import")
def import_cmd(
    graph_txt: Path = typer.Argument(..., metavar="GRAPH_TXT", help="PipeDream graph.txt"),
    output: Path = typer.Option(Path("profile.json"), "--output", "-o", help="where to write the profile JSON"),
) -> None:
    """Convert a PipeDream graph.txt into a profile JSON."""
    from pipeboard.trainer.profile.graphtxt import parse_graph_txt
    from pipeboard.trainer.profile.schema import ProfileError

    try:
        text = graph_txt.read_text()
        prof = parse_graph_txt(text, model=graph_txt.resolve().parent.name)
        output.parent.mkdir(parents=True, exist_ok=True)
        prof.save(output)
    except (ProfileError, OSError, UnicodeDecodeError) as exc:
        fail(f"{graph_txt}: {exc}")
    typer.echo(f"wrote {output}: {len(prof.layers)} layers, {len(prof.edges)} edges (from {graph_txt})")


@profile_app.command("export")
def export_cmd(
    profile: Path = typer.Argument(..., metavar="PROFILE", help="profile JSON (or graph.txt)"),
    output: Path = typer.Option(Path("graph.txt"), "--output", "-o", help="where to write graph.txt"),
) -> None:
    """Write a profile as a PipeDream graph.txt."""
    from pipeboard.trainer.profile.graphtxt import to_graph_txt
    from pipeboard.trainer.profile.files import load_profile
    from pipeboard.trainer.profile.schema import ProfileError

    try:
        prof = load_profile(profile)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(to_graph_txt(prof))
    except (ProfileError, OSError, UnicodeDecodeError) as exc:
        fail(f"{profile}: {exc}")
    typer.echo(f"wrote {output}: {len(prof.layers)} layers, {len(prof.edges)} edges")


def models_cmd() -> None:
    """List the model zoo: name, metric and target, model arguments."""
    from rich.console import Console
    from rich.table import Table

    from pipeboard.trainer import zoo

    table = Table(title="pipeboard model zoo")
    for col in ("name", "metric", "target", "arguments", "description"):
        table.add_column(col)
    for d in zoo.describe():
        goal = f"{'>=' if d['higher_is_better'] else '<='} {d['target']}"
        args = ", ".join(f"{k}={v}" for k, v in d["args"].items())
        table.add_row(d["name"], d["metric"], goal, args, d["description"])
    console = Console()
    console.print(table)
    console.print("Your own model and data: write a task factory, a function returning pipeboard.trainer.Task (see README, "
                  "'Your own model and data'), and pass it as --model path/to/file.py:function or "
                  "package.module:function, with --model-arg k=v and --data PATH.", highlight=False)


def register(cli: typer.Typer) -> None:
    """Add `profile` (with `import`/`export`) and `models` to the `pipeboard` app."""
    cli.add_typer(profile_app, name="profile")
    cli.command("models")(models_cmd)
