"""Which float32 CPU matrix-product kernels to use here: PyTorch's BLAS (MKL) or oneDNN.

    .venv/bin/python bench/matmul.py [--rounds 5] [--width 1024] [--rows 64 512] [--batch 512]

``trainer/cpu_matmul.py`` makes oneDNN an opt-in (``--cpu-matmul onednn``,
``PIPEBOARD_CPU_MATMUL``) because the gain depends on the processor: MKL takes a slower path on
some AMD generations than on others, and on Intel's it is already fast. This prints, for this
machine, one torch thread, the two kernel sets alternating round by round:

- a ``Linear(width, width)``'s forward, input gradient (``g W``) and weight gradient (``g^T x``)
  on each ``--rows`` count, in GFLOP/s;
- a training step of the benchmark mlp (depth 8, ``--width``) on ``--batch`` samples, as
  bench/runtime.py's one process runs it (SGD with momentum; the runtime's allocator settings),
  in samples/s;

each as the median over rounds, with the ratio oneDNN / default. A ratio near 1 says keep the
default (it matches other PyTorch programs bit for bit and costs no per-call overhead).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

# bench/ holds scripts named like stdlib modules (profile.py): keep it off the import path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeboard.trainer.allocator import keep_freed_memory, prefer_huge_pages  # noqa: E402

prefer_huge_pages()  # the runtime workers' allocator settings (before torch allocates)

import torch  # noqa: E402

import pipeboard.trainer.zoo  # noqa: E402
from pipeboard.trainer import cpu_matmul  # noqa: E402
from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402
from pipeboard.trainer.runtime.data import TrainStream  # noqa: E402

KERNELS = ("default", "onednn")


def median_s(fn, repeats: int) -> float:
    fn()  # warm-up: first-call set-up (oneDNN's primitive cache) is not what a run pays
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def products(width: int, rows: int, repeats: int) -> dict[str, float]:
    """GFLOP/s of a Linear layer's three products on ``rows`` rows."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(width, width, generator=gen) / width**0.5
    b = torch.zeros(width)
    x = torch.randn(rows, width, generator=gen)
    g = torch.randn(rows, width, generator=gen)
    flop = 2.0 * rows * width * width
    return {
        f"forward {rows} rows": flop / median_s(lambda: torch.addmm(b, x, w.t()), repeats) / 1e9,
        f"input gradient {rows} rows": flop / median_s(lambda: g.mm(w), repeats) / 1e9,
        f"weight gradient {rows} rows": flop / median_s(lambda: g.t().mm(x), repeats) / 1e9,
    }


def training_step(width: int, batch: int, steps: int) -> float:
    """Samples/s of bench/runtime.py's one process on the full batch: the mlp's forward, loss,
    backward and SGD step (momentum, learning rate 1e-4) on a batch of its training data."""
    zoo = pipeboard.trainer.zoo.get("mlp", seed=0, depth=8, width=width)
    zoo.optimizer, zoo.lr = "sgd", 1e-4
    opt = zoo.make_optimizer(zoo.model.parameters())
    x, y = TrainStream(zoo, batch, 1, torch.device("cpu")).microbatch(0)

    def step() -> None:
        zoo.loss_fn(zoo.model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return batch / median_s(step, steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per kernel set")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--batch", type=int, default=512, help="training step batch size")
    args = ap.parse_args()
    if args.rounds < 1 or args.width < 1 or args.batch < 1 or min(args.rows) < 1:
        ap.error("--rounds, --width, --batch and --rows must be positive")
    if not cpu_matmul.available():
        sys.exit("bench/matmul.py: this PyTorch build has no oneDNN matmul (torch.ops.mkldnn._linear_pointwise)")
    torch.set_num_threads(1)
    keep_freed_memory()
    print(f"float32 matrix products, one torch thread, torch {torch.__version__}, {cpu_name()}")
    results: dict[str, dict[str, list[float]]] = {k: {} for k in KERNELS}
    for r in range(args.rounds):
        for kernels in (KERNELS if r % 2 == 0 else KERNELS[::-1]):  # neither always goes first
            cpu_matmul.use(kernels)
            figures = {}
            for rows in args.rows:
                figures.update(products(args.width, rows, repeats=10))
            figures[f"mlp training step, batch {args.batch} (samples/s)"] = training_step(args.width, args.batch, 4)
            for name, value in figures.items():
                results[kernels].setdefault(name, []).append(value)
    cpu_matmul.use("default")
    heading = f"median of {args.rounds} rounds (GFLOP/s unless said)"
    print(f"{heading:54s} {'default':>9s} {'onednn':>9s}  onednn/default")
    for name in results["default"]:
        base, alt = (statistics.median(results[k][name]) for k in KERNELS)
        print(f"  {name:52s} {base:9.1f} {alt:9.1f}  {alt / base:5.2f}x")


if __name__ == "__main__":
    main()
