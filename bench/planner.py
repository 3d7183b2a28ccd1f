"""Planner benchmark: our objective and time against the reference optimizer's, per profile.

    .venv/bin/python bench/planner.py [--profiles alexnet,resnet101] [--configs n4x4_10GBps_1.25GBps]
                                      [--chain 2000] [--json out.json]

For every line of ../shared/pipedream-profiles/reference-plans.jsonl (14 profiles x 6
configurations: what msr-fiddle/pipedream's optimizer_graph_hierarchical.py printed, with its
wall time) it plans the same profile and configuration and prints our predicted_time_s, the
reference's, their relative difference, our wall and CPU time, the reference's wall time and
our share of it. Lines the reference never finished (rc 124 after 600 s, or profiles it could
not enumerate) are planned too.

How it measures: the profile is loaded before timing; each line is planned once untimed (its
imports, and numba's import and cache load where that line's work is large enough to use the
compiled kernels), then timed ``--repeats`` times (5; once for lines over 1 s) around the
in-process ``plan()`` call, and the median wall and median CPU time are reported. The
reference's time is its whole-process wall time from the jsonl (interpreter start included):
"share" is our median CPU time over it, the steadier figure on a shared machine (the wall
share is printed too). The summary counts the finished lines at or under 1% and lists the
others. ``--chain N[,N...]`` also plans N-layer chains on three levels (16 x 8 x 8 = 1,024
workers; the goal: 2,000 layers in under 10 s), timed once after its untimed run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.plan import plan  # noqa: E402
from trainer.plan.reference_flags import parse_reference_flags  # noqa: E402
from trainer.profile.schema import Layer, Profile  # noqa: E402

SHARED = ROOT.parent / "shared" / "pipedream-profiles"
NAMES = ["alexnet", "vgg16", "resnet18", "squeezenet1_0", "resnet50", "resnext50", "resnet101", "resnext101",
         "densenet121", "inception_v3", "nasnetamobile", "nasnetalarge", "gnmt", "gnmt_large"]
CONFIGS = {
    "n4_1GBps": "-n 4 -b 1e9 --activation_compression_ratio 1",
    "n4_1GBps_straight": "-n 4 -b 1e9 --activation_compression_ratio 1 --straight_pipeline",
    "n4_1GBps_mem16GB": "-n 4 -b 1e9 --activation_compression_ratio 1 --use_memory_constraint -s 16e9",
    "n16_1GBps": "-n 16 -b 1e9 --activation_compression_ratio 1",
    "n4x4_10GBps_1.25GBps": "-n 4 4 -b 10e9 1.25e9 --activation_compression_ratio 1",
    "n8x2_25GBps_3.125GBps": "-n 8 2 -b 25e9 3.125e9 --activation_compression_ratio 1",
}


def timed_plan(profile: Profile, repeats: int = 5, **kw):
    """(plan, median wall s, median CPU s) over ``repeats`` timed calls after one untimed call
    (a single timed call when the untimed one took over 1 s)."""
    start = time.perf_counter()
    plan(profile, **kw)
    if time.perf_counter() - start > 1.0:
        repeats = 1
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = plan(profile, **kw)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return result, statistics.median(walls), statistics.median(cpus)


def chain_profile(n: int, seed: int = 0) -> Profile:
    rng = random.Random(seed)
    layers = [Layer(name=f"l{i}", desc=f"Layer{i}", forward_ms=rng.uniform(0.1, 2.0), backward_ms=rng.uniform(0.2, 4.0),
                    activation_bytes=rng.uniform(1e5, 1e7), parameter_bytes=rng.choice([0.0, rng.uniform(1e5, 5e7)]))
              for i in range(n)]
    return Profile(layers=layers, edges=[(f"l{i}", f"l{i + 1}") for i in range(n - 1)], model=f"chain{n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default=",".join(NAMES))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--chain", default="", help="also plan N-layer chains (comma-separated N) on 16 x 8 x 8 workers")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per line (median reported)")
    ap.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = ap.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"shared profiles not found at {SHARED}")
    reference = {}
    for line in (SHARED / "reference-plans.jsonl").read_text().splitlines():
        rec = json.loads(line)
        reference[(rec["profile"], rec["config"])] = rec
    rows = []
    plan(chain_profile(8), levels=[(2, 1e9)])  # warm up imports and NumPy before timing
    print(f"timing: median of {args.repeats} in-process plan() calls after one untimed call (1 call over 1 s); "
          "'ref wall' = the reference's whole-process wall time; 'share' = our median CPU / ref wall\n")
    header = (f"{'profile':14s} {'config':22s} {'states':>7s} {'ours (s)':>17s} {'reference (s)':>17s} {'rel diff':>8s} "
              f"{'our wall':>9s} {'our cpu':>8s} {'ref wall':>9s} {'share':>8s} {'wall/ref':>8s}")
    print(header)
    print("-" * len(header))
    for name in args.profiles.split(","):
        profile = Profile.load(SHARED / name / "graph.txt")
        for config in args.configs.split(","):
            rec = reference.get((name, config), {"rc": None, "ref_wall_s": None, "ref": None})
            kw = parse_reference_flags(rec.get("args") or CONFIGS[config])
            result, wall, cpu = timed_plan(profile, args.repeats, **kw)
            ref = rec.get("ref") or {}
            ref_time = float(ref["pipeline_time_per_sample_s"]) if ref.get("pipeline_time_per_sample_s") else None
            diff = abs(result.predicted_time_s - ref_time) / ref_time if ref_time else None
            ref_wall = rec.get("ref_wall_s")
            gave_up = rec.get("rc") not in (0, None) or not ref
            row = {"profile": name, "config": config, "states": result.states, "state_graph": result.state_graph,
                   "ours_s": result.predicted_time_s, "reference_s": ref_time, "rel_diff": diff,
                   "wall_s": wall, "cpu_s": cpu, "ref_wall_s": ref_wall, "reference_finished": not gave_up}
            rows.append(row)
            ref_txt = f"{ref_time:17.12g}" if ref_time else (f"{'gave up':>17s}" if rec.get("rc") else f"{'(no result)':>17s}")
            share = f"{100 * cpu / ref_wall:7.3f}%" if ref_wall and not gave_up else f"{'-':>8s}"
            wshare = f"{100 * wall / ref_wall:7.3f}%" if ref_wall and not gave_up else f"{'-':>8s}"
            states = f"{result.states}{'' if result.exact else 'L'}"
            print(f"{name:14s} {config:22s} {states:>7s} {result.predicted_time_s:17.12g} {ref_txt} "
                  f"{(f'{diff:8.1e}' if diff is not None else '       -')} {1e3 * wall:7.2f}ms {1e3 * cpu:6.2f}ms "
                  f"{(f'{ref_wall:8.2f}s' if ref_wall else '        -')} {share} {wshare}", flush=True)
    finished = [r for r in rows if r["rel_diff"] is not None]
    if finished:
        worst = max(finished, key=lambda r: r["rel_diff"])
        print(f"\n{len(finished)} lines the reference finished: worst relative difference {worst['rel_diff']:.1e} "
              f"({worst['profile']} {worst['config']}); 'L' = linearised order (states exceeded the limit)")
        over = sorted((r for r in finished if r["cpu_s"] > 0.01 * r["ref_wall_s"]),
                      key=lambda r: r["cpu_s"] / r["ref_wall_s"], reverse=True)
        print(f"{len(finished) - len(over)} of {len(finished)} at or under 1% of the reference's wall time "
              f"(our median CPU / its whole-process wall)")
        if over:
            print("over 1%: " + ", ".join(
                f"{r['profile']} {r['config']} {100 * r['cpu_s'] / r['ref_wall_s']:.2f}% "
                f"({1e3 * r['cpu_s']:.2f} ms vs {r['ref_wall_s']:.2f} s)" for r in over))
    for size in [int(x) for x in args.chain.split(",") if x]:
        levels = [(16, 100e9), (8, 25e9), (8, 3.125e9)]
        result, wall, cpu = timed_plan(chain_profile(size), 1, levels=levels)
        print(f"\n{size}-layer chain on 16 x 8 x 8 = 1024 workers: predicted {result.predicted_time_s!r} s, "
              f"{len(result.stages)} stages, wall {wall:.2f} s, cpu {cpu:.2f} s")
        rows.append({"profile": f"chain{size}", "config": "16x8x8", "ours_s": result.predicted_time_s,
                     "wall_s": wall, "cpu_s": cpu})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
