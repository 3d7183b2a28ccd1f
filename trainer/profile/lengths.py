"""A profile's costs at the sequence lengths its task's data has (docs/variable-shapes.md).

A task padded per batch has one length per batch. The profiler measures every layer at a few
lengths chosen from the data (``choose_lengths``: the shortest, the longest and quantiles of the
per-batch padded lengths between them) and keeps, per layer, the times and bytes at each
(``LengthCosts``). A cost at any other length is the straight line between the two measured
lengths around it (beyond them, the nearest segment's line, never below zero): piecewise linear
follows any curve through its measured points, where one fitted form per layer (linear,
quadratic) fits some layers and not others. The histogram of per-batch lengths is what the
planner assumes: the profile's layers carry the expected cost over it, each band at its middle
length weighted by its share of the batches, because time is not linear in length and the cost at
the mean length is not the mean cost.

Plain data without torch: the planner reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

# The layer fields that change with the length; every other field is the same at every length.
VARYING = ("forward_ms", "backward_ms", "backward_input_ms", "forward_spread_ms", "backward_spread_ms",
           "activation_bytes", "saved_bytes", "weight_grad_bytes",
           "weight_input_bytes")
POINTS = 4  # lengths measured by default
BANDS = 8  # histogram bands by default


def choose_lengths(lengths: Sequence[int], points: int = POINTS) -> list[int]:
    """``points`` lengths at evenly spaced quantiles of ``lengths`` (shortest and longest
    included), each one the data has; fewer where the data has fewer distinct lengths."""
    if not lengths:
        raise ValueError("lengths: no batches to choose lengths from")
    if points < 1:
        raise ValueError(f"points must be >= 1, got {points}")
    xs = sorted(int(n) for n in lengths)
    if points == 1:
        return [xs[len(xs) // 2]]
    return sorted({xs[round(k * (len(xs) - 1) / (points - 1))] for k in range(points)})


def histogram(lengths: Sequence[int], bands: int = BANDS) -> tuple[list[float], list[int]]:
    """(edges, counts): ``bands`` equal bands from the shortest to the longest length (the last
    band includes its upper edge); one band when every length is the same."""
    if not lengths:
        raise ValueError("lengths: no batches for a histogram")
    lo, hi = min(lengths), max(lengths)
    if lo == hi:
        return [float(lo), float(hi)], [len(lengths)]
    width = (hi - lo) / bands
    edges = [lo + k * width for k in range(bands)] + [float(hi)]
    counts = [0] * bands
    for n in lengths:
        counts[min(bands - 1, int((n - lo) / width))] += 1
    return edges, counts


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """The piecewise-linear line through (xs, ys) (xs ascending) at ``x``; beyond the ends the
    nearest segment's line; never below zero. One point: its value everywhere."""
    if len(xs) == 1:
        return float(ys[0])
    k = 1
    while k < len(xs) - 1 and x > xs[k]:
        k += 1
    x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def _at(xs: Sequence[float], values: list, x: float):
    """One field's value at ``x`` from its values at ``xs``: a number, a list (per output), or None."""
    if any(v is None for v in values):
        return None
    if isinstance(values[0], list):
        return [interpolate(xs, [v[i] for v in values], x) for i in range(len(values[0]))]
    return interpolate(xs, values, x)


@dataclass
class LengthCosts:
    """Per layer, the varying fields measured at each of ``measured`` lengths of input dimension
    ``dim``, and the histogram (``edges``, ``counts``) of the per-batch padded lengths the data
    has, collated at ``batch_size`` samples a batch."""

    dim: int
    measured: list[int]
    layers: dict[str, dict[str, list]]
    edges: list[float]
    counts: list[int]
    batch_size: int | None = None

    def band_lengths(self) -> list[float]:
        """Each histogram band's middle length."""
        if len(self.edges) == 2 and self.edges[0] == self.edges[1]:
            return [self.edges[0]]
        return [(a + b) / 2 for a, b in zip(self.edges, self.edges[1:])]

    def at(self, length: float) -> dict[str, dict[str, Any]]:
        """Per layer, the varying fields at ``length``."""
        return {name: {f: _at(self.measured, values, length) for f, values in fields.items()}
                for name, fields in self.layers.items()}

    def expected(self) -> dict[str, dict[str, Any]]:
        """Per layer, each varying field's expectation over the histogram (band by band)."""
        total = sum(self.counts)
        bands = [(n, c / total) for n, c in zip(self.band_lengths(), self.counts) if c]
        out: dict[str, dict[str, Any]] = {}
        for name, fields in self.layers.items():
            out[name] = {}
            for f, values in fields.items():
                at = [(_at(self.measured, values, n), w) for n, w in bands]
                if at[0][0] is None:
                    out[name][f] = None
                elif isinstance(at[0][0], list):
                    out[name][f] = [sum(v[i] * w for v, w in at) for i in range(len(at[0][0]))]
                else:
                    out[name][f] = sum(v * w for v, w in at)
        return out

    def mean_length(self) -> float:
        total = sum(self.counts)
        return sum(n * c for n, c in zip(self.band_lengths(), self.counts)) / total

    def assumed(self) -> dict[str, Any]:
        """What a plan made from this profile assumed about lengths (kept in its options)."""
        return {"dim": self.dim, "measured": list(self.measured), "batch_size": self.batch_size,
                "histogram": {"edges": list(self.edges), "counts": list(self.counts)},
                "mean_length": self.mean_length()}

    def to_dict(self) -> dict[str, Any]:
        return {"dim": self.dim, "measured": list(self.measured), "batch_size": self.batch_size,
                "histogram": {"edges": list(self.edges), "counts": list(self.counts)},
                "layers": {name: {f: list(v) for f, v in fields.items()} for name, fields in self.layers.items()}}

    @classmethod
    def from_dict(cls, raw: Any, layer_names: Iterable[str]) -> LengthCosts:
        """Checked: raises ValueError naming the field (the schema turns it into a ProfileError)."""
        if not isinstance(raw, dict):
            raise ValueError("field 'lengths' must be an object or null")
        unknown = set(raw) - {"dim", "measured", "batch_size", "histogram", "layers"}
        if unknown:
            raise ValueError(f"lengths has unknown field(s) {sorted(unknown)}")
        dim, measured, bs = raw.get("dim"), raw.get("measured"), raw.get("batch_size")
        if not _count(dim):
            raise ValueError(f"lengths.dim must be a positive integer, got {dim!r}")
        if (not isinstance(measured, list) or not measured or not all(_count(n) for n in measured)
                or measured != sorted(set(measured))):
            raise ValueError(f"lengths.measured must be a non-empty ascending list of distinct positive integers, "
                             f"got {measured!r}")
        if bs is not None and not _count(bs):
            raise ValueError(f"lengths.batch_size must be a positive integer or null, got {bs!r}")
        hist = raw.get("histogram")
        if not isinstance(hist, dict) or set(hist) != {"edges", "counts"}:
            raise ValueError("lengths.histogram must be an object with 'edges' and 'counts'")
        edges, counts = hist["edges"], hist["counts"]
        if (not isinstance(counts, list) or not counts or not all(isinstance(c, int) and not isinstance(c, bool)
                                                                  and c >= 0 for c in counts) or not sum(counts)):
            raise ValueError("lengths.histogram.counts must be a list of counts >= 0, not all 0")
        if (not isinstance(edges, list) or len(edges) != len(counts) + 1 or not all(_number(e) for e in edges)
                or edges != sorted(edges)):
            raise ValueError("lengths.histogram.edges must be len(counts) + 1 ascending numbers")
        layers = raw.get("layers")
        names = set(layer_names)
        if not isinstance(layers, dict) or set(layers) - names:
            raise ValueError(f"lengths.layers must map the profile's layer names to their fields, "
                             f"unknown: {sorted(set(layers) - names) if isinstance(layers, dict) else layers!r}")
        for name, fields in layers.items():
            where = f"lengths.layers[{name!r}]"
            if not isinstance(fields, dict) or set(fields) - set(VARYING):
                raise ValueError(f"{where} must map fields of {list(VARYING)} to one value per measured length")
            for f, values in fields.items():
                ok = isinstance(values, list) and len(values) == len(measured) and (
                    all(v is None for v in values) or all(_number(v) for v in values)
                    or all(isinstance(v, list) and len(v) == len(values[0]) and all(_number(x) for x in v)
                           for v in values))
                if not ok:
                    raise ValueError(f"{where}.{f} must be {len(measured)} numbers >= 0 (or lists of them, or nulls)")
        return cls(dim=dim, measured=list(measured), layers={n: dict(f) for n, f in layers.items()},
                   edges=[float(e) for e in edges], counts=list(counts), batch_size=bs)


def _count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
