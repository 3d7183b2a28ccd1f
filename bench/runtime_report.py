"""bench/runtime.py's report: medians, every ratio next to its target, and the prediction
against the measured step (kept apart from the runs it reads)."""

from __future__ import annotations

import statistics


def whole_label(microbatches: int, stages: int) -> str:
    return f"{stages} whole-model procs, {microbatches} mb"


def analytic_bubble(schedule: str, stages: int, microbatches: int) -> float:
    """The idle fraction the two-process ceiling takes off: (p - 1) / (m + p - 1) for a schedule that
    drains the pipeline before every update (gpipe, 1f1b); 0 for pipedream, whose pipeline stays
    full across updates."""
    name = schedule.partition(":")[0]
    return 0.0 if name == "pipedream" else (stages - 1) / (microbatches + stages - 1)



def report(name: str, c: dict, steps: int, rounds: int, scheds: list[str], res: dict[str, list[float]],
           predicted: dict[str, tuple[float, float]], microbatches: dict[str, int], stages: int) -> None:
    """Medians, then every ratio next to its target, then the prediction.

    A ratio is printed twice: of the two medians, and the median of the per-round ratios of runs
    made next to each other ("paired"), which drift between rounds cannot skew; the targets are
    read on the paired figure."""
    for s in scheds:  # the two-process ceiling: the whole-model processes' rate less the schedule's bubble
        m = microbatches[s]
        keep = 1 - analytic_bubble(s, stages, m)
        res[f"two-process ceiling {s}"] = [v * keep for v in res[whole_label(m, stages)]]
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"\n({name}) batch {c['batch_size']} in {c['microbatches']} microbatches, {steps} steps per run, "
          f"median of {rounds} alternating rounds (samples/s):")
    for k, v in med.items():
        print(f"  {k:28s} {v:9.1f}   rounds: {', '.join(f'{x:.0f}' for x in res[k])}")

    def ratio(top: str, bottom: str) -> tuple[float, float]:
        paired = statistics.median(a / b for a, b in zip(res[top], res[bottom]))
        return med[top] / med[bottom], paired

    def show(label: str, top: str, bottom: str, target: str = "", pct: bool = False) -> None:
        of_medians, paired = ratio(top, bottom)
        fmt = (lambda v: f"{v:6.1%}") if pct else (lambda v: f"{v:5.2f}x")
        print(f"  {label:46s} = {fmt(paired)} paired, {fmt(of_medians)} of medians{target}")

    want_torch = {"1f1b": 1.15, "pipedream": 1.3} if name == "a" else {}
    for s in scheds:
        target = f"   (target: >= {want_torch[s]:.2f}x)" if s in want_torch else ""
        show(f"ours {s} / torch 1F1B", f"ours {s}", "torch Schedule1F1B", target)
        show(f"ours {s} / its ceiling", f"ours {s}", f"ceiling {s}", "   (target: >= 90%)", pct=True)
        show(f"ours {s} / the two-process ceiling", f"ours {s}", f"two-process ceiling {s}", "   (target: >= 90%)", pct=True)
        if s.startswith("pipedream"):
            target = "   (target: >= 1.60x)" if name == "b" and s == "pipedream" else ""
            show(f"ours {s} / one process full batch", f"ours {s}", "one process full batch", target)
            show(f"the two-process ceiling {s} / one process", f"two-process ceiling {s}", "one process full batch")
    if "ceiling 1f1b" in med:
        show("torch 1F1B / 1f1b ceiling", "torch Schedule1F1B", "ceiling 1f1b", pct=True)
        show("torch 1F1B / the two-process 1f1b ceiling", "torch Schedule1F1B", "two-process ceiling 1f1b", pct=True)
    if "ours 1f1b uninstrumented" in med:
        of_medians, paired = ratio("ours 1f1b", "ours 1f1b uninstrumented")
        print(f"  instrumentation cost (1f1b): {1 - paired:+.1%} of throughput paired, "
              f"{1 - of_medians:+.1%} of medians")
    print("  predicted (pipeboard.trainer.schedule.predict fed the profiles, link and per-action overhead: the tiny-stage "
          "one, or the runtime floor) vs measured (median run; and the fastest run, which other work on the "
          "shared machine slowed least, as bench/predict.py compares), ms per step; target: within 10%:")
    for s in scheds:
        meas = c["batch_size"] / med[f"ours {s}"]
        fastest = c["batch_size"] / max(res[f"ours {s}"])
        tiny, floor = predicted[s]
        print(f"    {s:12s} measured {meas * 1e3:7.1f}  predicted {tiny * 1e3:7.1f} ({tiny / meas - 1:+.1%}), "
              f"with the runtime floor {floor * 1e3:7.1f} ({floor / meas - 1:+.1%}); "
              f"fastest run {fastest * 1e3:7.1f} ({tiny / fastest - 1:+.1%}, {floor / fastest - 1:+.1%})")
