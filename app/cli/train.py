"""`pipeboard train`: run a model's pipeline for real (pipeboard.trainer.runtime) with a progress bar.

    pipeboard train --config run.json [--json] [--job-id N [--attempt A]] [--events-jsonl PATH] [--torchrun]
    pipeboard train --tuned tune.json [--epochs E | --steps S | --target METRIC] [--device D] [--json] ...
    pipeboard train --model SPEC [--model-arg k=v ...] [--data PATH] [--plan plan.json | --stages P]
        --schedule NAME --batch-size B --microbatches M [--epochs E | --steps S | --target METRIC]
        [--workers N] [--checkpoint-dir D [--checkpoint-every N] [--checkpoint-keep K] [--resume]] [--json]
        [--job-id N [--attempt A]] [--events-jsonl PATH]
        [--weight-grads batched|immediate] [--cpu-matmul default|onednn] [--precision fp32|bf16]
        [--loader-workers N]

A run file (`--config`) is the whole run configuration as one JSON object, the fields of
pipeboard.trainer.runtime.run_config.RunConfig (a key it does not have is refused): the service hands
each job's specification to its run this way (app/services/run_setup.py), parsed once, here.

SPEC is a zoo name or a task factory (`package.module:function`, `path/to/file.py:function`)
returning a pipeboard.trainer.Task; the task is built and checked here, before any worker starts.

Ends with a summary line (or, with --json, one JSON object with samples_per_s, final_metric,
steps, wall_s, ...; tokens_per_s too where the task's inputs have a sequence dimension, see
docs/variable-shapes.md). Bad input or a failed run: one line on stderr, exit code 2 or 1; 75 when the
run was lost (a worker process killed or hung) rather than stopped by an error it reported, so
the same run resumed from its checkpoint could succeed.
torch is imported inside the command.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import typer

from pipeboard.app.cli.common import RegistryHelpCommand, fail, parse_model_args


def _load_plan(path: str) -> Any:
    from pipeboard.trainer.plan.plan_format import Plan

    try:
        return Plan.load(path)
    except OSError as exc:
        raise ValueError(f"--plan: cannot read {path}: {exc.strerror}") from None


# the options that are the run's configuration: with --config, the file says them all
NOT_RUN_OPTIONS = frozenset({"config", "as_json", "job_id", "attempt", "events_jsonl", "torchrun"})
# what a tune file (--tuned) gives: the model and its layout
TUNED_OPTIONS = frozenset({"config", "model", "model_arg", "data", "precision", "plan", "stages", "schedule",
                           "batch_size", "microbatches", "workers", "chunks", "weight_grads", "recompute",
                           "vertical_sync"})


class ProgressSink:
    """A rich progress bar on stderr, advanced by the run's metric records."""

    def __init__(self, enabled: bool) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[info]}"), console=Console(stderr=True),
                                 disable=not enabled, transient=True)
        self.task = None

    def on_status(self, phase: str, message: str = "", **fields: Any) -> None:
        if phase == "running" and self.task is None:
            self.progress.start()
            self.task = self.progress.add_task("train", total=fields.get("total_steps"),
                                               completed=fields.get("start_step", 0), info="")
        elif phase in ("done", "failed"):
            self.progress.stop()

    def on_events(self, events) -> None:
        pass

    def on_metrics(self, records) -> None:
        if self.task is None or not records:
            return
        last = records[-1]
        info = " ".join(f"{k} {v:.4g}" for k, v in last.values.items() if k in ("loss", "samples_per_s", "metric"))
        self.progress.update(self.task, completed=max(r.step for r in records), info=info)

    def on_summary(self, summary) -> None:
        pass


def register(cli: typer.Typer) -> None:
    data_parallel = "{schedules data_parallel=True}"
    ignoring = "{schedules and weight_grads=()}"

    @cli.command("train", cls=RegistryHelpCommand, epilog="{schedules listed}")
    def train(
        ctx: typer.Context,
        config: Optional[str] = typer.Option(
            None, "--config", help="The run configuration as one JSON file (RunConfig's fields), instead of the options below."),
        tuned: Optional[str] = typer.Option(
            None, "--tuned", help="A `pipeboard tune --json` result: run its choice (model, split, schedule, batch size, "
                                  "microbatches, recompute); the length, checkpoint and machinery options still apply."),
        model: Optional[str] = typer.Option(None, "--model", help="Zoo name (`pipeboard models`) or task factory "
                                  "package.module:function or path/to/file.py:function returning a pipeboard.trainer.Task."),
        model_arg: list[str] = typer.Option([], "--model-arg", help="Model argument k=v (repeatable), passed to the factory."),
        data: Optional[str] = typer.Option(None, "--data", help="Data location (a file or folder), passed to the factory as data=."),
        precision: str = typer.Option("fp32", "--precision",
                                      help="fp32, or bf16: forwards under autocast, float32 master weights and optimizer state."),
        loader_workers: Optional[int] = typer.Option(
            None, "--loader-workers", help="DataLoader worker processes per loading stage (default: the task's)."),
        plan: Optional[str] = typer.Option(None, "--plan", help="Plan JSON (`pipeboard plan`): stages and replicas."),
        stages: Optional[int] = typer.Option(None, "--stages", help="Split uniformly into P stages (no plan)."),
        schedule: Optional[str] = typer.Option(None, "--schedule", help="{schedules} (listed below)."),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Samples per training step."),
        microbatches: Optional[int] = typer.Option(None, "--microbatches", help="Microbatches per step."),
        epochs: Optional[float] = typer.Option(None, "--epochs"),
        steps: Optional[int] = typer.Option(None, "--steps"),
        target: Optional[float] = typer.Option(None, "--target", help="Stop when the validation metric reaches this."),
        max_steps: Optional[int] = typer.Option(None, "--max-steps", help="With --target: stop after this many steps at most."),
        workers: Optional[int] = typer.Option(
            None, "--workers", help=f"Processes ({data_parallel}: replicas; with --stages P: N/P per stage)."),
        checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir"),
        checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Steps between checkpoints (0: at the end)."),
        checkpoint_keep: int = typer.Option(2, "--checkpoint-keep", help="Complete checkpoints to keep (the newest)."),
        resume: bool = typer.Option(False, "--resume", help="Continue from the last complete checkpoint."),
        resume_at_most: Optional[int] = typer.Option(
            None, "--resume-at-most", help="With --resume: from the newest complete checkpoint at or before this step."),
        vertical_sync: bool = typer.Option(
            False, "--vertical-sync",
            help="{schedules vertical_sync=True}: vertical sync of weight versions."),
        chunks: int = typer.Option(
            1, "--chunks", help="{schedules chunks=True}: model chunks per worker."),
        weight_grads: str = typer.Option(
            "batched", "--weight-grads",
            help="batched: backwards compute input gradients, one pass per update the weight gradients of all "
                 f"its microbatches; immediate: each backward computes both. {ignoring} ignore it."),
        recompute: Optional[str] = typer.Option(
            None, "--recompute",
            help="Activation recompute: all, none, or stage numbers (0,2): those stages keep only their inputs per "
                 "microbatch in flight and rerun their forward in the backward (less memory, more compute)."),
        lr: Optional[float] = typer.Option(None, "--lr"),
        optimizer: Optional[str] = typer.Option(None, "--optimizer", help="adam, adamw or sgd (default: the task's)."),
        seed: int = typer.Option(0, "--seed"),
        eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Steps between validations (--target)."),
        hang_timeout: float = typer.Option(30.0, "--hang-timeout", help="Seconds without progress that count as hung."),
        device: str = typer.Option("cpu", "--device",
                                   help="cpu (gloo) or cuda (NCCL between GPUs; with fewer GPUs than worker processes, stages share GPUs packed by predicted memory and talk through host memory)."),
        cpu_matmul: Optional[str] = typer.Option(
            None, "--cpu-matmul",
            help="CPU workers' float32 matrix products: default (PyTorch's BLAS) or onednn (up to twice as fast on "
                 "some AMD processors; bench/matmul.py measures yours). Default: $PIPEBOARD_CPU_MATMUL, else default."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
        job_id: Optional[int] = typer.Option(None, "--job-id", help="Report to the service's job N (database)."),
        attempt: Optional[int] = typer.Option(
            None, "--attempt", help="With --job-id: the job's attempt this run is; its reports stop once the job moves on."),
        events_jsonl: Optional[str] = typer.Option(None, "--events-jsonl", help="Append every report as a JSON line."),
        torchrun: bool = typer.Option(
            False, "--torchrun", help="Run as one rank of a torchrun launch (rank, world and rendezvous from its "
                                      "environment; several hosts): rank 0 reports and prints the summary."),
    ) -> None:
        """Train a model (a zoo task or your own) with a pipeline schedule, one process per stage replica."""
        from pipeboard.trainer.runtime.run_config import ConfigError, RunConfig

        from pipeboard.app.core.lifetime import Terminated

        if config is not None:
            # by the source's name: typer may carry its own copy of click's ParameterSource
            flags = [p for p in ctx.params if p not in NOT_RUN_OPTIONS
                     and getattr(ctx.get_parameter_source(p), "name", "") in ("COMMANDLINE", "ENVIRONMENT")]
            if flags:
                fail(f"--{flags[0].replace('_', '-')}: with --config the run file gives every run option")
        elif tuned is not None:  # the tune file gives the model and its layout
            flags = [p for p in ctx.params if p in TUNED_OPTIONS
                     and getattr(ctx.get_parameter_source(p), "name", "") in ("COMMANDLINE", "ENVIRONMENT")]
            if flags:
                fail(f"--{flags[0].replace('_', '-')}: with --tuned the tune file gives the model and its layout")
        else:
            for name, value in (("model", model), ("schedule", schedule), ("batch_size", batch_size),
                                ("microbatches", microbatches)):
                if value is None:
                    fail(f"--{name.replace('_', '-')}: required (or give the whole run as --config FILE)")
        if plan is not None and stages is not None:
            fail("--plan and --stages: give one of them")
        try:
            if job_id is not None and not torchrun:  # under torchrun the agent is the parent (app/services/node_agent.py)
                from pipeboard.app.core.lifetime import die_with_parent_if_asked, raise_on_sigterm

                # a lost worker's run still reports the steps its stages took (a next attempt
                # resumes from a checkpoint at or before the last step the service has)
                raise_on_sigterm()
                die_with_parent_if_asked()
            if config is not None:
                cfg = RunConfig.load(config)
            elif tuned is not None:
                from pipeboard.trainer.tune.tuned import load as load_tuned

                cfg = RunConfig(**load_tuned(tuned), epochs=epochs, steps=steps, target=target, max_steps=max_steps,
                                loader_workers=loader_workers, seed=seed, lr=lr, optimizer=optimizer,
                                eval_every=eval_every, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                                checkpoint_keep=checkpoint_keep, resume=resume, resume_at_most=resume_at_most,
                                hang_timeout_s=hang_timeout, device=device, cpu_matmul=cpu_matmul)
            else:
                cfg = RunConfig(
                    model=model, model_args=parse_model_args(model_arg), data=data, precision=precision,
                    loader_workers=loader_workers, schedule=schedule, batch_size=batch_size,
                    microbatches=microbatches, num_stages=stages, workers=workers, chunks=chunks,
                    vertical_sync=vertical_sync, weight_grads=weight_grads, epochs=epochs, steps=steps, target=target,
                    max_steps=max_steps, seed=seed, lr=lr, optimizer=optimizer, eval_every=eval_every,
                    checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, checkpoint_keep=checkpoint_keep,
                    resume=resume, resume_at_most=resume_at_most, hang_timeout_s=hang_timeout, device=device,
                    cpu_matmul=cpu_matmul)
                if plan is not None:
                    cfg = cfg.with_plan(_load_plan(plan))
                if recompute is not None:
                    cfg = cfg.with_(recompute=_recompute_stages(recompute, cfg))
            cfg.validate()
            from pipeboard.trainer.runtime.launch import run_training
            from pipeboard.trainer.runtime.sinks import JsonlSink, MultiSink

            reports = not torchrun or os.environ.get("RANK") == "0"
            sinks: list[Any] = [ProgressSink(enabled=not as_json and not torchrun)]
            if events_jsonl and reports:
                sinks.append(JsonlSink(events_jsonl))
            background = None
            if job_id is not None and reports:
                from pipeboard.trainer.sink import BackgroundSink

                relay = os.environ.get("PIPEBOARD_RELAY")
                if relay:  # in the sandbox: the relay outside it writes to the database (app/services/run_relay.py)
                    from pipeboard.app.services.run_relay import RelaySink

                    inner: Any = RelaySink(relay)
                else:
                    from pipeboard.app.services.run_sink import DbSink

                    inner = DbSink(job_id, attempt=attempt)
                # the database writes leave the run's path: merged once a second, from a thread
                # that yields the CPU to the training processes
                background = BackgroundSink(inner)
                sinks.append(background)
            try:
                if torchrun:
                    from pipeboard.trainer.runtime.torchrun_entry import run as run_rank

                    summary = run_rank(cfg, MultiSink(sinks))
                    if summary is None:  # not rank 0: rank 0 reports for all
                        return
                else:
                    summary = run_training(cfg, MultiSink(sinks))
            finally:
                if background is not None:  # what it holds reaches the database, a failed run's too
                    background.close()
        except Terminated as exc:
            fail(str(exc), code=143)  # as a process ended by SIGTERM (128 + 15)
        except (ConfigError, ValueError, KeyError) as exc:
            # a KeyError's str() quotes its message; other messages may end in a quoted value
            fail(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))
        except Exception as exc:  # RunFailed, or anything else: one line, never a traceback
            from pipeboard.app.services.errors import RUN_LOST_EXIT

            if type(exc).__name__ != "RunFailed":
                fail(f"{type(exc).__name__}: {exc}", code=1)
            fail(str(exc), code=RUN_LOST_EXIT if getattr(exc, "lost", False) else 1)
        if as_json:
            typer.echo(json.dumps(summary, default=str))
        else:
            from pipeboard.trainer.runtime.launch import summary_line

            typer.echo(summary_line(summary))


def _recompute_stages(text: str, cfg) -> list[int] | None:
    """--recompute all|none|0,2 as the run's list of virtual stages (ConfigError naming the flag)."""
    from pipeboard.trainer.runtime.run_config import ConfigError

    word = text.strip().lower()
    if word == "none":
        return None
    if word == "all":
        # a plan's stages are the virtual stages already (chunks included); --stages counts workers'
        known = len(cfg.stages) if cfg.stages is not None else cfg.num_stages * cfg.chunks if cfg.num_stages else None
        if known is None:
            raise ConfigError("recompute: 'all' needs --stages or --plan")
        return list(range(known))
    try:
        return sorted({int(part) for part in word.split(",") if part.strip()})
    except ValueError:
        raise ConfigError(f"recompute: all, none or stage numbers like 0,2; got {text!r}") from None
