"""The Profile: per-layer measurements that the planner and simulator consume.

A profile is plain data with a versioned JSON form (see ``docs/profile-format.md``). Times are
milliseconds per minibatch of ``batch_size`` samples, sizes are bytes, exactly as PipeDream's
graph.txt records them, so importing a published profile loses nothing.

Version 2 adds what the simulator needs beyond PipeDream's fields, all optional (a version 1
profile loads with them unset): per layer, the input-gradient part of the backward
(``backward_input_ms``; the weight-gradient part is the rest) and the optimizer step of the
layer's parameters (``optimizer_ms``), the weight-gradient part of the backward measured at a
larger batch (``weight_batched_ms`` at the profile's ``weight_batch_size``: what one batched
W(-1) over several microbatches costs); per profile, the measured point-to-point ``link`` and the
runtime's per-action ``overhead``, and the ``pilot`` runs' calibration of what the layers' times
miss in a run; for inputs that vary in length, the layers' costs at several lengths and the
data's length histogram (``lengths``, ``pipeboard.trainer.profile.lengths``). Older version 2
files without these still load.

The calibration records (``link``, ``overhead``, ``pilot``) are in ``calibration_records.py``.
``ProfileError`` is defined in ``profile_error.py`` and imported from here by most of its users.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeboard.trainer.profile.calibration_records import Link, Overhead, Pilot
from pipeboard.trainer.profile.lengths import LengthCosts
from pipeboard.trainer.profile.profile_error import ProfileError, is_size

# The capture that names a profile's layers (pipeboard.trainer.profile.capture), kept in every
# profile's meta and in the service's profile cache key: a profile made by another capture (the
# fx era's layer names, "linear_1") names layers this one does not have, so it is never reused.
CAPTURE_VERSION = "export-1"

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
FORMAT_NAME = "pipeboard.profile"


@dataclass
class Layer:
    """One node of the layer graph.

    ``activation_bytes`` is a float, or a list of floats for a node with several outputs (as in
    graph.txt's ``[a; b]``); ``activation_total`` is what the planner uses.
    """

    name: str
    desc: str = ""
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    activation_bytes: float | list[float] = 0.0
    parameter_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    forward_spread_ms: float = 0.0
    backward_spread_ms: float = 0.0
    stage_id: int | None = None
    backward_input_ms: float | None = None  # the input-gradient part of backward_ms (None: not measured)
    optimizer_ms: float | None = None  # one optimizer step of this layer's parameters (None: not measured)
    weight_batched_ms: float | None = None  # weight-gradient part at the profile's weight_batch_size samples
    # what autograd saves for the backward while the layer's forward runs, each storage once
    # (profile/saved_bytes.py): what a microbatch in flight holds (None: not measured, the
    # output's bytes stand in)
    saved_bytes: float | None = None
    # what a split backward keeps from BI to W: the gradients of the outputs its ops with a
    # parameter operand compute (None: not measured)
    weight_grad_bytes: float | None = None
    weight_input_bytes: float | None = None  # those ops' other inputs, which W reads (None: not measured)

    @property
    def backward_weight_ms(self) -> float | None:
        """The weight-gradient part of the backward: what the input gradients leave of it."""
        if self.backward_input_ms is None:
            return None
        return max(0.0, self.backward_ms - self.backward_input_ms)

    @property
    def activation_total(self) -> float:
        a = self.activation_bytes
        return float(sum(a)) if isinstance(a, list) else float(a)

    @property
    def compute_ms(self) -> float:
        return self.forward_ms + self.backward_ms


def find_cycle(names: list[str], edges: list[tuple[str, str]]) -> list[str] | None:
    """A cycle of the edge graph as node names ``[a, b, ..., a]``, or None for a DAG.

    Kahn's algorithm removes every node not on or behind a cycle; walking predecessors among the
    rest must then revisit a node, and the walk from that node back to itself is a cycle.
    """
    indegree = dict.fromkeys(names, 0)
    succ: dict[str, list[str]] = {n: [] for n in names}
    pred: dict[str, list[str]] = {n: [] for n in names}
    for a, b in edges:
        succ[a].append(b)
        pred[b].append(a)
        indegree[b] += 1
    ready = [n for n in names if indegree[n] == 0]
    while ready:
        for m in succ[ready.pop()]:
            indegree[m] -= 1
            if indegree[m] == 0:
                ready.append(m)
    left = {n for n in names if indegree[n] > 0}
    if not left:
        return None
    walk, seen = [next(n for n in names if n in left)], set()
    while walk[-1] not in seen:
        seen.add(walk[-1])
        walk.append(next(p for p in pred[walk[-1]] if p in left))
    cycle = walk[walk.index(walk[-1]):]
    return cycle[::-1]


def _check_layer(raw: dict[str, Any], i: int) -> None:
    """Field types of one JSON layer, so a bad value is reported where it is, not in the planner."""
    where = f"profile JSON: layers[{i}]"
    if not isinstance(raw["name"], str) or not raw["name"]:
        raise ProfileError(f"{where}: field 'name' must be a non-empty string")
    if not isinstance(raw.get("desc", ""), str):
        raise ProfileError(f"{where}: field 'desc' must be a string")
    for key in ("forward_ms", "backward_ms", "parameter_bytes", "optimizer_bytes", "forward_spread_ms", "backward_spread_ms"):
        if key in raw and not is_size(raw[key]):
            raise ProfileError(f"{where}: field {key!r} must be a finite number >= 0, got {raw[key]!r}")
    for key in ("backward_input_ms", "optimizer_ms", "weight_batched_ms", "saved_bytes", "weight_grad_bytes",
                "weight_input_bytes"):
        if raw.get(key) is not None and not is_size(raw[key]):
            raise ProfileError(f"{where}: field {key!r} must be a finite number >= 0 or null, got {raw[key]!r}")
    act = raw.get("activation_bytes", 0.0)
    if not (is_size(act) or (isinstance(act, list) and all(is_size(a) for a in act))):
        raise ProfileError(f"{where}: field 'activation_bytes' must be a number >= 0 or a list of them, got {act!r}")
    stage = raw.get("stage_id")
    if stage is not None and (isinstance(stage, bool) or not isinstance(stage, int)):
        raise ProfileError(f"{where}: field 'stage_id' must be an integer or null, got {stage!r}")


def _lengths(raw: Any, version: int, names: set[str]) -> LengthCosts | None:
    if raw is None:
        return None
    if version == 1:
        raise ProfileError("profile JSON: field 'lengths' needs version 2")
    try:
        return LengthCosts.from_dict(raw, names)
    except ValueError as exc:
        raise ProfileError(f"profile JSON: {exc}") from None


@dataclass
class Profile:
    """Layers in topological order plus the edges of their DAG (by layer name)."""

    layers: list[Layer]
    edges: list[tuple[str, str]] = field(default_factory=list)
    model: str = ""
    batch_size: int | None = None
    device: str = "cpu"
    meta: dict[str, Any] = field(default_factory=dict)
    link: Link | None = None
    overhead: Overhead | None = None  # the runtime's per-action overhead (pipeboard.trainer.runtime.overhead)
    pilot: Pilot | None = None  # what a run adds to the layers' times (pipeboard.trainer.runtime.pilot)
    weight_batch_size: int | None = None  # samples the layers' weight_batched_ms are for
    # a task whose inputs vary in length: the layers' costs at each measured length and the data's
    # per-batch lengths; the layers above then hold the expected costs over those lengths
    lengths: LengthCosts | None = None

    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def at_length(self, length: float) -> Profile:
        """This profile with each layer's time and bytes at ``length`` (``LengthCosts.at``)."""
        if self.lengths is None:
            raise ProfileError(f"profile of {self.model!r} was measured at one length: no costs at length {length}")
        at = self.lengths.at(length)
        layers = [replace(layer, **at[layer.name]) if layer.name in at else layer for layer in self.layers]
        return replace(self, layers=layers)

    def at_longest(self) -> Profile:
        """What memory must fit: the layers at the longest measured length (a batch padded to it
        keeps the most activations); this profile itself when it was measured at one length."""
        return self if self.lengths is None else self.at_length(max(self.lengths.measured))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": SCHEMA_VERSION,
            "model": self.model,
            "batch_size": self.batch_size,
            "device": self.device,
            "meta": self.meta,
            "layers": [asdict(layer) for layer in self.layers],
            "edges": [list(e) for e in self.edges],
            "link": None if self.link is None else asdict(self.link),
            "overhead": None if self.overhead is None else asdict(self.overhead),
            "pilot": None if self.pilot is None else asdict(self.pilot),
            "weight_batch_size": self.weight_batch_size,
            "lengths": None if self.lengths is None else self.lengths.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Profile:
        if not isinstance(data, dict):
            raise ProfileError("profile JSON: the top level must be an object")
        if data.get("format") != FORMAT_NAME:
            raise ProfileError(f"profile JSON: field 'format' must be {FORMAT_NAME!r}")
        version = data.get("version")
        if version not in READABLE_VERSIONS:
            raise ProfileError(f"profile JSON: unsupported 'version' {version!r} (expected one of {READABLE_VERSIONS})")
        raw_layers = data.get("layers")
        if not isinstance(raw_layers, list) or not raw_layers:
            raise ProfileError("profile JSON: field 'layers' must be a non-empty list")
        # version 1 predates the optional measurements: its layers may not carry them
        known = set(Layer.__dataclass_fields__) - (
            {"backward_input_ms", "optimizer_ms", "weight_batched_ms", "saved_bytes", "weight_grad_bytes",
             "weight_input_bytes"} if version == 1 else set())
        layers = []
        for i, raw in enumerate(raw_layers):
            if not isinstance(raw, dict) or "name" not in raw:
                raise ProfileError(f"profile JSON: layers[{i}] must be an object with a 'name'")
            unknown = set(raw) - known
            if unknown:
                raise ProfileError(f"profile JSON: layers[{i}] has unknown field(s) {sorted(unknown)}")
            _check_layer(raw, i)
            layers.append(Layer(**raw))
        names = {layer.name for layer in layers}
        if len(names) != len(layers):
            raise ProfileError("profile JSON: layer names must be unique")
        batch_size = data.get("batch_size")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise ProfileError(f"profile JSON: field 'batch_size' must be a positive integer or null, got {batch_size!r}")
        wbs = data.get("weight_batch_size")
        if wbs is not None and (version == 1 or isinstance(wbs, bool) or not isinstance(wbs, int) or wbs < 1):
            raise ProfileError(f"profile JSON: field 'weight_batch_size' must be a positive integer or null (v2), got {wbs!r}")
        if not isinstance(data.get("meta", {}) or {}, dict):
            raise ProfileError("profile JSON: field 'meta' must be an object")
        if not isinstance(data.get("edges", []), list):
            raise ProfileError("profile JSON: field 'edges' must be a list of [src, dst] pairs")
        edges = []
        for i, e in enumerate(data.get("edges", [])):
            if not (isinstance(e, (list, tuple)) and len(e) == 2 and e[0] in names and e[1] in names):
                raise ProfileError(f"profile JSON: edges[{i}] must be [src, dst] naming known layers")
            edges.append((e[0], e[1]))
        cycle = find_cycle([layer.name for layer in layers], edges)
        if cycle:
            raise ProfileError(f"profile JSON: field 'edges' has a cycle: {' -> '.join(cycle)}")
        return cls(
            layers=layers,
            edges=edges,
            model=data.get("model", ""),
            batch_size=batch_size,
            device=data.get("device", "cpu"),
            meta=data.get("meta", {}) or {},
            link=None if data.get("link") is None or version == 1 else Link.from_dict(data["link"]),
            overhead=None if data.get("overhead") is None or version == 1 else Overhead.from_dict(data["overhead"]),
            pilot=None if data.get("pilot") is None or version == 1 else Pilot.from_dict(data["pilot"]),
            weight_batch_size=wbs,
            lengths=_lengths(data.get("lengths"), version, names),
        )

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"profile JSON: line {exc.lineno}: {exc.msg}") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

