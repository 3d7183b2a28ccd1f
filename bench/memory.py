"""Memory per stage: memory_model's prediction against the bytes a stage's worker allocates.

For each model, schedule and recompute setting, each worker's own action list (one batch, and a
second one so that optimizer state and stashed versions exist) is replayed in this process with
the runtime's Stage objects (trainer/runtime/stage.py: the same forward, backward, split
backward, weight versions and updates the runtime runs); a stage's input and the gradient it
receives are fresh tensors of the boundary's shape, as a receive makes them. Measured: glibc's
bytes in use (mallinfo2: heap blocks in use plus mmapped blocks) after each action, less their
level before the replay, plus one version of the stage's parameters (made before it): the
peak over the replay. Sampled between actions, so a transient inside one backward (recompute's
rebuilt activations) is not seen: the figure errs low there, and the table says so.

    .venv/bin/python bench/memory.py [--models mlp,mlp-digits,cnn-digits,transformer-text,gpt2-text] [--microbatches 8]

gpt2-text is a transformers GPT-2 (trainer/zoo/hf.py).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys

# bench/profile.py would shadow the standard library's profile (torch.export imports cProfile)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402
from torch.utils.data import default_collate  # noqa: E402

from pipeboard.trainer.runtime import stage_modules  # noqa: E402
from pipeboard.trainer.runtime.run_config import RunConfig  # noqa: E402
from pipeboard.trainer.schedule.stash import version_last_use  # noqa: E402
from pipeboard.trainer.runtime.layout import resolve  # noqa: E402
from pipeboard.trainer.runtime.memory_predict import measure_stages, predicted_bytes_per_stage  # noqa: E402
from pipeboard.trainer.runtime.stage import Stage  # noqa: E402
from pipeboard.trainer.schedule.actions import Kind  # noqa: E402

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("pipedream", 1), ("zb-h1", 1), ("interleaved-1f1b", 2)]
MODELS = {"mlp": {"depth": 4, "width": 512, "samples": 256}}  # others: their zoo defaults


class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = Mallinfo2


def in_use() -> int:
    info = _libc.mallinfo2()
    return info.uordblks + info.hblkhd


def processor() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    keep = [line.split(":", 1)[1].strip() for line in out.splitlines()
            if line.split(":")[0] in ("Model name", "CPU family", "Model")]
    return " / ".join(keep)


def replay(cfg: RunConfig, rank: int, recompute: bool) -> tuple[dict[int, int], dict[int, int]]:
    """(predicted, measured) bytes per virtual stage of worker ``rank``."""
    layout = resolve(cfg)
    template = layout.build(cfg.microbatches)
    actions = template.actions[rank]
    twice = actions + [a for a in layout.build(cfg.microbatches).actions[rank]]  # a second batch (same list)
    task = stage_modules.load_task(cfg)
    example, target = default_collate([task.train_data[i] for i in range(cfg.microbatch_size)])
    modules = stage_modules.build_stages(task.model, example,
                                         stage_modules.stage_layers(cfg, task, layout.virtual_stages), task.layers)
    counted = measure_stages(modules, example, loss=task.loss, target=target)
    redo = list(range(len(modules))) if recompute else []
    mine = template.workers[rank].stages
    split = any(a.kind is Kind.BACKWARD_INPUT for a in actions)
    # boundary inputs of each stage, for one microbatch (run once, outside the measurement)
    inputs, grad_shapes, xs = [], [], list(example) if isinstance(example, (tuple, list)) else [example]
    with torch.no_grad():
        for m in modules:
            inputs.append([t.detach() for t in xs])
            out = m(*xs)
            xs = list(out) if isinstance(out, tuple) else [out]
            grad_shapes.append([t.shape for t in xs if t.dtype.is_floating_point])  # what comes back
    last = len(modules) - 1
    predicted = predicted_bytes_per_stage(template, counted, cfg.optimizer or task.optimizer, redo)
    stages = {s: Stage(s, modules[s], task.make_optimizer(modules[s].parameters()), is_first=s == 0,
                       is_last=s == last, loss_fn=task.loss, stash=cfg.is_async,
                       loss_scale=1.0 / cfg.microbatches, layer_calls=split, recompute=s in redo) for s in mine}
    weights = sum(counted[s].weight_bytes for s in mine)
    del modules, task
    out_shapes = {s: grad_shapes[s] if s < last else [] for s in mine}
    last_use, releases = version_last_use(twice)
    start, peak = in_use(), 0
    for i, a in enumerate(twice):
        st = stages.get(a.stage)
        if a.kind is Kind.FORWARD:
            fresh = [t.clone() for t in inputs[a.stage]]
            st.forward(a.microbatch, a.version, fresh, target if a.stage == last else None)
            del fresh
        elif a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
            grads = [torch.ones(shape) for shape in out_shapes[a.stage]]
            st.backward(a.microbatch, grads, weights=a.kind is Kind.BACKWARD)
        elif a.kind is Kind.BACKWARD_WEIGHT:
            st.backward_weight(a.microbatch)
        elif a.kind is Kind.STEP:
            keep = last_use.get((a.stage, st.versions.current), -1) > i
            st.step(a.version, keep)
            st.losses.clear()
        for stage_index, version in releases.get(i, ()):
            stages[stage_index].versions.release(version)
        peak = max(peak, in_use() - start)
    measured = {s: peak + weights for s in mine}
    return {s: predicted[s] for s in mine}, measured


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,mlp-digits,cnn-digits,transformer-text,gpt2-text")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"processor: {processor()}; load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}")
    print(f"{'model':<12} {'schedule':<17} {'recompute':<9} {'worker':>6} {'predicted MB':>13} {'measured MB':>12} "
          f"{'error':>7}")
    errors = []
    for model in args.models.split(","):
        for schedule, chunks in SCHEDULES:
            for recompute in (False, True):
                cfg = RunConfig(model=model, model_args=MODELS.get(model, {}), batch_size=args.batch_size,
                                microbatches=args.microbatches, schedule=schedule, num_stages=args.workers,
                                chunks=chunks, steps=1, eval_at_end=False)
                for rank in range(args.workers):
                    pred, meas = replay(cfg, rank, recompute)
                    p, m = max(pred.values()), max(meas.values())
                    err = (p - m) / m
                    errors.append(abs(err))
                    print(f"{model:<12} {schedule:<17} {'on' if recompute else 'off':<9} {rank:>6} {p / 1e6:>13.3f} "
                          f"{m / 1e6:>12.3f} {100 * err:>6.1f}%", flush=True)
    print(f"{len(errors)} workers: |error| median {100 * statistics.median(errors):.1f}%, "
          f"worst {100 * max(errors):.1f}%; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
