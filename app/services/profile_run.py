"""Profile one model and write the profile JSON: `python -m pipeboard.app.services.profile_run ...`.

Jobs run this as a child process in the run's own process group (like `pipeboard train`), so
cancelling a job mid-profile ends it too, and torch never loads into the Celery worker.

It measures trainer.calibrate.calibrated_profile (whose docstring says what each flag
calibrates: ``--weight-batch-size``, ``--calibrate`` with ``--run-batch-size`` and the pilots'
``--pilot-workers``/``--pilot-microbatches``, ``--concurrent``), the one `pipeboard profile
--calibrate` measures in its own process; app/services/profiles.calibration_args writes the
flags a job's run needs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def profile(source: str, model_args: dict[str, Any], batch_size: int, device: str = "cpu", repeats: int = 5,
            **options: Any) -> dict[str, Any]:
    """The profile JSON of the model at ``batch_size``: trainer.calibrate.calibrated_profile (the
    one `pipeboard profile --calibrate` runs too) with ``options`` (see the module docstring)."""
    from pipeboard.trainer.calibrate import calibrated_profile

    return calibrated_profile(source, model_args, batch_size, device, repeats, **options).to_dict()


def parser() -> argparse.ArgumentParser:
    """This child's flags (profiles.calibration_args writes the calibration's)."""
    parser = argparse.ArgumentParser(prog="python -m pipeboard.app.services.profile_run")
    parser.add_argument("--source", required=True)
    parser.add_argument("--model-args", default="{}", help="JSON object")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads, as each of the run's workers will have (default: torch's)")
    parser.add_argument("--optimizer", default=None, help="optimizer the run steps (default: the zoo entry's, else adam)")
    parser.add_argument("--weight-batch-size", type=int, default=None,
                        help="also time each layer's weight gradients at this many samples (batched W(-1))")
    parser.add_argument("--calibrate", action="store_true",
                        help="also measure the link between two processes and the runtime's per-action overhead")
    parser.add_argument("--concurrent", type=int, default=0,
                        help="processes training the model on the profiled batch meanwhile (a run's other workers)")
    parser.add_argument("--run-batch-size", type=int, default=None,
                        help="with --calibrate: the run's batch (samples per step); time loading it from the task's data")
    parser.add_argument("--pilot-workers", type=int, default=None,
                        help="with --calibrate and --run-batch-size: pilot runs for this many local workers")
    parser.add_argument("--pilot-microbatches", type=int, default=None,
                        help="with --pilot-workers: microbatches per step of the pilot runs (the run's)")
    parser.add_argument("--data", default=None, help="data location, passed to the task factory as data=")
    parser.add_argument("--machine-cache", default=None,
                        help="with --calibrate: folder keeping this machine's link and overhead figures")
    parser.add_argument("--machine-max-age", type=float, default=0.0,
                        help="with --machine-cache: seconds kept figures are used (0: measure them now)")
    parser.add_argument("-o", "--output", required=True)
    return parser


def options_of(args: argparse.Namespace) -> dict[str, Any]:
    """calibrated_profile's options from the parsed flags."""
    return dict(optimizer=args.optimizer, weight_batch_size=args.weight_batch_size, calibrate=args.calibrate,
                data=args.data, concurrent=args.concurrent, run_batch_size=args.run_batch_size,
                machine_cache=args.machine_cache, machine_max_age_s=args.machine_max_age,
                pilot_workers=args.pilot_workers, pilot_microbatches=args.pilot_microbatches, threads=args.threads)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # As `pipeboard train` runs (trainer/allocator.py); before torch loads, which happens below.
    from pipeboard.trainer.allocator import prefer_huge_pages

    prefer_huge_pages()
    # The kernels the job's runs will multiply with (the same variable reaches `pipeboard train`).
    from pipeboard.trainer import cpu_matmul

    try:
        cpu_matmul.use(None)  # $PIPEBOARD_CPU_MATMUL
    except (ValueError, RuntimeError) as exc:
        print(f"profiling {args.source} failed: {exc}", file=sys.stderr)
        return 1
    if args.threads:
        # A small layer's step on a thread pool whose other core is busy waits for it (an Adam step
        # of 8k parameters: 8 ms on 2 threads, 0.15 ms on 1): time what the workers will run.
        import torch

        torch.set_num_threads(args.threads)
    try:
        data = profile(args.source, json.loads(args.model_args), args.batch_size, args.device, args.repeats,
                       **options_of(args))
    except Exception as exc:  # one line for the job's error, not a traceback
        print(f"profiling {args.source} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    with open(args.output, "w") as fh:
        json.dump(data, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
