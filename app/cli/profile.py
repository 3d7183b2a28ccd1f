"""`pipeboard profile` and `pipeboard models`.

    pipeboard profile MODEL [--batch-size N] [--device cpu|cuda] [--model-arg k=v ...] -o profile.json
    pipeboard profile import graph.txt -o profile.json
    pipeboard profile export profile.json -o graph.txt
    pipeboard models

MODEL is a zoo name (`pipeboard models`) or an import path `package.module:factory`. click
cannot give a group both a positional MODEL and the subcommands `import`/`export`, so the group
routes any first word that is not a subcommand to a hidden `model` command. torch is imported
inside the commands that need it. Bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperGroup

from app.cli.common import fail, parse_model_args

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
    help="Profile MODEL (a zoo name or package.module:factory), or import/export PipeDream graph.txt.\n\n"
    "Usage: pipeboard profile MODEL [--batch-size N] [--device cpu|cuda] [--model-arg k=v] -o profile.json",
    no_args_is_help=True,
    add_completion=False,
)


@profile_app.command(_MODEL_COMMAND, hidden=True)
def profile_cmd(
    model: str = typer.Argument(..., metavar="MODEL", help="zoo name or package.module:factory"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", "-b", help="samples per minibatch (zoo default if unset)"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    model_arg: list[str] = typer.Option([], "--model-arg", "-a", help="model argument key=value (repeatable)"),
    output: Path = typer.Option(Path("profile.json"), "--output", "-o", help="where to write the profile JSON"),
    warmup: int = typer.Option(3, "--warmup", help="steps run before measuring"),
    repeats: int = typer.Option(10, "--repeats", help="measured steps (medians are reported)"),
    seed: int = typer.Option(0, "--seed", help="weight seed of a zoo model"),
    threads: int = typer.Option(1, "--threads", help="torch intra-op threads (a pipeline worker uses one)"),
    cpu_matmul: Optional[str] = typer.Option(
        None, "--cpu-matmul",
        help="float32 matrix products: default (PyTorch's BLAS) or onednn, as the runs it plans will use "
             "(default: $PIPEBOARD_CPU_MATMUL, else default)"),
) -> None:
    """Measure MODEL layer by layer and write a profile JSON."""
    if device not in ("cpu", "cuda"):
        fail(f"--device must be 'cpu' or 'cuda', got {device!r}")
    if batch_size is not None and batch_size < 1:
        fail(f"--batch-size must be >= 1, got {batch_size}")
    if warmup < 0 or repeats < 1:
        fail("--warmup must be >= 0 and --repeats >= 1")
    if threads < 1:
        fail(f"--threads must be >= 1, got {threads}")
    try:
        args = parse_model_args(model_arg)
    except ValueError as exc:
        fail(str(exc))
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from trainer import cpu_matmul as matmul
    from trainer.profile.profiler import profile_model, self_check_line
    from trainer.profile.usermodel import resolve_model

    import torch

    torch.set_num_threads(threads)
    try:
        backend = matmul.configured(cpu_matmul)  # checked on every device, used on the CPU
        if device == "cpu":
            matmul.use(backend)
    except ValueError as exc:
        fail(str(exc).replace("cpu_matmul:", "--cpu-matmul:"))
    except RuntimeError as exc:
        fail(f"--cpu-matmul: {exc}")
    if device == "cuda":
        if not torch.cuda.is_available():
            fail("--device cuda: CUDA is not available on this machine")
    try:
        if ":" not in model:
            args.setdefault("seed", seed)
        resolved = resolve_model(model, batch_size, args)
        console = Console(stderr=True)
        with Progress(TextColumn("profiling {task.fields[model]}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                      TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("tracing", total=warmup + repeats, model=model)

            def progress(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total, description=what)

            prof = profile_model(resolved.model, resolved.example_input, batch_size=resolved.batch_size, device=device,
                                 warmup=warmup, repeats=repeats, progress=progress, optimizer=resolved.optimizer,
                                 model_name=model)
        prof.meta["model_args"] = {k: v for k, v in args.items() if k != "seed"}
        output.parent.mkdir(parents=True, exist_ok=True)
        prof.save(output)
    except (KeyboardInterrupt, typer.Exit):
        raise
    except Exception as exc:  # one line, never a traceback (the message names what failed)
        fail(str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}")
    typer.echo(f"wrote {output}: {len(prof.layers)} layers, {len(prof.edges)} edges, batch size {prof.batch_size}, "
               f"device {prof.device}, {prof.meta['wall_s']:.1f} s")
    typer.echo(self_check_line(prof))


@profile_app.command("import")
def import_cmd(
    graph_txt: Path = typer.Argument(..., metavar="GRAPH_TXT", help="PipeDream graph.txt"),
    output: Path = typer.Option(Path("profile.json"), "--output", "-o", help="where to write the profile JSON"),
) -> None:
    """Convert a PipeDream graph.txt into a profile JSON."""
    from trainer.profile.graphtxt import parse_graph_txt
    from trainer.profile.schema import ProfileError

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
    from trainer.profile.graphtxt import to_graph_txt
    from trainer.profile.schema import Profile, ProfileError

    try:
        prof = Profile.load(profile)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(to_graph_txt(prof))
    except (ProfileError, OSError, UnicodeDecodeError) as exc:
        fail(f"{profile}: {exc}")
    typer.echo(f"wrote {output}: {len(prof.layers)} layers, {len(prof.edges)} edges")


def models_cmd() -> None:
    """List the model zoo: name, metric and target, model arguments."""
    from rich.console import Console
    from rich.table import Table

    from trainer import zoo

    table = Table(title="pipeboard model zoo")
    for col in ("name", "metric", "target", "arguments", "description"):
        table.add_column(col)
    for d in zoo.describe():
        goal = f"{'>=' if d['higher_is_better'] else '<='} {d['target']}"
        args = ", ".join(f"{k}={v}" for k, v in d["args"].items())
        table.add_row(d["name"], d["metric"], goal, args, d["description"])
    Console().print(table)


def register(cli: typer.Typer) -> None:
    """Add `profile` (with `import`/`export`) and `models` to the `pipeboard` app."""
    cli.add_typer(profile_app, name="profile")
    cli.command("models")(models_cmd)
