"""Point-in-polygon classification in numpy (crossing number, exact orientation).

For each (point, geometry) pair every edge of every ring of the geometry is
considered: the point is on the boundary when it is collinear with an edge and
inside its bbox; otherwise the parity of the edges crossing the ray to +x
decides interior. Parity over all rings of a valid (multi)polygon is correct,
holes and parts included. This matches GEOS's RayCrossingCounter, and
join.cu's ``refine`` does the same arithmetic per pair.

``classify_segment_points`` does the same for points given as ``e0 + t (e1 - e0)``
on segments between input vertices (the overlay's pieces), exactly for that point,
not for its rounding: where a piece runs within rounding distance of the other
boundary, the rounded point can lie on the wrong side of it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.kernel.robust import (CCW_ERRBOUND_A, _two_diff, _two_product, _two_sum, orient2d, segment_coord_exact,
                               segment_orient_exact)

# (pair, edge) entries a chunk: each pass over a chunk's arrays (1 MiB of doubles) then runs in a core's cache. The
# 4M of the first version spilled every pass to memory: 2x slower on the overlay's pieces and join at 1M x 100k.
CHUNK_EDGE_TESTS = 1 << 17


@dataclass(frozen=True)
class Edges:
    ax: np.ndarray
    ay: np.ndarray
    bx: np.ndarray
    by: np.ndarray
    ylo: np.ndarray
    yhi: np.ndarray
    geom_offsets: np.ndarray   # (G + 1,) a geometry's edges are contiguous


def edge_table(coords, ring_offsets, geom_ring_offsets) -> Edges:
    valid = np.ones(len(coords), dtype=bool)
    valid[ring_offsets[1:] - 1] = False          # a ring's last vertex starts no edge
    k = np.flatnonzero(valid)
    a, b = coords[k], coords[k + 1]
    edges_per_ring = np.diff(ring_offsets) - 1
    per_geom = np.add.reduceat(edges_per_ring, geom_ring_offsets[:-1]) if len(edges_per_ring) else \
        np.zeros(len(geom_ring_offsets) - 1, dtype=np.int64)
    return Edges(a[:, 0].copy(), a[:, 1].copy(), b[:, 0].copy(), b[:, 1].copy(),
                 np.minimum(a[:, 1], b[:, 1]), np.maximum(a[:, 1], b[:, 1]),
                 np.concatenate([[0], np.cumsum(per_geom)]))


def classify(points, edges: Edges, pt, geom):
    """(parity bool, on_boundary bool) per (pt, geom) pair, and the counts of exact orientations and of
    orientation tests (the edges whose y-range holds the point: the edges join.cu's refine tests).

    Every pair is expanded to its geometry's edges in chunks; only the edges whose y-range holds the point go
    further. Gathers use ``np.take`` with int32 indices where they fit, and the expansion carries each pair's
    y, not its point index (one gather fewer): at 100k x 10k this took 19 against 30 ms.
    """
    n = len(pt)
    parity = np.zeros(n, dtype=bool)
    boundary = np.zeros(n, dtype=bool)
    exact = tests = 0
    px_all, py_all = np.ascontiguousarray(points[:, 0]), np.ascontiguousarray(points[:, 1])
    idx = np.int32 if max(len(edges.ax), n) < 2**31 else np.int64
    for start, stop, ln, k in _edge_chunks(edges, geom, idx):
        py = np.repeat(np.take(py_all, pt[start:stop]), ln)
        # Only edges whose y-range holds py can cross the ray or carry the point.
        near = np.flatnonzero((np.take(edges.ylo, k) <= py) & (py <= np.take(edges.yhi, k)))
        tests += len(near)
        k, py = np.take(k, near), np.take(py, near)
        rep = np.take(np.repeat(np.arange(start, stop, dtype=idx), ln), near)
        px = np.take(px_all, np.take(pt, rep))
        ax, ay, bx, by = (np.take(a, k) for a in (edges.ax, edges.ay, edges.bx, edges.by))
        above_b = by > py
        straddle = (ay > py) != above_b
        in_box = (np.minimum(ax, bx) <= px) & (px <= np.maximum(ax, bx))
        need = np.flatnonzero(straddle | in_box)
        o, n_exact = orient2d(ax[need], ay[need], bx[need], by[need], px[need], py[need])
        exact += n_exact
        on_edge = (o == 0) & in_box[need]
        # Upward edge (b above): the crossing lies right of p iff p is left of a->b.
        cross = straddle[need] & np.where(above_b[need], o > 0, o < 0)
        owner = rep[need] - start                                # a pair never spans two chunks
        parity[start:stop] = np.bincount(owner[cross], minlength=stop - start) % 2 == 1
        boundary[start:stop] = np.bincount(owner[on_edge], minlength=stop - start) > 0
    return parity, boundary, exact, tests


def _edge_chunks(edges: Edges, geom, idx=np.int64):
    """(start, stop, ln, k) per chunk of the pairs: pairs start..stop-1, each expanded to its geometry's ``ln``
    edges, k the edges' indices (about CHUNK_EDGE_TESTS of them a chunk; a pair never spans two chunks)."""
    e0 = np.take(edges.geom_offsets, geom)
    lens = np.take(edges.geom_offsets, geom + 1) - e0
    cum = np.cumsum(lens)
    start, n = 0, len(geom)
    while start < n:
        base = cum[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(cum, base + CHUNK_EDGE_TESTS, side="right")))
        ln = lens[start:stop]
        local_end = cum[start:stop] - base
        # Edge k of the chunk's expansion: its pair's first edge plus its place in the pair's run.
        yield start, stop, ln, (np.arange(local_end[-1], dtype=idx)
                                + np.repeat((e0[start:stop] - (local_end - ln)).astype(idx), ln))
        start = stop


def _segment_coord(c0, c1, t):
    """(m, d) for one coordinate: overlay_exact.cu's segment_coord, bit for bit."""
    dc, dce = _two_diff(c1, c0)
    p, pe = _two_product(t, dc)
    m, me = _two_sum(c0, p)
    exact = (dce == 0.0) & (pe == 0.0) & (me == 0.0) & np.where(p == 0.0, (t == 0.0) | (dc == 0.0),
                                                                np.abs(p) >= 2.0 ** -900)
    d = ((np.abs(me) + np.abs(pe)) + np.abs(t * dce)) * (1.0 + 2.0 ** -48) + 2.0 ** -1070
    return m, np.where(exact, 0.0, d)


def segment_points(x0, y0, x1, y1, t):
    """(mx, my, dx, dy): the point at t on each segment x0,y0 -> x1,y1 rounded as the kernels round it, and bounds
    on its distance from the exact point e0 + t (e1 - e0) in x and in y: 0 where the rounded point is the exact one,
    else the three roundings' errors (error-free transforms) with 2^-48 to spare and a subnormal's share.
    overlay_exact.cu's segment_point computes the same bits."""
    mx, dx = _segment_coord(x0, x1, t)
    my, dy = _segment_coord(y0, y1, t)
    return mx, my, dx, dy


def _side(v, lo, hi, d, rep, seg, axis):
    """Sign of v - P for the exact coordinate P (``axis`` 0: x, 1: y) of entry rep's point, given lo = m - d and
    hi = m + d: decided exactly (robust.segment_coord_exact) where v lies within them and d > 0 (a double above
    fl(m + d) is above m + d: rounding to nearest keeps m + d below the next double)."""
    s = np.where(v > hi, 1, np.where(v < lo, -1, 0)).astype(np.int8)
    near = np.flatnonzero(s == 0)
    near = near[np.take(d, rep[near]) != 0.0]
    if len(near):
        r = rep[near]
        s[near] = segment_coord_exact(v[near], seg[axis][r], seg[2 + axis][r], seg[4][r])
    return s


def classify_segment_points(x0, y0, x1, y1, t, edges: Edges, geom, rounded=None):
    """(parity bool, on_boundary bool, exact tests) of the points P = e0 + t (e1 - e0), one per entry, each
    against its geometry ``geom`` (as ``classify``), exactly for P. The rounded point m and its bounds decide
    where they can: a vertex's height against P where it lies farther than the bound from m, an orientation
    where Shewchuk's error bound for m plus |b - a| times the bound leaves its sign; the rest are decided
    exactly from the input doubles (robust.segment_coord_exact, segment_orient_exact). overlay_exact.cu's
    classify_segment_point does the same on the GPU. ``rounded``: segment_points' answer, where the caller has it."""
    n = len(t)
    parity = np.zeros(n, dtype=bool)
    boundary = np.zeros(n, dtype=bool)
    exact = 0
    seg = (x0, y0, x1, y1, t)
    mx_all, my_all, dx_all, dy_all = segment_points(x0, y0, x1, y1, t) if rounded is None else rounded
    lo_all, hi_all = my_all - dy_all, my_all + dy_all
    xl_all, xh_all = mx_all - dx_all, mx_all + dx_all
    for start, stop, ln, k in _edge_chunks(edges, geom):
        lo, hi = np.repeat(lo_all[start:stop], ln), np.repeat(hi_all[start:stop], ln)
        # Only edges whose y-range meets [my - dy, my + dy] can cross the ray from P or carry P.
        near = np.flatnonzero((np.take(edges.ylo, k) <= hi) & (lo <= np.take(edges.yhi, k)))
        k, lo, hi = np.take(k, near), np.take(lo, near), np.take(hi, near)
        rep = np.take(np.repeat(np.arange(start, stop), ln), near)
        ax, ay, bx, by = (np.take(a, k) for a in (edges.ax, edges.ay, edges.bx, edges.by))
        sa = _side(ay, lo, hi, dy_all, rep, seg, 1)
        sb = _side(by, lo, hi, dy_all, rep, seg, 1)
        above_b = sb > 0
        straddle = (sa > 0) != above_b
        x_near = (np.minimum(ax, bx) <= np.take(xh_all, rep)) & (np.take(xl_all, rep) <= np.maximum(ax, bx))
        need = np.flatnonzero(straddle | x_near)
        r = rep[need]
        o, n_exact = _segment_orient(ax[need], ay[need], bx[need], by[need], *(np.take(c, r) for c in (
            mx_all, my_all, dx_all, dy_all)), r, seg)
        exact += n_exact
        # On the boundary: on the edge's line and within its box (exact comparisons of P with both ends).
        on = np.flatnonzero(o == 0)
        on_edge = np.zeros(len(need), dtype=bool)
        if len(on):
            j, rj = need[on], r[on]
            xl, xh = np.take(xl_all, rj), np.take(xh_all, rj)
            sxa = _side(ax[j], xl, xh, dx_all, rj, seg, 0)
            sxb = _side(bx[j], xl, xh, dx_all, rj, seg, 0)
            on_edge[on] = (sxa * sxb <= 0) & (sa[j] * sb[j] <= 0)
        # Upward edge (b above): the crossing lies right of P iff P is left of a->b.
        cross = straddle[need] & np.where(above_b[need], o > 0, o < 0)
        owner = r - start
        parity[start:stop] ^= np.bincount(owner[cross], minlength=stop - start) % 2 == 1
        boundary[start:stop] |= np.bincount(owner[on_edge], minlength=stop - start) > 0
    return parity, boundary, exact


def _segment_orient(ax, ay, bx, by, mx, my, dx, dy, rep, seg):
    """(sign of orient2d(a, b, P), entries decided exactly) for P within (dx, dy) of m: Shewchuk's bound for
    orient2d(a, b, m) plus |(b - a) x (P - m)| <= |bx - ax| dy + |by - ay| dx (dx, dy carry 2^-48 to spare, which
    covers the rounding of this bound too); rep: each entry's point in ``seg`` (x0, y0, x1, y1, t)."""
    detleft = (ax - mx) * (by - my)
    detright = (ay - my) * (bx - mx)
    det = detleft - detright
    err = CCW_ERRBOUND_A * (np.abs(detleft) + np.abs(detright)) + (np.abs(bx - ax) * dy + np.abs(by - ay) * dx)
    sign = np.sign(det).astype(np.int8)
    unsure = np.flatnonzero(np.abs(det) <= err)
    if len(unsure):
        i, r = unsure, rep[unsure]
        sign[i] = segment_orient_exact(ax[i], ay[i], bx[i], by[i], *(c[r] for c in seg))
    return sign, len(unsure)
