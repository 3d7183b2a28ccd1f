"""State-DAG pairs from ancestor bitsets: bit k of ``ancestors[j]`` (a Python int) says state k
precedes state j. The DP reads the pairs (k, j) as two index arrays, grouped by j, k ascending.

The bitsets are unpacked to a byte per bit and the set positions picked by a mask: NumPy's
``nonzero`` on the same (n, n) matrix is several times slower.
"""

from __future__ import annotations

import numpy as np


def pairs_of(masks: list[int], rows: list[int] | None = None, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(k, j) for every bit k of ``masks[r]``, with j = ``rows[r]`` (default r), grouped by j
    as ``rows`` is ordered, k ascending; ``width`` bounds the bits (default len(masks))."""
    n = len(masks)
    width = n if width is None else width
    pk = np.broadcast_to(np.arange(width, dtype=np.intp), (n, width))[bit_rows(masks, width).view(bool)]
    counts = np.fromiter(map(int.bit_count, masks), dtype=np.intp, count=n)
    js = np.arange(n, dtype=np.intp) if rows is None else np.asarray(rows, dtype=np.intp)
    return pk, np.repeat(js, counts)


def bit_rows(masks: list[int], width: int) -> np.ndarray:
    """(len(masks), width) uint8: row r holds the bits of ``masks[r]``, 0 or 1."""
    nbytes = (width + 7) // 8
    raw = b"".join([m.to_bytes(nbytes, "little") for m in masks])
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8).reshape(len(masks), nbytes), axis=1, bitorder="little")
    return bits[:, :width]


def chain_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``pairs_of`` for a chain: every k < j."""
    counts = np.arange(n, dtype=np.intp)
    pj = np.repeat(counts, counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(len(pj), dtype=np.intp) - starts, pj


def bits_of(flags: np.ndarray) -> int:
    """The bitset of the True entries of a bool array (bit i for entry i)."""
    return int.from_bytes(np.packbits(flags, bitorder="little").tobytes(), "little")
