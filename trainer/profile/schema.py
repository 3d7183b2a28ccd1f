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
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeboard.trainer.profile.lengths import LengthCosts

# The capture that names a profile's layers (pipeboard.trainer.profile.capture), kept in every
# profile's meta and in the service's profile cache key: a profile made by another capture (the
# fx era's layer names, "linear_1") names layers this one does not have, so it is never reused.
CAPTURE_VERSION = "export-1"

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
FORMAT_NAME = "pipeboard.profile"


class ProfileError(ValueError):
    """A profile (JSON or graph.txt) that cannot be read; the message names where and what."""


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


@dataclass
class Link:
    """Measured point-to-point transfers between two worker processes: a transfer of ``n`` bytes
    takes ``latency_ms + n / bytes_per_ms`` from the send being posted to the data being usable
    at the receiver, and posting a send occupies the sender for ``post_ms``."""

    latency_ms: float
    bytes_per_ms: float
    post_ms: float = 0.0
    backend: str = "gloo"
    samples: list[list[float]] = field(default_factory=list)  # [bytes, one-way ms, post ms] as measured
    # a gloo all-reduce between two processes: latency_ms + bytes / bytes_per_ms (None: not measured)
    allreduce_latency_ms: float | None = None
    allreduce_bytes_per_ms: float | None = None

    def allreduce_ms(self, nbytes: float, replicas: int) -> float:
        """A ring all-reduce of ``nbytes`` over ``replicas`` processes: 2 (r - 1) steps of
        nbytes / r each; from the measured two-process all-reduce where there is one (its latency
        spread over its 2 steps), else from the point-to-point line."""
        r = replicas
        if r < 2:
            return 0.0
        if self.allreduce_latency_ms is not None and self.allreduce_bytes_per_ms:
            return (r - 1) * self.allreduce_latency_ms + 2 * (r - 1) / r * nbytes / self.allreduce_bytes_per_ms
        return 2 * (r - 1) * (nbytes / r / self.bytes_per_ms + self.latency_ms)

    def transfer_ms(self, nbytes: float) -> float:
        return self.latency_ms + nbytes / self.bytes_per_ms if nbytes > 0 else 0.0

    @classmethod
    def from_dict(cls, raw: Any) -> Link:
        if not isinstance(raw, dict):
            raise ProfileError("profile JSON: field 'link' must be an object or null")
        for key in ("latency_ms", "bytes_per_ms", "post_ms", "allreduce_latency_ms", "allreduce_bytes_per_ms"):
            if raw.get(key) is not None and not _is_size(raw[key]):
                raise ProfileError(f"profile JSON: link.{key} must be a finite number >= 0, got {raw[key]!r}")
        if "latency_ms" not in raw or not raw.get("bytes_per_ms"):
            raise ProfileError("profile JSON: link needs 'latency_ms' and a positive 'bytes_per_ms'")
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ProfileError(f"profile JSON: link has unknown field(s) {sorted(unknown)}")
        return cls(**raw)


OVERHEAD_FIELDS = ("forward_ms", "backward_ms", "backward_input_ms", "weight_call_ms", "step_ms")


@dataclass
class Overhead:
    """The runtime's own milliseconds per action (F, B, BI, one W(-1) call, the step) beyond the
    profiled compute, measured on tiny stages (``pipeboard.trainer.runtime.overhead.calibrate``): each
    sample is ``{"layers": n, "last": bool, "forward_ms": ..., ...}`` for a stage of ``n``
    parameterised layers, the last stage (which computes the loss) or not."""

    samples: list[dict[str, Any]]
    microbatches: int = 8  # microbatches per measured round (one W(-1) covers them all)
    # Outside the actions (pipeboard.trainer.runtime.overhead.measure_executor_overhead): the
    # executor's walk per action, and per step its set-up and the worker's step report.
    executor_action_ms: float = 0.0
    executor_step_ms: float = 0.0
    # W per parameterised layer that is not a plain Linear, per microbatch (computed one layer and
    # one microbatch at a time: measure_generic_weight_overhead)
    generic_weight_ms: float = 0.0
    # Getting one batch's microbatches from the task's data, per step (measure_data_load): the
    # first stage (inputs and targets) and the last stage (targets); None: not measured.
    load_first_ms: float | None = None
    load_last_ms: float | None = None

    def at(self, layers: int, last: bool) -> dict[str, float]:
        """Milliseconds per action for a stage of ``layers`` parameterised layers: linear in the
        layer count between (and beyond) the measured counts of the same kind of stage, never
        below zero; a kind never measured takes the other kind's."""
        same = sorted((s for s in self.samples if bool(s["last"]) == last), key=lambda s: s["layers"])
        pts = same or sorted(self.samples, key=lambda s: s["layers"])
        lo, hi = pts[0], pts[-1]
        out = {}
        for key in OVERHEAD_FIELDS:
            if hi["layers"] == lo["layers"]:
                out[key] = float(lo[key])
            else:
                slope = (hi[key] - lo[key]) / (hi["layers"] - lo["layers"])
                out[key] = max(0.0, lo[key] + slope * (layers - lo["layers"]))
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> Overhead:
        if not isinstance(raw, dict) or not isinstance(raw.get("samples"), list) or not raw["samples"]:
            raise ProfileError("profile JSON: field 'overhead' must be an object with a non-empty 'samples' list, or null")
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ProfileError(f"profile JSON: overhead has unknown field(s) {sorted(unknown)}")
        mbs = raw.get("microbatches", 8)
        if isinstance(mbs, bool) or not isinstance(mbs, int) or mbs < 1:
            raise ProfileError(f"profile JSON: overhead.microbatches must be a positive integer, got {mbs!r}")
        for i, s in enumerate(raw["samples"]):
            where = f"profile JSON: overhead.samples[{i}]"
            if not isinstance(s, dict):
                raise ProfileError(f"{where} must be an object")
            n = s.get("layers")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ProfileError(f"{where}: field 'layers' must be a positive integer, got {n!r}")
            if not isinstance(s.get("last"), bool):
                raise ProfileError(f"{where}: field 'last' must be true or false")
            for key in OVERHEAD_FIELDS:
                if not _is_size(s.get(key)):
                    raise ProfileError(f"{where}: field {key!r} must be a finite number >= 0, got {s.get(key)!r}")
            extra = set(s) - {"layers", "last", *OVERHEAD_FIELDS}
            if extra:
                raise ProfileError(f"{where} has unknown field(s) {sorted(extra)}")
        per_run = {}
        for key in ("executor_action_ms", "executor_step_ms", "generic_weight_ms", "load_first_ms", "load_last_ms"):
            value = raw.get(key)
            if value is None and key.startswith("load_"):
                continue
            if key in raw and not _is_size(value):
                raise ProfileError(f"profile JSON: overhead.{key} must be a finite number >= 0, got {value!r}")
            if key in raw:
                per_run[key] = float(value)
        return cls(samples=[dict(s) for s in raw["samples"]], microbatches=mbs, **per_run)


PILOT_TERMS = ("forward", "backward", "backward_input", "weight", "weight_batched", "step")


@dataclass
class PilotKind:
    """One pilot run's figures (``pipeboard.trainer.runtime.pilot``): per kind of action, measured
    over predicted seconds (``factors``, keys of PILOT_TERMS); the runtime's time between recorded
    actions per compute action (``gaps_ms``); for replicated stages, the all-reduce's time beyond
    its predicted transfer (``allreduce_wait_ms``)."""

    stages: int
    replicas: int
    factors: dict[str, float]
    gaps_ms: float = 0.0
    allreduce_wait_ms: float | None = None
    step_factor: float | None = None  # the pilot's measured step over its prediction with these figures

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> PilotKind:
        if not isinstance(raw, dict):
            raise ProfileError(f"profile JSON: {where} must be an object or null")
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ProfileError(f"profile JSON: {where} has unknown field(s) {sorted(unknown)}")
        for key in ("stages", "replicas"):
            n = raw.get(key)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ProfileError(f"profile JSON: {where}.{key} must be a positive integer, got {n!r}")
        fs = raw.get("factors")
        if not isinstance(fs, dict) or set(fs) - set(PILOT_TERMS) or not all(_is_size(v) and v > 0 for v in fs.values()):
            raise ProfileError(f"profile JSON: {where}.factors must map names of {list(PILOT_TERMS)} to numbers > 0")
        for key in ("gaps_ms", "allreduce_wait_ms"):
            if raw.get(key) is not None and not _is_size(raw[key]):
                raise ProfileError(f"profile JSON: {where}.{key} must be a finite number >= 0, got {raw[key]!r}")
        sf = raw.get("step_factor")
        if sf is not None and not (_is_size(sf) and sf > 0):
            raise ProfileError(f"profile JSON: {where}.step_factor must be a number > 0 or null, got {sf!r}")
        return cls(stages=raw["stages"], replicas=raw["replicas"], factors={k: float(v) for k, v in fs.items()},
                   gaps_ms=float(raw.get("gaps_ms") or 0.0),
                   allreduce_wait_ms=None if raw.get("allreduce_wait_ms") is None else float(raw["allreduce_wait_ms"]),
                   step_factor=None if sf is None else float(sf))


@dataclass
class Pilot:
    """The pilot runs of a profile (``pipeboard.trainer.runtime.pilot``): a pipeline of stages of
    one replica and one replicated stage, each at the run's ``batch_size`` in ``microbatches``."""

    pipeline: PilotKind | None
    replicated: PilotKind | None
    batch_size: int
    microbatches: int
    steps: int
    wall_s: float = 0.0
    # more workers than cores: a pipeline of that many workers' measured step over its prediction
    # (the pipeline pilot's figures and the cores' busy-time bound applied): the OS taking turns
    oversubscribed_workers: int | None = None
    oversubscribed_factor: float | None = None
    # more workers than cores: the whole model on that many replicas, its measured step over its
    # prediction (the replicated pilot's figures and the busy-time bound): the same for data parallelism
    oversubscribed_replicated_factor: float | None = None

    def step_factor(self, workers: int, cores: int | None, replicated: bool = False, stages: int = 1) -> float:
        """What a run of ``workers`` on ``cores`` takes per step beyond its prediction, for a plan
        of ``stages`` stages (``replicated``: one of them on several replicas). With more workers
        than cores, the oversubscribed pilots' factors: data parallelism (one replicated stage)
        takes the replicated one's, a plan of several stages the pipeline's, as its processes
        hand each microbatch on and every handoff waits for the OS to run the receiver
        (docs/profile-format.md, ``pilot``, has the measured case); either where the other was
        not measured. Otherwise the pipeline pilot's own factor, or (a replicated stage) the
        replicated pilot's; 1 where not measured."""
        if cores is not None and workers > cores:
            pipeline, data_parallel = self.oversubscribed_factor, self.oversubscribed_replicated_factor
            if replicated and stages == 1:
                return data_parallel or pipeline or 1.0
            return pipeline or (data_parallel if replicated else None) or 1.0
        kind = self.kind(2 if replicated else 1)
        return (kind.step_factor if kind is not None else None) or 1.0

    def kind(self, replicas: int) -> PilotKind | None:
        """The figures for a stage of ``replicas`` replicas."""
        return self.replicated if replicas > 1 else self.pipeline

    @classmethod
    def from_dict(cls, raw: Any) -> Pilot:
        if not isinstance(raw, dict):
            raise ProfileError("profile JSON: field 'pilot' must be an object or null")
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ProfileError(f"profile JSON: pilot has unknown field(s) {sorted(unknown)}")
        for key in ("batch_size", "microbatches", "steps"):
            n = raw.get(key)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ProfileError(f"profile JSON: pilot.{key} must be a positive integer, got {n!r}")
        if raw.get("wall_s") is not None and not _is_size(raw["wall_s"]):
            raise ProfileError(f"profile JSON: pilot.wall_s must be a finite number >= 0, got {raw['wall_s']!r}")
        n = raw.get("oversubscribed_workers")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
            raise ProfileError(f"profile JSON: pilot.oversubscribed_workers must be an integer >= 2 or null, got {n!r}")
        f = raw.get("oversubscribed_factor")
        if f is not None and not (_is_size(f) and f > 0):
            raise ProfileError(f"profile JSON: pilot.oversubscribed_factor must be a number > 0 or null, got {f!r}")
        fr = raw.get("oversubscribed_replicated_factor")
        if fr is not None and not (_is_size(fr) and fr > 0):
            raise ProfileError("profile JSON: pilot.oversubscribed_replicated_factor must be a number > 0 or null, "
                               f"got {fr!r}")
        kinds = {key: None if raw.get(key) is None else PilotKind.from_dict(raw[key], f"pilot.{key}")
                 for key in ("pipeline", "replicated")}
        return cls(**kinds, batch_size=raw["batch_size"], microbatches=raw["microbatches"], steps=raw["steps"],
                   wall_s=float(raw.get("wall_s") or 0.0), oversubscribed_workers=n,
                   oversubscribed_factor=None if f is None else float(f),
                   oversubscribed_replicated_factor=None if fr is None else float(fr))


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


def _is_size(x: Any) -> bool:
    """A finite, non-negative number (times and byte counts)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _check_layer(raw: dict[str, Any], i: int) -> None:
    """Field types of one JSON layer, so a bad value is reported where it is, not in the planner."""
    where = f"profile JSON: layers[{i}]"
    if not isinstance(raw["name"], str) or not raw["name"]:
        raise ProfileError(f"{where}: field 'name' must be a non-empty string")
    if not isinstance(raw.get("desc", ""), str):
        raise ProfileError(f"{where}: field 'desc' must be a string")
    for key in ("forward_ms", "backward_ms", "parameter_bytes", "optimizer_bytes", "forward_spread_ms", "backward_spread_ms"):
        if key in raw and not _is_size(raw[key]):
            raise ProfileError(f"{where}: field {key!r} must be a finite number >= 0, got {raw[key]!r}")
    for key in ("backward_input_ms", "optimizer_ms", "weight_batched_ms"):
        if raw.get(key) is not None and not _is_size(raw[key]):
            raise ProfileError(f"{where}: field {key!r} must be a finite number >= 0 or null, got {raw[key]!r}")
    act = raw.get("activation_bytes", 0.0)
    if not (_is_size(act) or (isinstance(act, list) and all(_is_size(a) for a in act))):
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
            {"backward_input_ms", "optimizer_ms", "weight_batched_ms"} if version == 1 else set())
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

