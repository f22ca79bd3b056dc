"""Stable multi-key orders for the numpy paths, built from numpy's radix sort.

numpy's stable argsort is a radix sort (linear time) only for keys of 16 bits or fewer; for wider keys it is
a merge sort, and ``np.lexsort`` runs one merge sort a key. ``lex_order`` sorts each key 16 bits at a time,
least significant digit first, with the radix sort (an LSD radix sort), and skips digits that do not vary.
On overlay v2's sweep at 30k x 30k: 63 against 105 ms for 800k (pair, y, side) rows, 18 against 48 ms for
400k (pair, y) rows.
"""
from __future__ import annotations

import numpy as np

_SIGN = np.uint64(1 << 63)


def lex_order(*keys) -> np.ndarray:
    """The stable order of ``np.lexsort(keys)``: the last key is the primary one. Keys are 1-D arrays of one
    length, each of integers, booleans or floats (no NaN; -0.0 sorts equal to 0.0)."""
    order = None
    for key in keys:
        for digit in _digits(np.asarray(key)):
            if order is not None:
                digit = np.take(digit, order)
            if len(digit) and digit.min() == digit.max():
                continue                          # a constant digit leaves the order as it is
            step = np.argsort(digit, kind="stable")
            order = step if order is None else np.take(order, step)
    if order is None:
        n = len(np.asarray(keys[0])) if keys else 0
        order = np.arange(n)
    return order


def _digits(key: np.ndarray) -> list[np.ndarray]:
    """The key as uint16 digits, least significant first, whose lexicographic order is the key's order."""
    if key.dtype == np.bool_:
        return [key.astype(np.uint16)]
    if key.dtype.kind == "f":
        bits = (key.astype(np.float64) + 0.0).view(np.uint64)        # + 0.0 turns -0.0 into 0.0
        bits = np.where(bits & _SIGN, ~bits, bits | _SIGN)           # negative floats reversed, below positives
        width = 64
    elif key.dtype.kind in "iu":
        # Signed keys shifted by their minimum: non-negative, and no wider than their range needs.
        bits = (key.astype(np.int64) - int(key.min())).astype(np.uint64) if key.dtype.kind == "i" and len(key) \
            else key.astype(np.uint64)
        width = max(int(bits.max()).bit_length(), 1) if len(key) else 1
    else:
        raise TypeError(f"lex_order: keys of dtype {key.dtype} are not supported")
    return [((bits >> np.uint64(s)) & np.uint64(0xFFFF)).astype(np.uint16) for s in range(0, width, 16)]
