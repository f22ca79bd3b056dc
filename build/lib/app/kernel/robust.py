"""Robust 2-D orientation in numpy: an error-bounded fast test, exact fallback.

``orient2d(a, b, c)`` is positive when a, b, c turn counter-clockwise, negative
clockwise, zero when collinear -- the sign is exact for every fp64 input (no
overflow/underflow assumed: |coordinates| between 1e-140 and 1e140).

Fast path: Shewchuk's filter. ``det`` computed in fp64 has the right sign when
|det| >= (3 + 16 eps) eps (|detleft| + |detright|). Otherwise the determinant is
summed exactly as an expansion (two_diff / two_product / grow_expansion) and the
sign of its largest component is the answer. ``join.cu`` implements the same
arithmetic on the GPU (with fma for two_product), so both devices agree bit for
bit with each other and, on real inputs, with GEOS.
"""
from __future__ import annotations

import numpy as np

EPS = 2.0 ** -53
CCW_ERRBOUND_A = (3.0 + 16.0 * EPS) * EPS
_SPLITTER = 134217729.0  # 2^27 + 1, Veltkamp/Dekker split


def _two_sum(a, b):
    s = a + b
    bv = s - a
    av = s - bv
    return s, (a - av) + (b - bv)


def _two_diff(a, b):
    d = a - b
    bv = a - d
    av = d + bv
    return d, (a - av) + (bv - b)


def _split(a):
    c = _SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


def _two_product(a, b):
    p = a * b
    ahi, alo = _split(a)
    bhi, blo = _split(b)
    err = alo * blo - (((p - ahi * bhi) - alo * bhi) - ahi * blo)
    return p, err


def _expansion_sign(terms):
    """Exact sign of sum(terms): grow a nonoverlapping expansion one term at a time."""
    expansion = [terms[0]]
    for b in terms[1:]:
        q, grown = b, []
        for e in expansion:
            q, h = _two_sum(q, e)
            grown.append(h)
        grown.append(q)
        expansion = grown
    # Components grow in magnitude (zeros allowed): the top nonzero one decides.
    sign = np.zeros(np.shape(terms[0]), dtype=np.int8)
    for comp in reversed(expansion):
        sign = np.where(sign == 0, np.sign(comp).astype(np.int8), sign)
    return sign


def orient2d_exact(ax, ay, bx, by, cx, cy) -> np.ndarray:
    """Exact sign of (a - c) x (b - c), vectorised; the slow path."""
    acx, acx_t = _two_diff(ax, cx)
    bcy, bcy_t = _two_diff(by, cy)
    acy, acy_t = _two_diff(ay, cy)
    bcx, bcx_t = _two_diff(bx, cx)
    terms = []
    for u, v, s in ((acx, bcy, 1.0), (acx, bcy_t, 1.0), (acx_t, bcy, 1.0), (acx_t, bcy_t, 1.0),
                    (acy, bcx, -1.0), (acy, bcx_t, -1.0), (acy_t, bcx, -1.0), (acy_t, bcx_t, -1.0)):
        p, e = _two_product(u, v)
        terms += [s * p, s * e]
    return _expansion_sign(terms)


def orient2d(ax, ay, bx, by, cx, cy):
    """(sign int8 array, number of entries that needed the exact path)."""
    sign, unsure = orient2d_flags(ax, ay, bx, by, cx, cy)
    return sign, int(np.count_nonzero(unsure))


def orient2d_flags(ax, ay, bx, by, cx, cy):
    """(sign int8 array, bool array: which entries needed the exact path)."""
    detleft = (ax - cx) * (by - cy)
    detright = (ay - cy) * (bx - cx)
    det = detleft - detright
    errbound = CCW_ERRBOUND_A * (np.abs(detleft) + np.abs(detright))
    sign = np.sign(det).astype(np.int8)
    # Opposite (or zero) signs of detleft/detright make det exact already.
    unsure = (np.abs(det) < errbound) & (detleft * detright > 0)
    if unsure.any():
        idx = np.flatnonzero(unsure)
        sign[idx] = orient2d_exact(ax[idx], ay[idx], bx[idx], by[idx], cx[idx], cy[idx])
    return sign, unsure
