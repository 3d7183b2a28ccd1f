"""Last-stage costs of (k, j) pairs of the state DAG: the stage k+1..j on each replica count.

The reference's arithmetic (``dp.last_stage_costs`` for one end state) laid out for many pairs
at once, each per-pair quantity read once (``PairSums``) for the costs and the memory check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainer.plan.blocks import after
from trainer.plan.dp import INF, LevelOptions, Tables


@dataclass
class PairSums:
    """Per (k, j) pair of the state DAG (k precedes j): the sums of the block k+1..j, formed as
    the block tables form them (cum[j] - cum[k]), and the output activations of k and j; each
    read once, for the stage costs and the memory check."""

    params: np.ndarray
    out_k: np.ndarray
    out_j: np.ndarray
    tables: Tables
    pk: np.ndarray
    pj: np.ndarray

    def compute(self) -> np.ndarray:
        """Each block's compute: the level-1 ``values`` of the pair."""
        cum = self.tables.compute
        return cum[self.pj] - cum[self.pk]

    def stash(self) -> np.ndarray:
        """Activations plus parameters of each block (the reference's stash per minibatch)."""
        acts = self.tables.activation
        return (acts[self.pj] - acts[self.pk]) + self.params


def pair_sums(t: Tables, pk: np.ndarray, pj: np.ndarray) -> PairSums:
    cum_p, out = t.parameters, t.output_activation
    return PairSums(cum_p[pj] - cum_p[pk], out[pk], out[pj], t, pk, pj)


def pair_stage_costs(t: Tables, values, opt: LevelOptions, pk: np.ndarray, pj: np.ndarray, reps: np.ndarray,
                     sums: PairSums | None = None):
    """``last_stage_costs`` for (k, j) pairs of the state DAG, (P, R): the same terms in the same order."""
    return pair_stage_costs_t(t, values, opt, pk, pj, reps, sums).T


def pair_stage_costs_t(t: Tables, values, opt: LevelOptions, pk: np.ndarray, pj: np.ndarray,
                       reps: np.ndarray, sums: PairSums | None = None) -> np.ndarray:
    """``pair_stage_costs`` laid out (R, P): NumPy's inner loops then run over the pairs, not
    over a handful of replica counts (the same numbers, several times faster).

    The blocks' parameters are read through ``sums``, the pairs' ``pair_sums``; level-1
    ``values`` are read there too (the same differences)."""
    bw, n = opt.bandwidth, t.size
    reps = reps[:, None]
    if sums is None:
        sums = pair_sums(t, pk, pj)
    v_last = sums.compute() if values is t._level1 else after(values, pk, pj)
    p_last = sums.params
    # (v + (4 (m'-1) p) / (B m')) / m', in place: fresh (R, P) temporaries would page-fault.
    last = np.multiply(4 * (reps - 1), p_last)
    np.divide(last, bw * reps, out=last)
    np.add(v_last, last, out=last)
    np.divide(last, reps, out=last)
    if opt.activation_compression is not None:
        # max(a / d, b / d) = max(a, b) / d for d > 0 (division is monotone, rounding too), so
        # the input and the output transfer share one division; a / 1.0 is a, so no ratio of
        # 1 is divided by.
        sent = 2.0 * sums.out_j
        sent[pj == n - 1] = -INF  # nothing is sent after the last state
        np.maximum(sent, 2.0 * sums.out_k, out=sent)
        t_io = np.divide(sent, bw * reps)
        if opt.activation_compression != 1.0:
            np.divide(t_io, opt.activation_compression, out=t_io)
        np.maximum(last, t_io, out=last)
    return last
