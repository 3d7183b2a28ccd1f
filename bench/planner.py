"""Planner benchmark: our objective and time against the reference optimizer's, per profile.

    .venv/bin/python bench/planner.py [--profiles alexnet,resnet101] [--configs n4x4_10GBps_1.25GBps]
                                      [--process 7] [--min-ref-wall 20] [--chain 2000] [--json out.json]

For every line of ../shared/pipedream-profiles/reference-plans.jsonl (14 profiles x 6
configurations: what msr-fiddle/pipedream's optimizer_graph_hierarchical.py printed, with its
wall time) it plans the same profile and configuration and prints our predicted_time_s, the
reference's, their relative difference, the strategy per level, and our times. Lines the
reference never finished (rc 124 after 600 s, or profiles it could not enumerate) are planned
too.

Two measures of time:

- in-process (always): the profile is loaded and NumPy imported before timing (as in a
  long-running server, so the vectorised strategies run; see trainer/plan/solve.py); each line
  is planned once untimed, then timed ``--repeats`` times (5; once for lines over 1 s) around
  the ``plan()`` call; median wall and CPU.
- whole process (``--process N``), N runs each, median wall and CPU, output to a pipe:
  ``pipeboard plan PROFILE <the line's flags>`` as a user runs it (interpreter start, the
  command line's own imports, profile parsing, the printed table), and the planner alone as a
  process (interpreter start, ``pipeboard.trainer.plan`` and the profile loaded, the plan made and
  printed as JSON). Both compare with the reference's time, itself a whole process
  (``ref_wall_s``): "x ref" is its wall over our median wall (CLI / planner).

The summary gives the worst relative difference, and for the lines where the reference took at
least ``--min-ref-wall`` seconds (20), how many times faster our whole process is. ``--chain
N[,N...]`` also plans N-layer chains on three levels (16 x 8 x 8 = 1,024 workers; the goal:
2,000 layers in under 10 s), timed once after its untimed run.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy  # noqa: E402,F401  (loaded before timing: the in-process numbers are a warm process's)

from pipeboard.trainer.plan import plan  # noqa: E402
from pipeboard.trainer.plan.formulas import level_specs  # noqa: E402
from pipeboard.trainer.plan.reference_flags import parse_reference_flags  # noqa: E402
from pipeboard.trainer.plan.solve import choose  # noqa: E402
from pipeboard.trainer.plan.states import state_chain  # noqa: E402
from pipeboard.trainer.profile.files import load_profile  # noqa: E402
from pipeboard.trainer.profile.schema import Layer, Profile  # noqa: E402

SHARED = ROOT.parent / "shared" / "pipedream-profiles"
PIPEBOARD = Path(sys.executable).with_name("pipeboard")
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
SHORT = {"plain": "P", "top_row": "T", "all_rows": "A", "two_machine_top": "2", "capped_chain": "C"}


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


def cli_flags(kw: dict) -> list[str]:
    """``pipeboard plan`` flags for the reference's flags (as ``parse_reference_flags`` reads them)."""
    flags = ["--workers", *[str(w) for w, _ in kw["levels"]], "--bandwidth", *[repr(b) for _, b in kw["levels"]]]
    if kw["straight"]:
        flags.append("--straight")
    if kw["memory_constraint"]:
        flags.append("--memory-constraint")
    if kw["memory_bytes"] is not None:
        flags += ["--memory", repr(kw["memory_bytes"])]
    if kw["activation_compression"] is not None:
        flags += ["--activation-compression", repr(kw["activation_compression"])]
    return flags


PLANNER = ("import json, sys; from pipeboard.trainer.plan import plan; from pipeboard.trainer.profile.files import load_profile; "
           "kw = json.loads(sys.argv[2]); kw['levels'] = [tuple(level) for level in kw['levels']]; "
           "print(plan(load_profile(sys.argv[1]), **kw).to_json())")


def timed_process(command: list[str], runs: int) -> tuple[float, float]:
    """(median wall s, median CPU s of the child) of ``command`` over ``runs`` runs."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True, cwd=ROOT)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


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
    ap.add_argument("--repeats", type=int, default=5, help="timed in-process calls per line (median reported)")
    ap.add_argument("--process", type=int, default=0, help="also time the whole `pipeboard plan` process N times")
    ap.add_argument("--min-ref-wall", type=float, default=0.0, help="only lines the reference took this long on")
    ap.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = ap.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"shared profiles not found at {SHARED}")
    reference = {}
    for line in (SHARED / "reference-plans.jsonl").read_text().splitlines():
        rec = json.loads(line)
        reference[(rec["profile"], rec["config"])] = rec
    rows = []
    plan(chain_profile(8), levels=[(2, 1e9)])  # warm up imports before timing
    print("in-process: median of the timed plan() calls, NumPy loaded; whole process: median of "
          f"{args.process} `pipeboard plan` runs; strategies per level, innermost first: P plain, T top_row, "
          "A all_rows, 2 two_machine_top, C capped_chain\n")
    header = (f"{'profile':14s} {'config':22s} {'states':>7s} {'ours (s)':>17s} {'reference (s)':>17s} {'rel diff':>8s} "
              f"{'strat':>5s} {'in-proc':>9s} {'CLI':>7s} {'planner':>7s} {'ref wall':>9s} {'x ref':>11s}")
    print(header)
    print("-" * len(header))
    for name in args.profiles.split(","):
        profile = load_profile(SHARED / name / "graph.txt")
        chain = None
        for config in args.configs.split(","):
            rec = reference.get((name, config), {"rc": None, "ref_wall_s": None, "ref": None})
            ref_wall = rec.get("ref_wall_s")
            if args.min_ref_wall and not (ref_wall and ref_wall >= args.min_ref_wall):
                continue
            kw = parse_reference_flags(rec.get("args") or CONFIGS[config])
            result, wall, cpu = timed_plan(profile, args.repeats, **kw)
            chain = chain or state_chain(profile)
            mem = (kw["memory_bytes"] or 16e9) if kw["memory_constraint"] else None
            names = choose(chain, level_specs(kw["levels"], kw["straight"], False, mem, kw["activation_compression"]))
            graph = str(SHARED / name / "graph.txt")
            process = planner = None
            if args.process:
                process, _ = timed_process([str(PIPEBOARD), "plan", graph, *cli_flags(kw)], args.process)
                planner, _ = timed_process([sys.executable, "-c", PLANNER, graph, json.dumps(kw)], args.process)
            ref = rec.get("ref") or {}
            ref_time = float(ref["pipeline_time_per_sample_s"]) if ref.get("pipeline_time_per_sample_s") else None
            diff = abs(result.predicted_time_s - ref_time) / ref_time if ref_time else None
            gave_up = rec.get("rc") not in (0, None) or not ref
            row = {"profile": name, "config": config, "states": result.states, "state_graph": result.state_graph,
                   "strategies": names, "ours_s": result.predicted_time_s, "reference_s": ref_time, "rel_diff": diff,
                   "wall_s": wall, "cpu_s": cpu, "process_s": process, "planner_process_s": planner,
                   "ref_wall_s": ref_wall, "reference_finished": not gave_up}
            rows.append(row)
            ref_txt = f"{ref_time:17.12g}" if ref_time else (f"{'gave up':>17s}" if rec.get("rc") else f"{'(no result)':>17s}")
            states = f"{result.states}{'' if result.exact else 'L'}"
            faster = (f"{ref_wall / process:4.0f}/{ref_wall / planner:4.0f}x" if process and ref_wall and not gave_up
                      else f"{'-':>11s}")
            print(f"{name:14s} {config:22s} {states:>7s} {result.predicted_time_s:17.12g} {ref_txt} "
                  f"{(f'{diff:8.1e}' if diff is not None else '       -')} {''.join(SHORT[n] for n in names):>5s} "
                  f"{1e3 * wall:7.2f}ms {(f'{process:6.3f}s' if process else '      -')} "
                  f"{(f'{planner:6.3f}s' if planner else '      -')} "
                  f"{(f'{ref_wall:8.2f}s' if ref_wall else '        -')} {faster}", flush=True)
    finished = [r for r in rows if r["rel_diff"] is not None]
    if finished:
        worst = max(finished, key=lambda r: r["rel_diff"])
        print(f"\n{len(finished)} lines the reference finished: worst relative difference {worst['rel_diff']:.1e} "
              f"({worst['profile']} {worst['config']}); 'L' = linearised order (states exceeded the limit)")
        slow = [r for r in finished if r["ref_wall_s"] >= 20 and r["process_s"]]
        for key, what in (("process_s", "`pipeboard plan`"), ("planner_process_s", "the planner's process")):
            if slow:
                fast = [r for r in slow if r["ref_wall_s"] / r[key] >= 100]
                print(f"lines the reference took 20 s or more on: {len(fast)} of {len(slow)} at least 100x faster, "
                      f"{what} against its whole process: " +
                      ", ".join(f"{r['profile']} {r['config']} {r['ref_wall_s'] / r[key]:.0f}x" for r in slow))
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
