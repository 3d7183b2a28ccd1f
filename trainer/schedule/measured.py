"""The measured time per training step: the one definition the summary, the dashboard and the
benchmarks share.

A step's completion time is when its last worker finished it. The steady-state time per step is
the least-squares slope of completion time against step number over the second half of the run:
the first half holds the pipeline's fill, first allocations and the allocator warming up, and a
slope (not the mean gap) stays right for an asynchronous schedule (pipedream), whose steps overlap
so that single gaps between completions can be near zero or doubled.

A pause between two steps (writing a checkpoint, an evaluation) is not a step's time: it splits
the tail into segments that share one slope, each with its own offset (so the pause itself counts
nowhere): a short run's one checkpoint would otherwise be spread over the steps of its tail
(docs/fidelity.md has the measured case). The runtime says where it paused (``pauses``: the steps
whose completion came after one; a step's metric point carries ``AFTER_PAUSE``); a gap over
``PAUSE_FACTOR`` times the typical one counts as a pause too (a run that did not say).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


PAUSE_FACTOR = 4.0  # a gap this many times the typical one is a pause, not a step
AFTER_PAUSE = "after_pause"  # a metric point's value: its step completed after a pause


def steady_step_s(completed_at: Mapping[int, float], pauses: Collection[int] = ()) -> float | None:
    """Seconds per step from ``{step: completion time}``; None with fewer than two steps or
    times that do not advance. ``pauses``: steps whose completion came after a pause."""
    steps = sorted(completed_at)
    n = len(steps)
    if n < 2:
        return None
    tail = steps[min(n // 2, n - 2):]
    var = cov = 0.0
    for segment in _segments(tail, completed_at, set(pauses)):
        mean_k = sum(segment) / len(segment)
        mean_t = sum(completed_at[k] for k in segment) / len(segment)
        var += sum((k - mean_k) ** 2 for k in segment)
        cov += sum((k - mean_k) * (completed_at[k] - mean_t) for k in segment)
    if var == 0:  # every segment a single step: the pauses were all there was
        return None
    slope = cov / var
    return slope if slope > 0 else None


def _segments(tail: list[int], t: Mapping[int, float], pauses: set[int]) -> list[list[int]]:
    """``tail`` cut before a step in ``pauses``, and where the gap to the previous step exceeds
    PAUSE_FACTOR times the typical gap:
    the median over two steps at a time (an asynchronous pipeline's single gaps alternate near 0
    and twice the step; pairs of them do not)."""
    pairs = sorted((t[b] - t[a]) / (b - a) for a, b in zip(tail, tail[2:]))
    if not pairs:
        return [tail]
    typical = pairs[len(pairs) // 2]
    segments = [[tail[0]]]
    for a, b in zip(tail, tail[1:]):
        if b in pauses or (typical > 0 and t[b] - t[a] > PAUSE_FACTOR * typical * (b - a)):
            segments.append([b])
        else:
            segments[-1].append(b)
    return segments
