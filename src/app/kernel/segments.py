"""Segment pairs in numpy: exact disjoint/proper/touch/collinear-overlap classification
and the split points each pair puts on its two segments (overlay_area.cu's ``refine_pairs`` mirrors it).

For e = e0->e1 (layer A) and f = f0->f1 (layer B) the four orientations
o1 = orient(e0, e1, f0), o2 = orient(e0, e1, f1), o3 = orient(f0, f1, e0),
o4 = orient(f0, f1, e1) are exact. A point's parameter along a segment is taken
on the segment's dominant axis, so parameters of the segment's own endpoints
are exactly 0 and 1, and a collinear overlap is decided by exact coordinate
comparisons.

A proper crossing's parameters are ratios of those orientations: orient(f0, f1, .)
is affine along e, zero at the crossing, so t_e = O3 / (O3 - O4) and likewise
t_f = O1 / (O1 - O2), with O3 and O4 (O1 and O2) of opposite signs, so the
denominator has no cancellation. Each orientation's value is taken to about an
ulp (robust.orient2d_values: double-double, the exact expansion where that
cancels), so t is within a few ulps of the exact crossing even where the two
segments are nearly collinear, where the textbook (w x d_f) / (d_e x d_f)
loses every digit (and can divide by a zero it rounded to). Both segments' points
at their t are then the same point to a few ulps: the pieces either side of a
crossing meet.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.kernel.robust import orient2d_flags, orient2d_values

DISJOINT, PROPER, TOUCH, OVERLAP = 0, 1, 2, 3
KINDS = {DISJOINT: "disjoint", PROPER: "proper", TOUCH: "touch", OVERLAP: "collinear_overlap"}


@dataclass
class PairSplits:
    kind: np.ndarray        # int8 per pair
    ambiguous: np.ndarray   # bool per pair: some orientation needed the exact path
    e_t: np.ndarray         # (n, 2) split parameters on e, NaN where none
    f_t: np.ndarray         # (n, 2) split parameters on f, NaN where none
    e_ov: np.ndarray        # (n, 2) overlap interval on e (lo, hi), NaN unless OVERLAP
    f_ov: np.ndarray        # (n, 2) overlap interval on f
    same_dir: np.ndarray    # bool: e and f run the same way (only meaningful for OVERLAP)


def _param(px, py, x0, y0, x1, y1):
    """Parameter of a point on the line x0->x1 along that segment's dominant axis."""
    use_x = np.abs(x1 - x0) >= np.abs(y1 - y0)
    return np.where(use_x, (px - x0) / np.where(use_x, x1 - x0, 1.0),
                    (py - y0) / np.where(use_x, 1.0, y1 - y0))


def _inside_split(t):
    """Keep split parameters strictly inside (0, 1); endpoints split nothing."""
    return np.where((t > 0.0) & (t < 1.0), t, np.nan)


def classify_pairs(e0x, e0y, e1x, e1y, f0x, f0y, f1x, f1y, marks: bool = False) -> PairSplits:
    """With ``marks`` (every overlay version: a ring with no record is judged by one vertex, and v3 carries
    inside/outside status along each ring, so no point where the other boundary meets a ring may be lost), every
    contact leaves a record on both segments: a proper crossing keeps its parameter even where it rounds to 0 or
    1, an endpoint of one segment on the other keeps its parameter on the other even where it is or rounds to 0
    or 1, and a touch at a segment's own end, which splits nothing, is recorded as a mark at t = 0 or 1 on that
    segment (when neither endpoint of the other segment is on it). Without ``marks`` only parameters strictly
    inside (0, 1) are recorded."""
    n = len(e0x)
    o1, a1 = orient2d_flags(e0x, e0y, e1x, e1y, f0x, f0y)
    o2, a2 = orient2d_flags(e0x, e0y, e1x, e1y, f1x, f1y)
    o3, a3 = orient2d_flags(f0x, f0y, f1x, f1y, e0x, e0y)
    o4, a4 = orient2d_flags(f0x, f0y, f1x, f1y, e1x, e1y)
    kind = np.zeros(n, dtype=np.int8)
    e_t = np.full((n, 2), np.nan)
    f_t = np.full((n, 2), np.nan)
    e_ov = np.full((n, 2), np.nan)
    f_ov = np.full((n, 2), np.nan)

    # Collinear: compare extents on e's dominant axis, exactly.
    col = (o1 == 0) & (o2 == 0)
    use_x = np.abs(e1x - e0x) >= np.abs(e1y - e0y)
    ce0, ce1 = np.where(use_x, e0x, e0y), np.where(use_x, e1x, e1y)
    cf0, cf1 = np.where(use_x, f0x, f0y), np.where(use_x, f1x, f1y)
    lo = np.maximum(np.minimum(ce0, ce1), np.minimum(cf0, cf1))
    hi = np.minimum(np.maximum(ce0, ce1), np.maximum(cf0, cf1))
    overlap = col & (lo < hi)
    single = col & (lo == hi)           # end-to-end contact in one point: a touch
    same = (ce1 - ce0) * (cf1 - cf0) > 0
    if overlap.any():
        i = np.flatnonzero(overlap)
        kind[i] = OVERLAP
        # The interval's ends are endpoints of e or f; map them to each segment's parameter.
        lo_pt = _interval_point(lo[i], use_x[i], e0x[i], e0y[i], e1x[i], e1y[i], f0x[i], f0y[i], f1x[i], f1y[i])
        hi_pt = _interval_point(hi[i], use_x[i], e0x[i], e0y[i], e1x[i], e1y[i], f0x[i], f0y[i], f1x[i], f1y[i])
        te = np.stack([_param(*lo_pt, e0x[i], e0y[i], e1x[i], e1y[i]),
                       _param(*hi_pt, e0x[i], e0y[i], e1x[i], e1y[i])], axis=1)
        tf = np.stack([_param(*lo_pt, f0x[i], f0y[i], f1x[i], f1y[i]),
                       _param(*hi_pt, f0x[i], f0y[i], f1x[i], f1y[i])], axis=1)
        e_ov[i] = np.sort(te, axis=1)
        f_ov[i] = np.sort(tf, axis=1)
        e_t[i] = _inside_split(e_ov[i])
        f_t[i] = _inside_split(f_ov[i])

    # Proper crossing: strictly opposite sides both ways.
    proper = ~col & (o1 * o2 < 0) & (o3 * o4 < 0)
    if proper.any():
        i = np.flatnonzero(proper)
        kind[i] = PROPER
        v1 = orient2d_values(e0x[i], e0y[i], e1x[i], e1y[i], f0x[i], f0y[i])
        v2 = orient2d_values(e0x[i], e0y[i], e1x[i], e1y[i], f1x[i], f1y[i])
        v3 = orient2d_values(f0x[i], f0y[i], f1x[i], f1y[i], e0x[i], e0y[i])
        v4 = orient2d_values(f0x[i], f0y[i], f1x[i], f1y[i], e1x[i], e1y[i])
        ue = np.clip(v3 / (v3 - v4), 0.0, 1.0)
        uf = np.clip(v1 / (v1 - v2), 0.0, 1.0)
        e_t[i, 0] = ue if marks else _inside_split(ue)
        f_t[i, 0] = uf if marks else _inside_split(uf)

    # Touch: an endpoint of one segment lies on the other (collinear single point included).
    touch_cand = (~col | single) & ~proper
    if touch_cand.any():
        i = np.flatnonzero(touch_cand)
        hit = np.zeros(len(i), dtype=bool)
        on_end = []                     # f0 on e, f1 on e, e0 on f, e1 on f
        for slot, (o, px, py, on, (x0, y0, x1, y1), out) in enumerate((
                (o1, f0x, f0y, "e", (e0x, e0y, e1x, e1y), e_t),
                (o2, f1x, f1y, "e", (e0x, e0y, e1x, e1y), e_t),
                (o3, e0x, e0y, "f", (f0x, f0y, f1x, f1y), f_t),
                (o4, e1x, e1y, "f", (f0x, f0y, f1x, f1y), f_t))):
            on_seg = (o[i] == 0) & _in_box(px[i], py[i], x0[i], y0[i], x1[i], y1[i])
            on_end.append(on_seg)
            hit |= on_seg
            t = _param(px[i], py[i], x0[i], y0[i], x1[i], y1[i])
            # With marks the parameter is kept even where it is (or rounds to) 0 or 1, as refine_pairs' end_param:
            # (0.5, 1 - 2^-53), strictly inside the segment from (0.5, -1) to (0.5, 1), is at (2 - 2^-53) / 2,
            # which rounds to 1, and dropping it left the segment with no record of the contact.
            t = np.clip(t, 0.0, 1.0) if marks else _inside_split(t)
            col_idx = slot % 2
            out[i, col_idx] = np.where(on_seg, t, out[i, col_idx])
        kind[i[hit]] = TOUCH
        if marks:       # as refine_pairs: a segment's own end on the other, when neither of the other's ends is on it
            for out, first, second in ((e_t, on_end[2], on_end[3]), (f_t, on_end[0], on_end[1])):
                bare = hit & np.isnan(out[i, 0]) & np.isnan(out[i, 1])
                out[i[bare & first], 0] = 0.0
                out[i[bare & ~first & second], 0] = 1.0
    ambiguous = a1 | a2 | a3 | a4
    return PairSplits(kind, ambiguous, e_t, f_t, e_ov, f_ov, same)


def _in_box(px, py, x0, y0, x1, y1):
    return ((np.minimum(x0, x1) <= px) & (px <= np.maximum(x0, x1))
            & (np.minimum(y0, y1) <= py) & (py <= np.maximum(y0, y1)))


def _interval_point(c, use_x, e0x, e0y, e1x, e1y, f0x, f0y, f1x, f1y):
    """The endpoint (of e or f) whose dominant coordinate is c: an exact input vertex."""
    cand_x = np.stack([e0x, e1x, f0x, f1x], axis=1)
    cand_y = np.stack([e0y, e1y, f0y, f1y], axis=1)
    coord = np.where(use_x[:, None], cand_x, cand_y)
    k = np.argmax(coord == c[:, None], axis=1)
    rows = np.arange(len(c))
    return cand_x[rows, k], cand_y[rows, k]
