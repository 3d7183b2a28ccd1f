"""Profile every zoo model and print how well the per-layer times add up to a whole step.

    .venv/bin/python bench/profile.py [--threads 1] [--repeats 10] [--warmup 3] [--rounds 3] [--device cpu]

For each model (default arguments and batch size): layer count, profiling wall time, the sum of
per-layer forward+backward medians, the measured whole training step (forward+backward of the
unsplit model, median), and their ratio (the self-check; the aim is 0.85..1.15). Each model is
profiled ``--rounds`` times and the round with the median ratio is shown, with the range of
ratios over the rounds: on a shared machine timings are noisy, so these are measurements, not
guarantees.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from pipeboard.trainer import zoo  # noqa: E402
from pipeboard.trainer.profile.profiler import profile_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (one per pipeline worker)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timer", default="auto", choices=("auto", "wall", "cpu"))
    parser.add_argument("--models", nargs="*", default=None, help="zoo names (default: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, device {args.device}, threads {args.threads}, timer {args.timer}, "
          f"warmup {args.warmup}, repeats {args.repeats}, rounds {args.rounds}")
    header = f"{'model':18} {'layers':>6} {'batch':>5} {'wall s':>7} {'sum ms':>9} {'step ms':>9} {'ratio':>6} {'ratio range':>13}"
    print(header)
    print("-" * len(header))
    for name in args.models or zoo.names():
        entry = zoo.get(name)
        x = entry.example_input(entry.default_batch_size)
        results = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            prof = profile_model(entry.model, x, batch_size=entry.default_batch_size, device=args.device,
                                 warmup=args.warmup, repeats=args.repeats, optimizer=entry.optimizer, model_name=name, timer=args.timer)
            results.append((prof.meta["self_check_ratio"], time.perf_counter() - started, prof))
        results.sort(key=lambda r: r[0])
        ratio, wall, prof = results[len(results) // 2]
        lo, hi = results[0][0], results[-1][0]
        m = prof.meta
        print(f"{name:18} {len(prof.layers):6d} {prof.batch_size:5d} {wall:7.2f} {m['layer_sum_ms']:9.3f} "
              f"{m['step_ms']:9.3f} {ratio:6.3f} {lo:6.3f}..{hi:5.3f}", flush=True)
    print("ratio = sum of per-layer (forward + backward) medians / median whole step; timings on a shared "
          "machine are noisy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
