"""Robust 2-D orientation in numpy: an error-bounded fast test, exact fallback.

``orient2d(a, b, c)`` is positive when a, b, c turn counter-clockwise, negative
clockwise, zero when collinear -- the sign is exact for every fp64 input in the
supported range (geometry.COORD_RANGE: each coordinate 0 or of magnitude between
1e-100 and 1e100, where no product of coordinate differences overflows and every
two_product's error term is a double, so the expansions below are exact). The tests
of a point at a parameter t on a segment are exact under a further condition on t
(the caveat below).

Fast path: Shewchuk's filter. ``det`` computed in fp64 has the right sign when
|det| >= (3 + 16 eps) eps (|detleft| + |detright|), or when detleft and detright
do not have the same sign (then det is exact in sign; the signs are compared, not
multiplied: their product underflows to zero near 1e-80). Otherwise the
determinant is summed exactly as an expansion (two_diff / two_product /
grow_expansion) and the sign of its largest component is the answer.
common.cuh implements the same arithmetic on the GPU (with fma for two_product),
so both devices agree bit for bit with each other and, on real inputs, with GEOS.

``orient2d_values`` gives the determinant's value to about one ulp (a
double-double evaluation, or the exact expansion's sum where even that cancels):
the overlay's split parameters are ratios of these (segments.py).
``segment_orient_exact`` and ``segment_coord_exact`` decide exactly on which side
of a line, or of a coordinate, the point ``e0 + t (e1 - e0)`` lies, for a double t:
pip.classify_segment_points runs them where its filter cannot tell.

Caveat: the range bounds the coordinates, not t. Those two multiply t into terms made
of coordinates (differences, products of differences, and the rounding errors of both),
and a product's error term is itself a double only while the product is 0 or at least
2^-969 (about 2e-292) in magnitude. In COORD_RANGE every coordinate is a multiple of
2^-385, so every such term is 0 or at least 2^-770 (about 1.7e-232): their signs are
exact for t = 0 and for |t| >= 2^-199 (about 1.2e-60). A smaller t can underflow a
product, and the sign is then not guaranteed. Nothing bounds the overlay's split
parameters that way: a crossing 1e-60 of its edge's length from the edge's start, and
the piece's middle before it, have such a t.
"""
from __future__ import annotations

import math

import numpy as np

EPS = 2.0 ** -53
CCW_ERRBOUND_A = (3.0 + 16.0 * EPS) * EPS
# fp64 operations of one orientation test's fast filter: the determinant (5 add/sub, 2 mul) and its error bound
# (1 add, 1 mul); the cost models' FLOPs a test. ncu counts exactly this (6 DADD, 3 DMUL a test) in join's refine.
ORIENT_FILTER_FLOPS = 9
# orient2d_values trusts its double-double value where |det| >= this share of |detleft| + |detright| (its error is
# then below 1.1 ulp of the value); below it, the exact expansion is summed. overlay_exact.cu's ORIENT_DD_BOUND.
ORIENT_DD_BOUND = 2.0 ** -40
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


def _grow(terms):
    """The nonoverlapping expansion of sum(terms), components by increasing magnitude (zeros kept), as
    common.cuh's orient2d_exact grows it."""
    expansion = [terms[0]]
    for b in terms[1:]:
        q, grown = b, []
        for e in expansion:
            q, h = _two_sum(q, e)
            grown.append(h)
        grown.append(q)
        expansion = grown
    return expansion


def _expansion_sign(terms):
    """Exact sign of sum(terms): grow a nonoverlapping expansion one term at a time."""
    # Components grow in magnitude (zeros allowed): the top nonzero one decides.
    sign = np.zeros(np.shape(terms[0]), dtype=np.int8)
    for comp in reversed(_grow(terms)):
        sign = np.where(sign == 0, np.sign(comp).astype(np.int8), sign)
    return sign


def _orient_terms(ax, ay, bx, by, cx, cy):
    """16 doubles whose exact sum is (a - c) x (b - c)."""
    acx, acx_t = _two_diff(ax, cx)
    bcy, bcy_t = _two_diff(by, cy)
    acy, acy_t = _two_diff(ay, cy)
    bcx, bcx_t = _two_diff(bx, cx)
    terms = []
    for u, v, s in ((acx, bcy, 1.0), (acx, bcy_t, 1.0), (acx_t, bcy, 1.0), (acx_t, bcy_t, 1.0),
                    (acy, bcx, -1.0), (acy, bcx_t, -1.0), (acy_t, bcx, -1.0), (acy_t, bcx_t, -1.0)):
        p, e = _two_product(u, v)
        terms += [s * p, s * e]
    return terms


def orient2d_exact(ax, ay, bx, by, cx, cy) -> np.ndarray:
    """Exact sign of (a - c) x (b - c), vectorised; the slow path."""
    return _expansion_sign(_orient_terms(ax, ay, bx, by, cx, cy))


def orient2d_exact_value(ax, ay, bx, by, cx, cy) -> np.ndarray:
    """(a - c) x (b - c) to about one ulp: its exact expansion summed from the smallest component up (the sign is
    exact). The same operations as overlay_exact.cu's orient2d_exact_value, so the same bits."""
    value = np.zeros(np.shape(ax))
    for comp in _grow(_orient_terms(ax, ay, bx, by, cx, cy)):
        value = value + comp
    return value


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
    # Opposite (or zero) signs of detleft/detright make det exact already. Signs compared, as Shewchuk does: the
    # product of the two underflows to zero at coordinates near 1e-80 and would skip the exact path there.
    same = ((detleft > 0) & (detright > 0)) | ((detleft < 0) & (detright < 0))
    unsure = (np.abs(det) < errbound) & same
    if unsure.any():
        idx = np.flatnonzero(unsure)
        sign[idx] = orient2d_exact(ax[idx], ay[idx], bx[idx], by[idx], cx[idx], cy[idx])
    return sign, unsure


def orient2d_values(ax, ay, bx, by, cx, cy) -> np.ndarray:
    """(a - c) x (b - c) to about one ulp, vectorised (overlay_exact.cu's orient2d_value, bit for bit).

    Double-double: both products exactly (two_product), their difference exactly (two_diff), plus the first-order
    terms of the coordinate differences' rounding errors. Its error is below 16 eps^2 (|detleft| + |detright|)
    plus half an ulp, so where |det| >= ORIENT_DD_BOUND (|detleft| + |detright|) it is within 1.1 ulp; elsewhere
    (nearly collinear points) the exact expansion is summed (orient2d_exact_value)."""
    acx, acx_t = _two_diff(ax, cx)
    bcy, bcy_t = _two_diff(by, cy)
    acy, acy_t = _two_diff(ay, cy)
    bcx, bcx_t = _two_diff(bx, cx)
    p1, e1 = _two_product(acx, bcy)
    p2, e2 = _two_product(acy, bcx)
    s, se = _two_diff(p1, p2)
    tails = (acx * bcy_t + bcy * acx_t) - (acy * bcx_t + bcx * acy_t)
    value = s + ((se + (e1 - e2)) + tails)
    unsure = np.abs(s) < ORIENT_DD_BOUND * (np.abs(p1) + np.abs(p2))
    if unsure.any():
        i = np.flatnonzero(unsure)
        value[i] = orient2d_exact_value(ax[i], ay[i], bx[i], by[i], cx[i], cy[i])
    return value


def _fsum_signs(terms) -> np.ndarray:
    """Exact sign of each row's sum (terms: a list of equal-length arrays): math.fsum rounds the exact sum
    correctly, so its sign is the exact sign (few rows come here: those a filter could not decide)."""
    rows = np.stack(terms, axis=1).tolist()
    return np.array([(s > 0) - (s < 0) for s in map(math.fsum, rows)], dtype=np.int8).reshape(-1)


def segment_coord_exact(v, c0, c1, t) -> np.ndarray:
    """Exact sign of v - (c0 + t (c1 - c0)): where a coordinate v lies against the point at t on a segment. Exact
    while t * (c1 - c0) and t times its rounding error do not underflow (each 0 or at least 2^-969 in magnitude:
    see the module's caveat on small t)."""
    s, s_t = _two_diff(v, c0)
    d, d_t = _two_diff(c1, c0)
    p, p_t = _two_product(t, d)
    q, q_t = _two_product(t, d_t)
    return _fsum_signs([s, s_t, -p, -p_t, -q, -q_t])


def segment_orient_exact(ax, ay, bx, by, x0, y0, x1, y1, t) -> np.ndarray:
    """Exact sign of orient2d(a, b, P) for P = e0 + t (e1 - e0): orientation is affine in P, so it is
    orient2d(a, b, e0) + t ((b - a) x (e1 - e0)), 48 doubles summed exactly -- while no product of t with one of
    the cross product's 16 terms underflows (each 0 or at least 2^-969 in magnitude: see the module's caveat on
    small t)."""
    terms = _orient_terms(ax, ay, bx, by, x0, y0)
    bax, bax_t = _two_diff(bx, ax)
    bay, bay_t = _two_diff(by, ay)
    dex, dex_t = _two_diff(x1, x0)
    dey, dey_t = _two_diff(y1, y0)
    for u, v, s in ((bax, dey, 1.0), (bax, dey_t, 1.0), (bax_t, dey, 1.0), (bax_t, dey_t, 1.0),
                    (bay, dex, -1.0), (bay, dex_t, -1.0), (bay_t, dex, -1.0), (bay_t, dex_t, -1.0)):
        p, e = _two_product(u, v)
        for k in (p, e):
            tp, te = _two_product(t, s * k)
            terms += [tp, te]
    return _fsum_signs(terms)
