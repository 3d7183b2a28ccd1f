"""Profile one model and write the profile JSON: `python -m app.services.profile_run ...`.

Jobs run this as a child process in the run's own process group (like `pipeboard train`), so
cancelling a job mid-profile ends it too, and torch never loads into the Celery worker.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any


def load_model(source: str, kind: str, model_args: dict[str, Any], batch_size: int):
    """(nn.Module, example_input) for a zoo name or an import path `pkg.mod:factory`."""
    if kind == "import":
        module_name, _, attr = source.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        result = factory(**model_args)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ValueError(f"{source} must return (nn.Module, example_input), got {type(result).__name__}")
        return result
    from trainer import zoo

    zm = zoo.get(source, **model_args)
    return zm.model, zm.example_input(batch_size)


def profile(source: str, kind: str, model_args: dict[str, Any], batch_size: int, device: str = "cpu", repeats: int = 5) -> dict[str, Any]:
    from trainer.profile.profiler import profile_model

    model, example = load_model(source, kind, model_args, batch_size)
    prof = profile_model(model, example, batch_size=batch_size, device=device, warmup=2, repeats=repeats)
    if not prof.model:
        prof.model = source
    return prof.to_dict()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.services.profile_run")
    parser.add_argument("--source", required=True)
    parser.add_argument("--kind", default="zoo", choices=("zoo", "import"))
    parser.add_argument("--model-args", default="{}", help="JSON object")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    try:
        data = profile(args.source, args.kind, json.loads(args.model_args), args.batch_size, args.device, args.repeats)
    except Exception as exc:  # one line for the job's error, not a traceback
        print(f"profiling {args.source} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    with open(args.output, "w") as fh:
        json.dump(data, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
