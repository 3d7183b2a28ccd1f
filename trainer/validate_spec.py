"""Validate a task SPEC in a process of its own: build the task, check it (one batch through the
model and the loss), split its model into layers. Prints one JSON line and exits 0 when the
answer is known (valid or not), non-zero only when this process itself failed.

    python -m pipeboard.trainer.validate_spec SPEC [--model-args JSON] [--data LOCATION] [--batch-size N]

The service's workers run it in the unpacked code context, with time and memory limits
(app/services/model_checks.py), so that a user's code never runs in the API process and a
factory that hangs, leaks or crashes ends as a failed registration with its message.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def validate(spec: str, model_args: dict[str, Any], data: str | None, batch_size: int | None) -> dict[str, Any]:
    from pipeboard.trainer.profile.capture import UntraceableModelError
    from pipeboard.trainer.profile.outline import capture_layers
    from pipeboard.trainer.spec import load_task
    from pipeboard.trainer.task import TaskError, check_task

    try:
        task = load_task(spec, model_args, data)
        check_task(task, batch_size)
        graph = capture_layers(task.model, task.example_input(2), task.layers)
    except UntraceableModelError as exc:
        return {"ok": False, "message": f"cannot be split into layers: {exc}"}
    except TaskError as exc:
        return {"ok": False, "message": str(exc)}
    layers = sum(1 for layer in graph.layers if layer.kind == "layer")
    return {"ok": True, "layers": layers, "name": task.name, "metric": task.metric_name,
            "target": task.target, "train_items": len(task.train_data),
            "message": f"{layers} layers; {len(task.train_data)} training items"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeboard.trainer.validate_spec",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--model-args", default="{}", help="JSON object of model arguments")
    parser.add_argument("--data", default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        model_args = json.loads(args.model_args)
    except json.JSONDecodeError as exc:
        print(json.dumps({"ok": False, "message": f"model arguments: not JSON ({exc.msg})"}))
        return 0
    if not isinstance(model_args, dict):
        print(json.dumps({"ok": False, "message": "model arguments: must be a JSON object"}))
        return 0
    print(json.dumps(validate(args.spec, model_args, args.data, args.batch_size)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
