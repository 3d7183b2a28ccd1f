"""What a machine's calibration adds to a profile: the measured point-to-point and all-reduce
``Link``, the runtime's per-action ``Overhead`` and the ``Pilot`` runs' factors, with their JSON
reading and checks (the ``link``, ``overhead`` and ``pilot`` fields of ``Profile``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeboard.trainer.profile.profile_error import ProfileError, is_size


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
            if raw.get(key) is not None and not is_size(raw[key]):
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
    # Weight stashing's copy of a stage's weights before a step that keeps the version it
    # replaces (runtime/versions.py), as [weight bytes, ms] pairs (measure_stash_copy); None:
    # not measured.
    stash_copy: list[list[float]] | None = None

    def stash_copy_ms(self, nbytes: float) -> float:
        """Milliseconds to copy ``nbytes`` of weights: linear between the measured sizes, from
        zero below the smallest, the largest two's slope beyond (0 when not measured)."""
        if not self.stash_copy or nbytes <= 0:
            return 0.0
        pts = [(0.0, 0.0), *sorted((float(b), float(ms)) for b, ms in self.stash_copy)]
        # the measured segment that holds nbytes, else the last one, extended
        (b0, m0), (b1, m1) = next(((lo, hi) for lo, hi in zip(pts, pts[1:]) if nbytes <= hi[0]), pts[-2:])
        return max(0.0, m0 + (m1 - m0) * (nbytes - b0) / (b1 - b0)) if b1 > b0 else m1

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
                if not is_size(s.get(key)):
                    raise ProfileError(f"{where}: field {key!r} must be a finite number >= 0, got {s.get(key)!r}")
            extra = set(s) - {"layers", "last", *OVERHEAD_FIELDS}
            if extra:
                raise ProfileError(f"{where} has unknown field(s) {sorted(extra)}")
        per_run = {}
        for key in ("executor_action_ms", "executor_step_ms", "generic_weight_ms", "load_first_ms", "load_last_ms"):
            value = raw.get(key)
            if value is None and key.startswith("load_"):
                continue
            if key in raw and not is_size(value):
                raise ProfileError(f"profile JSON: overhead.{key} must be a finite number >= 0, got {value!r}")
            if key in raw:
                per_run[key] = float(value)
        copy = raw.get("stash_copy")
        if copy is not None:
            if (not isinstance(copy, list) or not copy
                    or not all(isinstance(pt, list) and len(pt) == 2 and all(map(is_size, pt)) and pt[0] > 0
                               for pt in copy)):
                raise ProfileError("profile JSON: overhead.stash_copy must be a non-empty list of [bytes > 0, ms >= 0] "
                                   f"pairs, or null; got {copy!r}")
            per_run["stash_copy"] = [[float(b), float(ms)] for b, ms in copy]
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
        if not isinstance(fs, dict) or set(fs) - set(PILOT_TERMS) or not all(is_size(v) and v > 0 for v in fs.values()):
            raise ProfileError(f"profile JSON: {where}.factors must map names of {list(PILOT_TERMS)} to numbers > 0")
        for key in ("gaps_ms", "allreduce_wait_ms"):
            if raw.get(key) is not None and not is_size(raw[key]):
                raise ProfileError(f"profile JSON: {where}.{key} must be a finite number >= 0, got {raw[key]!r}")
        sf = raw.get("step_factor")
        if sf is not None and not (is_size(sf) and sf > 0):
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
        if raw.get("wall_s") is not None and not is_size(raw["wall_s"]):
            raise ProfileError(f"profile JSON: pilot.wall_s must be a finite number >= 0, got {raw['wall_s']!r}")
        n = raw.get("oversubscribed_workers")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
            raise ProfileError(f"profile JSON: pilot.oversubscribed_workers must be an integer >= 2 or null, got {n!r}")
        f = raw.get("oversubscribed_factor")
        if f is not None and not (is_size(f) and f > 0):
            raise ProfileError(f"profile JSON: pilot.oversubscribed_factor must be a number > 0 or null, got {f!r}")
        fr = raw.get("oversubscribed_replicated_factor")
        if fr is not None and not (is_size(fr) and fr > 0):
            raise ProfileError("profile JSON: pilot.oversubscribed_replicated_factor must be a number > 0 or null, "
                               f"got {fr!r}")
        kinds = {key: None if raw.get(key) is None else PilotKind.from_dict(raw[key], f"pilot.{key}")
                 for key in ("pipeline", "replicated")}
        return cls(**kinds, batch_size=raw["batch_size"], microbatches=raw["microbatches"], steps=raw["steps"],
                   wall_s=float(raw.get("wall_s") or 0.0), oversubscribed_workers=n,
                   oversubscribed_factor=None if f is None else float(f),
                   oversubscribed_replicated_factor=None if fr is None else float(fr))
