"""Point-in-polygon classification in numpy (crossing number, exact orientation).

For each (point, geometry) pair every edge of every ring of the geometry is
considered: the point is on the boundary when it is collinear with an edge and
inside its bbox; otherwise the parity of the edges crossing the ray to +x
decides interior. Parity over all rings of a valid (multi)polygon is correct,
holes and parts included. This matches GEOS's RayCrossingCounter, and
join.cu's ``refine`` does the same arithmetic per pair.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.kernel.robust import orient2d

CHUNK_EDGE_TESTS = 1 << 22   # bounds temporary memory on big inputs


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
    """(parity bool, on_boundary bool, exact_orientations) per (pt, geom) pair.

    Every pair is expanded to its geometry's edges in chunks; only the edges whose y-range holds the point go
    further. Gathers use ``np.take`` with int32 indices where they fit, and the expansion carries each pair's
    y, not its point index (one gather fewer): at 100k x 10k this took 19 against 30 ms.
    """
    n = len(pt)
    parity = np.zeros(n, dtype=bool)
    boundary = np.zeros(n, dtype=bool)
    exact = 0
    e0 = np.take(edges.geom_offsets, geom)
    lens = np.take(edges.geom_offsets, geom + 1) - e0
    cum = np.cumsum(lens)
    px_all, py_all = np.ascontiguousarray(points[:, 0]), np.ascontiguousarray(points[:, 1])
    idx = np.int32 if max(len(edges.ax), n) < 2**31 else np.int64
    start = 0
    while start < n:
        base = cum[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(cum, base + CHUNK_EDGE_TESTS, side="right")))
        ln = lens[start:stop]
        local_end = cum[start:stop] - base
        # Edge k of the chunk's expansion: its pair's first edge plus its place in the pair's run.
        k = np.arange(local_end[-1], dtype=idx) + np.repeat((e0[start:stop] - (local_end - ln)).astype(idx), ln)
        py = np.repeat(np.take(py_all, pt[start:stop]), ln)
        # Only edges whose y-range holds py can cross the ray or carry the point.
        near = np.flatnonzero((np.take(edges.ylo, k) <= py) & (py <= np.take(edges.yhi, k)))
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
        owner = rep[need]
        parity |= np.bincount(owner[cross], minlength=n) % 2 == 1   # a pair never spans two chunks
        boundary |= np.bincount(owner[on_edge], minlength=n) > 0
        start = stop
    return parity, boundary, exact
