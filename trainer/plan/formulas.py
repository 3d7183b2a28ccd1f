"""PipeDream's cost model, in one place: what a stage, an all-reduce, a transfer and a stash cost.

Every path of the planner calls these functions: the plain recurrence, each vectorised
strategy, reading a plan back out, the flat stages of a Plan and the baselines. So each formula
is written once, and a wrong constant here changes every plan (the tests against the reference
optimizer's printed optima and against a brute force with its own formulas then fail).

The formulas are the reference optimizer's (``compute_partitioning`` in msr-fiddle/pipedream's
``optimizer_graph_hierarchical.py``), operation for operation, because the planner must find
the reference's optimum as the same number, not a close one. They take Python floats or NumPy
arrays alike (arithmetic operators only; ``larger`` and ``unless`` pick the scalar or the array
form), so a vectorised strategy forms every entry with the same IEEE operations, in the same
order, as the plain recurrence: the same doubles. This module never imports NumPy itself.
"""

from __future__ import annotations

import math

INF = math.inf


class LevelSpec:
    """One level of the cluster as the recurrence sees it, with the options that shape its costs.

    ``sharing`` is the number of machines one level below (1 at level 1): a block kept whole as
    one stage on machines of this level has its all-reduce shared by them (the reference's
    ``num_machines_within_machine``). ``final``: the outermost level, whose only block starts at
    state 0. ``memory``: bytes per worker for the stash check (None: not checked).
    ``compression``: divides activation transfers (None: transfers are not counted).
    """

    __slots__ = ("machines", "bandwidth", "sharing", "final", "straight", "fewer", "memory", "compression")

    def __init__(self, machines: int, bandwidth: float, sharing: int = 1, final: bool = True, straight: bool = False,
                 fewer: bool = False, memory: float | None = None, compression: float | None = 1.0):
        self.machines, self.bandwidth, self.sharing, self.final = machines, bandwidth, sharing, final
        self.straight, self.fewer, self.memory, self.compression = straight, fewer, memory, compression

    def replica_counts(self, machines_left: int) -> range:
        """Replica counts m' a last stage may take when the block has ``machines_left`` (m + 1)
        machines: at least one is left to the stages before it; one only when ``straight``."""
        return range(1, min(2, machines_left) if self.straight else machines_left)

    def __repr__(self) -> str:
        return "LevelSpec(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


def level_specs(levels, straight=False, fewer=False, memory=None, compression=1.0) -> list[LevelSpec]:
    """``[(machines, bandwidth), ...]`` (innermost first) as one ``LevelSpec`` per level."""
    return [LevelSpec(machines, bandwidth, levels[idx - 1][0] if idx else 1, idx == len(levels) - 1,
                      straight, fewer, memory, compression)
            for idx, (machines, bandwidth) in enumerate(levels)]


def allreduce_s(params, replicas, bandwidth):
    """Synchronising ``params`` bytes of weights among ``replicas`` data-parallel copies per
    minibatch: a ring all-reduce moves 2(r-1)/r of the bytes out and as many in, 4(r-1)p/(B r)."""
    return (4 * (replicas - 1) * params) / (bandwidth * replicas)


def stage_s(compute, params, replicas, bandwidth, sharing=1):
    """A stage of ``compute`` seconds per minibatch on ``replicas`` copies: its compute and its
    all-reduce (shared by ``sharing`` workers, see ``LevelSpec``), divided among the copies."""
    return (compute + allreduce_s(params, replicas, bandwidth) / sharing) / replicas


def transfer_s(nbytes, replicas, bandwidth, compression):
    """Sending ``nbytes`` of activations across a cut and their gradients back (2x the bytes),
    each of ``replicas`` copies taking its share of the minibatches, reduced by ``compression``."""
    return (2.0 * nbytes) / (bandwidth * replicas) / compression


def larger(a, b):
    """``max(a, b)``, elementwise when either is a NumPy array."""
    if isinstance(a, float) and isinstance(b, float):
        return b if b > a else a
    import numpy  # (only reached with arrays: NumPy is loaded already)

    return numpy.maximum(a, b)


def unless(over, value):
    """``value``, or +inf where ``over`` holds (elementwise for arrays): a stage ruled out."""
    if getattr(over, "ndim", 0) == 0 and getattr(value, "ndim", 0) == 0:
        return INF if over else value
    import numpy

    return numpy.where(over, INF, value)


def first_stage_s(spec: LevelSpec, compute, params, activations, replicas):
    """A whole block as one stage on ``replicas`` machines (the reference's initial
    ``A[i][j][m]`` with m = replicas - 1): no transfers, the all-reduce shared as ``sharing``
    says; +inf when its stash does not fit in memory."""
    time = stage_s(compute, params, replicas, spec.bandwidth, spec.sharing)
    if spec.memory is None:
        return time
    factor = stash_factor(spec.machines, replicas, replicas)
    return unless(over_memory(stage_bytes(activations, params), factor, spec.memory), time)


def last_stage_s(spec: LevelSpec, compute, params, replicas, bytes_in, bytes_out):
    """A stage after a cut (states k+1..j) on ``replicas`` copies: ``stage_s`` with nothing
    shared, never below receiving its input or sending its output when transfers are counted.

    ``bytes_out`` is 0 after the last state (the reference sends nothing there; a transfer of
    nothing never exceeds the input's). The reference takes the larger of the two transfer
    times; the transfer time only grows with the bytes (division rounds monotonically), so
    taking the larger of the bytes first gives the same number with one division. The memory
    check depends on the machines the block uses so far (``over_memory``), so it is separate.
    """
    time = stage_s(compute, params, replicas, spec.bandwidth)
    if spec.compression is None:
        return time
    return larger(time, transfer_s(larger(bytes_in, bytes_out), replicas, spec.bandwidth, spec.compression))


def stash_factor(machines, used, replicas):
    """Minibatches a stage stashes activations and weights for: ceil((M - used) / replicas), the
    reference's estimate, ``used`` counting the machines of the block up to and including this
    stage (on integers: exactly ``math.ceil`` of the true division)."""
    return -((used - machines) // replicas)


def stage_bytes(activations, params):
    """What a stage stashes per minibatch in flight: its activations and its weights."""
    return activations + params


def over_memory(stash, factor, memory):
    """Whether a stage stashing ``stash`` bytes (``stage_bytes``) ``factor`` times exceeds
    ``memory`` bytes per worker (the reference's test; elementwise for arrays)."""
    return stash * factor > memory


def data_parallel_s(compute, params, levels) -> float:
    """Every worker holding the whole model: per level, innermost first, a single stage on all
    of the level's machines, as the reference estimates data parallelism."""
    time, below = compute, 1
    for workers, bandwidth in levels:
        time = stage_s(time, params, workers, bandwidth, below)
        below = workers
    return time


def flat_allreduce_s(params, replicas_per_level, bandwidths) -> float:
    """A flat stage's weight synchronisation: per level with r > 1 replicas an all-reduce at the
    level's bandwidth, shared by the replicas of the levels inside it."""
    total, inner = 0.0, 1
    for replicas, bandwidth in zip(replicas_per_level, bandwidths):
        if replicas > 1:
            total += allreduce_s(params, replicas, bandwidth) / inner
        inner *= replicas
    return total


def flat_stage_s(compute, allreduce, replicas, send_in, send_out) -> float:
    """A flat stage's own time per minibatch: compute plus all-reduce, or its transfers in or
    out, whichever is slowest, divided among its replicas."""
    return max((compute + allreduce) / replicas, send_in / replicas, send_out / replicas)


def stage_memory_bytes(params, activations, in_flight) -> float:
    """A flat stage's memory per worker: its weights and one stash of activations per
    minibatch in flight."""
    return params + in_flight * activations
