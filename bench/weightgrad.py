"""Split backward on one stage: full backwards vs input-gradient backwards plus batched weight gradients.

One stage of the ``mlp`` zoo model (default: depth 8, width 1024; the stage holds 4 of its
Linear+ReLU layers), one process, one torch thread, M microbatches per batch. Per batch it times

  full     M x (F + B)                 the plain backward, weight gradients per microbatch
  batched  M x (F + BI) + W(-1)        input gradients per microbatch, one matmul per layer for all
  each     M x (F + BI + W(mb))        the split backward with no batching (zb-h1's W)

alternating the three in every round, gradients cleared before each batch (as after an update),
and prints medians over the rounds, the BI and W parts, and the ratios to ``full``.

    .venv/bin/python bench/weightgrad.py [--microbatch 8 64] [--microbatches 8] [--rounds 30]
        [--position middle|first] [--depth 8] [--width 1024] [--layers 4]

``middle``: the stage's input needs a gradient (a stage after the first); ``first``: it does not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

# bench/profile.py would shadow the standard library's profile module that torch imports
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import pipeboard.trainer.zoo  # noqa: E402
from pipeboard.trainer.runtime.stage_modules import build_stages, layer_names  # noqa: E402
from pipeboard.trainer.runtime.stage import Stage  # noqa: E402

MODES = ("full", "batched", "each")


def make_stage(depth: int, width: int, layers: int, position: str, mb_size: int) -> Stage:
    zoo = pipeboard.trainer.zoo.get("mlp", seed=0, depth=depth, width=width)
    example = zoo.example_input(mb_size)
    names = layer_names(zoo.model, example)  # net_0, net_1 (ReLU), net_2, ...
    skip = 0 if position == "first" else 2  # a middle stage starts after one Linear+ReLU
    if skip + 2 * layers > 2 * depth:
        raise SystemExit(f"--layers {layers} does not fit after {skip // 2} layer(s) of a depth-{depth} mlp")
    cut = [names[:skip], names[skip:skip + 2 * layers], names[skip + 2 * layers:]]
    stages = build_stages(zoo.model, example, [c for c in cut if c])
    module = stages[0 if position == "first" else 1]
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    stage = Stage(1, module, opt, is_first=position == "first", is_last=False, loss_fn=None, stash=False, loss_scale=1.0)
    return stage


def one_batch(stage: Stage, mode: str, xs: list[torch.Tensor], gs: list[torch.Tensor]) -> dict[str, float]:
    """Seconds of one batch in ``mode``, and of its BI and W parts."""
    for p in stage.versions.params:
        p.grad = None
    parts = {"total": 0.0, "BI": 0.0, "W": 0.0}
    t_start = time.perf_counter()
    for i, (x, g) in enumerate(zip(xs, gs)):
        stage.forward(i, 0, [x.clone()], None)
        t = time.perf_counter()
        stage.backward(i, [g], weights=mode == "full")
        if mode != "full":
            parts["BI"] += time.perf_counter() - t
        if mode == "each":
            t = time.perf_counter()
            stage.backward_weight(i)
            parts["W"] += time.perf_counter() - t
    if mode == "batched":
        t = time.perf_counter()
        stage.backward_weight(-1)
        parts["W"] += time.perf_counter() - t
    parts["total"] = time.perf_counter() - t_start
    return parts


def run(args, mb_size: int) -> None:
    stage = make_stage(args.depth, args.width, args.layers, args.position, mb_size)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(mb_size, args.width, generator=gen) for _ in range(args.microbatches)]
    gs = [torch.randn(mb_size, args.width, generator=gen) for _ in range(args.microbatches)]
    for mode in MODES:  # warm-up: allocator, first-call costs
        one_batch(stage, mode, xs, gs)
    got: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for mode in order:
            got[mode].append(one_batch(stage, mode, xs, gs))
    med = {m: {k: statistics.median(p[k] for p in got[m]) for k in ("total", "BI", "W")} for m in MODES}
    print(f"microbatch {mb_size} x {args.microbatches}, {args.position} stage of {args.layers} x "
          f"Linear({args.width}, {args.width})+ReLU, {args.rounds} rounds, medians:")
    labels = {"full": f"{args.microbatches} x (F+B)", "batched": f"{args.microbatches} x (F+BI) + W(-1)",
              "each": f"{args.microbatches} x (F+BI+W(mb))"}
    base = med["full"]["total"]
    for m in MODES:
        extra = "" if m == "full" else f"   (BI {med[m]['BI'] * 1e3:6.2f} ms, W {med[m]['W'] * 1e3:6.2f} ms)"
        print(f"  {m:8s} {labels[m]:24s} {med[m]['total'] * 1e3:8.2f} ms   full/this {base / med[m]['total']:5.2f}x{extra}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--microbatch", type=int, nargs="+", default=[8, 64], help="samples per microbatch (several: one run each)")
    ap.add_argument("--microbatches", type=int, default=8, help="M, microbatches per batch")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--position", choices=("middle", "first"), default="middle")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4, help="Linear+ReLU layers in the stage")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    for mb_size in args.microbatch:
        run(args, mb_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
