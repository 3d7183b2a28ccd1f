"""`pipeboard tune`: choose the split, schedule, microbatches and recompute of a run together.

    pipeboard tune SPEC|PROFILE.json... --workers N --batch-size B [--memory-per-worker BYTES]
        [--microbatches 1,2,4,8,16] [--schedule NAME ...] [--bandwidth BYTES_PER_S]
        [--verify K [--verify-steps S] [--verify-repeats R]] [--json] [-o tune.json]
        [--model-arg k=v ...] [--data PATH] [--precision fp32|bf16] [--no-calibrate] [--device cpu|cuda]

SPEC is a model as `pipeboard train` and `pipeboard profile` take it (a zoo name or a task
factory); it is profiled here at every microbatch size B / M the counts give (a simulated
microbatch costs what its profile measured), with the machine's link and runtime overhead
(trainer/runtime/machine.py, kept under --machine-cache). Or give profile JSONs, one per
microbatch size, as `pipeboard profile` writes them. The search is pipeboard.trainer.tune.
`--json` prints {"choice", "candidates", "run", ...}; `pipeboard train --tuned FILE` runs the
choice. Bad input, or a cap nothing fits: one line on stderr, exit code 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from pipeboard.app.cli.common import fail, parse_model_args, text_table, without_blas_threads


def _counts(text: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        fail(f"--microbatches: counts like 1,2,4,8,16; got {text!r}")
    if not counts or counts[0] < 1:
        fail(f"--microbatches: positive counts like 1,2,4,8,16; got {text!r}")
    return counts


def _profiles_of_files(paths: list[str]) -> list:
    from pipeboard.trainer.profile.schema import Profile, ProfileError

    out = []
    for path in paths:
        try:
            out.append(Profile.from_json(Path(path).read_text()))
        except OSError as exc:
            fail(f"SPEC: cannot read {path}: {exc.strerror}")
        except ProfileError as exc:
            fail(f"SPEC: {path}: {exc}")
    sizes = [p.batch_size for p in out]
    if len(set(sizes)) != len(sizes):
        fail(f"SPEC: give one profile per microbatch size; batch sizes {sizes}")
    return out


def _profile_spec(spec: str, sizes: list[int], batch_size: int, workers: int, args: dict, data: str | None,
                  precision: str, device: str, calibrate: bool, machine_cache: str | None,
                  machine_max_age: float) -> list:
    """SPEC profiled at each microbatch size. Calibrated (the default), each is the profile the
    service's tuner reads: what a job's profiling phase measures for a run of ``workers`` on
    ``batch_size`` samples in ``batch_size // size`` microbatches (the link, the runtime's
    overhead, the other workers training meanwhile, batched weight gradients and the pilot
    runs), so `pipeboard tune` and POST /tune rank from the same figures."""
    from pipeboard.app.cli.profile import calibration_options, measure

    out = []
    for size in sizes:
        typer.echo(f"profiling {spec} at microbatch size {size}" + (" (calibrated)" if calibrate else ""), err=True)
        calibration = None
        if calibrate:
            calibration = calibration_options(spec, size, workers, batch_size // size, "batched", None)
            calibration.update(machine_cache=machine_cache, machine_max_age_s=machine_max_age, data=data)
        prof = measure(spec, batch_size=size, device=device, model_args=args, data=data, precision=precision,
                       warmup=2, repeats=5, seed=0, threads=1, cpu_matmul=None, calibration=calibration)
        out.append(prof)
    return out


def _print(result, cap: float | None) -> None:
    rows = []
    for i, c in enumerate(result.candidates[:20]):
        rows.append([str(i + 1), c.label(), f"{c.predicted_step_s * 1e3:.3f}",
                     f"{c.predicted_time_per_sample_s * 1e6:.2f}",
                     "" if c.measured_step_s is None else f"{c.measured_step_s * 1e3:.3f}",
                     f"{c.predicted_memory_bytes / 2**20:.1f}", "yes" if c.fits else "no"])
    title = f"{len(result.candidates)} candidates" + (f" under {int(cap)} bytes per worker" if cap else "")
    for line in text_table(title, ["#", "candidate", "step ms", "us/sample", "measured ms", "MiB/worker", "fits"],
                           rows, left={"candidate"}):
        typer.echo(line)
    typer.echo(f"choice: {result.choice.label()}")


def register(cli: typer.Typer) -> None:
    @cli.command("tune")
    def tune(
        spec: list[str] = typer.Argument(..., metavar="SPEC|PROFILE.json...",
                                         help="A model (zoo name or task factory), or profile JSONs, one per microbatch size."),
        workers: int = typer.Option(..., "--workers", "-n", help="Worker processes the run will have."),
        batch_size: int = typer.Option(..., "--batch-size", help="Samples per training step."),
        memory_per_worker: Optional[float] = typer.Option(
            None, "--memory-per-worker", help="Cap in bytes per worker: only candidates predicted under it are chosen."),
        microbatches: str = typer.Option("1,2,4,8,16", "--microbatches", help="Microbatch counts to try (those dividing the batch)."),
        schedule: list[str] = typer.Option([], "--schedule", help="Schedules to try (repeatable; default: every registered one)."),
        bandwidth: float = typer.Option(5e9, "--bandwidth", help="Bytes/s between workers where the profile measured no link."),
        verify: int = typer.Option(0, "--verify", help="Run the best K for a few steps and re-rank by measured step time."),
        verify_steps: int = typer.Option(8, "--verify-steps", help="With --verify: steps per run."),
        verify_repeats: int = typer.Option(1, "--verify-repeats", help="With --verify: runs per candidate (alternating; median)."),
        as_json: bool = typer.Option(False, "--json", help="Print {\"choice\", \"candidates\", ...} as one JSON object."),
        output: Optional[Path] = typer.Option(None, "-o", "--output", help="Also write the JSON result here (for train --tuned)."),
        model_arg: list[str] = typer.Option([], "--model-arg", help="SPEC: model argument k=v (repeatable)."),
        data: Optional[str] = typer.Option(None, "--data", help="SPEC: data location handed to the task factory."),
        precision: str = typer.Option("fp32", "--precision", help="SPEC: fp32 or bf16, as the runs will train."),
        device: str = typer.Option("cpu", "--device", help="cpu or cuda: where SPEC is profiled and --verify runs."),
        calibrate: bool = typer.Option(True, "--calibrate/--no-calibrate",
                                       help="SPEC: profile each microbatch size as a job's profiling phase does: the link and the runtime's "
                                            "overhead (kept in --machine-cache), the other workers training meanwhile, "
                                            "batched weight gradients, pilot runs."),
        machine_cache: Optional[str] = typer.Option(None, "--machine-cache", help="Folder keeping the machine's calibration."),
        machine_max_age: float = typer.Option(86400.0, "--machine-max-age", help="Seconds a kept calibration is reused."),
    ) -> None:
        """Search splits, schedules, microbatch counts and recompute; rank what fits by predicted time per sample."""
        from pipeboard.trainer.tune import TuneError, search

        counts = _counts(microbatches)
        if workers < 1:
            fail(f"--workers must be >= 1, got {workers}")
        if batch_size < 1:
            fail(f"--batch-size must be >= 1, got {batch_size}")
        if memory_per_worker is not None and not memory_per_worker > 0:
            fail(f"--memory-per-worker must be a positive number of bytes, got {memory_per_worker}")
        if verify < 0 or verify_steps < 3 or verify_repeats < 1:
            fail("--verify must be >= 0, --verify-steps >= 3 and --verify-repeats >= 1")
        try:
            args = parse_model_args(model_arg)
        except ValueError as exc:
            fail(str(exc))
        files = all(s.endswith(".json") for s in spec)
        if not files and len(spec) != 1:
            fail("SPEC: one model, or profile JSON files (one per microbatch size)")
        if files:
            if not verify:  # NumPy without linear algebra: no BLAS threads to start
                without_blas_threads()
            profiles = _profiles_of_files(spec)
            first = profiles[0]
            run = {"model": first.model, "model_args": first.meta.get("model_args") or {},
                   "data": first.meta.get("data"), "precision": first.meta.get("precision") or "fp32"}
        else:
            sizes = sorted({batch_size // m for m in counts if batch_size % m == 0})
            if not sizes:
                fail(f"--microbatches: none of {counts} divides --batch-size {batch_size}")
            profiles = _profile_spec(spec[0], sizes, batch_size, workers, args, data, precision, device, calibrate,
                                     machine_cache, machine_max_age)
            run = {"model": spec[0], "model_args": args, "data": data, "precision": precision}
        run.update(workers=workers, batch_size=batch_size)
        try:
            result = search(profiles, workers=workers, batch_size=batch_size, memory_bytes=memory_per_worker,
                            microbatches=counts, schedules=schedule or None, bandwidth=bandwidth)
        except TuneError as exc:
            name = {"memory_bytes": "--memory-per-worker", "batch_size": "--batch-size", "workers": "--workers",
                    "schedules": "--schedule", "microbatches": "--microbatches"}.get(exc.field, "SPEC")
            fail(f"{name}: {str(exc).split(': ', 1)[-1]}")
        if verify:
            from pipeboard.trainer.tune.verify import verify as run_verify

            try:
                result = run_verify(result, run, verify, steps=verify_steps, repeats=verify_repeats, device=device,
                                    progress=lambda line: typer.echo(line, err=True))
            except Exception as exc:  # one line, never a traceback: the run's own message
                fail(f"--verify: {type(exc).__name__}: {exc}", code=1)
        doc = {**result.to_dict(), "run": run}
        if output is not None:
            try:
                output.write_text(json.dumps(doc, indent=1))
            except OSError as exc:
                fail(f"--output: cannot write {str(output)!r}: {exc.strerror}")
        if as_json:
            typer.echo(json.dumps(doc))
        else:
            _print(result, memory_per_worker)
