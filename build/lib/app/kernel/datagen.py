"""Seeded generators of valid polygon layers and point sets (vectorised numpy).

Shells are star-shaped rings around a centre: vertex angles are jittered around
a regular spacing (so they stay sorted) and radii vary in [0.55 r, r], which
keeps every ring simple. A hole is a smaller star ring inside the largest disk
the shell is guaranteed to contain; a second MultiPolygon part sits 2.2 r away
with radius 0.5 r, so parts never touch. Shells are CCW, holes CW.
"""
from __future__ import annotations

import numpy as np

from app.kernel.geometry import PolygonBuffers

EXTENT = 1000.0  # coordinates live in [0, EXTENT]^2: realistic magnitudes, not unit-square toys


def _star_rings(rng, centers, radius, n_vertices, clockwise=False):
    """(K, n_vertices + 1, 2) closed star-shaped rings and each ring's inscribed radius."""
    k = len(centers)
    jitter = rng.uniform(-0.35, 0.35, size=(k, n_vertices))
    angles = 2.0 * np.pi * (np.arange(n_vertices) + jitter) / n_vertices
    radii = radius[:, None] * rng.uniform(0.55, 1.0, size=(k, n_vertices))
    if clockwise:
        angles, radii = angles[:, ::-1], radii[:, ::-1]
    ring = np.empty((k, n_vertices + 1, 2))
    ring[:, :-1, 0] = centers[:, 0:1] + radii * np.cos(angles)
    ring[:, :-1, 1] = centers[:, 1:2] + radii * np.sin(angles)
    ring[:, -1] = ring[:, 0]
    gaps = np.diff(np.concatenate([angles, angles[:, :1] + 2 * np.pi], axis=1), axis=1)
    max_gap = np.abs(gaps).max(axis=1)
    inscribed = radii.min(axis=1) * np.cos(np.minimum(max_gap / 2, np.pi / 2))
    return ring, inscribed


def make_polygons(n: int, vertices: int, seed: int, *, holes: float = 0.2,
                  multi: float = 0.1, coverage: float = 0.5) -> PolygonBuffers:
    """``n`` polygons with ``vertices`` shell vertices; ``holes``/``multi`` are fractions.

    ``coverage`` is the summed shell disk area over the extent area: 0.5 means a
    uniform point hits about half a polygon on average.
    """
    rng = np.random.default_rng([seed, 0x706F6C79])
    r = EXTENT * np.sqrt(coverage / (max(n, 1) * np.pi))
    centers = rng.uniform(r, EXTENT - r, size=(n, 2))
    radius = r * rng.uniform(0.5, 1.5, size=n)
    shells, inscribed = _star_rings(rng, centers, radius, vertices)

    has_hole = (rng.random(n) < holes) & (inscribed > 0.05 * radius)
    has_part = rng.random(n) < multi
    hv = max(4, vertices // 2)
    hole_rings, _ = _star_rings(rng, centers[has_hole], 0.5 * inscribed[has_hole], hv, clockwise=True)
    theta = rng.uniform(0, 2 * np.pi, size=int(has_part.sum()))
    part_centers = centers[has_part] + 2.2 * radius[has_part, None] * np.c_[np.cos(theta), np.sin(theta)]
    part_rings, _ = _star_rings(rng, part_centers, 0.5 * radius[has_part], vertices)

    # Ring order per geometry: shell, hole (if any), second part (if any).
    rings_per_geom = 1 + has_hole.astype(np.int64) + has_part.astype(np.int64)
    geom_ring_offsets = np.concatenate([[0], np.cumsum(rings_per_geom)])
    shell_ring = geom_ring_offsets[:-1]
    hole_ring = shell_ring[has_hole] + 1
    part_ring = shell_ring[has_part] + 1 + has_hole[has_part]
    ring_len = np.full(geom_ring_offsets[-1], vertices + 1, dtype=np.int64)
    ring_len[hole_ring] = hv + 1
    ring_offsets = np.concatenate([[0], np.cumsum(ring_len)])
    coords = np.empty((ring_offsets[-1], 2))
    for ring_ids, rings in ((shell_ring, shells), (hole_ring, hole_rings), (part_ring, part_rings)):
        idx = ring_offsets[ring_ids][:, None] + np.arange(rings.shape[1])
        coords[idx] = rings
    return PolygonBuffers(coords, ring_offsets.astype(np.int64), geom_ring_offsets.astype(np.int64))


def make_points(n: int, seed: int, *, layout: str = "uniform", polygons: PolygonBuffers | None = None) -> np.ndarray:
    """(n, 2) points: ``uniform`` over the extent or ``clustered`` around polygon vertices."""
    rng = np.random.default_rng([seed, 0x706F696E])
    if layout == "uniform" or polygons is None or polygons.n_coords == 0:
        return rng.uniform(0.0, EXTENT, size=(n, 2))
    # Clustered: Gaussian blobs around random polygon vertices, so many points
    # fall near edges (the refine stage's hard case) and the load is skewed.
    anchors = polygons.coords[rng.integers(0, polygons.n_coords, size=max(1, n // 64))]
    which = rng.integers(0, len(anchors), size=n)
    scale = EXTENT / np.sqrt(max(polygons.n_geoms, 1)) * 0.05
    pts = anchors[which] + rng.normal(0.0, scale, size=(n, 2))
    return np.clip(pts, 0.0, EXTENT)


def shifted(polys: PolygonBuffers, dx: float, dy: float) -> PolygonBuffers:
    return PolygonBuffers(polys.coords + np.array([dx, dy]), polys.ring_offsets.copy(),
                          polys.geom_ring_offsets.copy())


def make_grid_squares(n: int) -> PolygonBuffers:
    """About ``n`` unit-grid squares tiling a k x k block (k = ceil(sqrt(n))), CCW, integer corners."""
    k = max(1, int(np.ceil(np.sqrt(n))))
    ij = np.stack(np.divmod(np.arange(k * k), k), axis=1)[:n].astype(np.float64)
    corners = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]], dtype=np.float64)
    coords = (ij[:, None, :] + corners[None]).reshape(-1, 2)
    ring_offsets = np.arange(n + 1, dtype=np.int64) * 5
    return PolygonBuffers(coords, ring_offsets, np.arange(n + 1, dtype=np.int64))


def make_grid_aligned(n: int, extent: int, seed: int) -> PolygonBuffers:
    """``n`` polygons whose edges run along the unit grid: rectangles and L-shapes with
    integer corners inside [0, extent]^2 -- collinear overlaps and vertices on edges."""
    rng = np.random.default_rng([seed, 0x67726964])
    x0 = rng.integers(0, max(extent - 3, 1), n).astype(np.float64)
    y0 = rng.integers(0, max(extent - 3, 1), n).astype(np.float64)
    w = rng.integers(1, 4, n).astype(np.float64)
    h = rng.integers(1, 4, n).astype(np.float64)
    ell = (rng.random(n) < 0.4) & (w > 1) & (h > 1)
    rings, lens = [], np.where(ell, 7, 5)
    for i in range(n):   # small n in tests and the grid layout: clarity over vectorisation
        a, b, ww, hh = x0[i], y0[i], w[i], h[i]
        if ell[i]:
            rings.append([[a, b], [a + ww, b], [a + ww, b + 1], [a + 1, b + 1], [a + 1, b + hh], [a, b + hh], [a, b]])
        else:
            rings.append([[a, b], [a + ww, b], [a + ww, b + hh], [a, b + hh], [a, b]])
    coords = np.concatenate([np.asarray(r, dtype=np.float64) for r in rings]) if n else np.empty((0, 2))
    ring_offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    return PolygonBuffers(coords, ring_offsets, np.arange(n + 1, dtype=np.int64))
