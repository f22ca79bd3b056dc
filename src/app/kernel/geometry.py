"""GeoArrow-style owned buffers: flat fp64 coordinates plus offset arrays.

A polygon layer is ``coords`` (V, 2) with every ring closed (last vertex repeats
the first), ``ring_offsets`` (R+1) into coords and ``geom_ring_offsets`` (G+1)
into rings. A MultiPolygon simply owns the rings of all its parts: point-in-
polygon parity and shoelace areas over all rings of a geometry give the right
answer for valid (multi)polygons, so the kernels never need the part level.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.errors import BadParameter


@dataclass(frozen=True)
class PolygonBuffers:
    coords: np.ndarray             # (V, 2) float64, rings closed
    ring_offsets: np.ndarray       # (R + 1,) int64 into coords
    geom_ring_offsets: np.ndarray  # (G + 1,) int64 into rings

    @property
    def n_geoms(self) -> int:
        return len(self.geom_ring_offsets) - 1

    @property
    def n_rings(self) -> int:
        return len(self.ring_offsets) - 1

    @property
    def n_coords(self) -> int:
        return len(self.coords)

    @property
    def n_edges(self) -> int:
        return self.n_coords - self.n_rings

    def geom_coord_offsets(self) -> np.ndarray:
        """(G + 1,) offsets into coords: a geometry's rings are contiguous."""
        return self.ring_offsets[self.geom_ring_offsets]

    def nbytes(self) -> int:
        return self.coords.nbytes + self.ring_offsets.nbytes + self.geom_ring_offsets.nbytes

    def to_shapely(self):
        """Rebuild shapely geometries (for the oracle and for tests only)."""
        import shapely

        ring_idx = np.repeat(np.arange(self.n_rings), np.diff(self.ring_offsets))
        rings = shapely.linearrings(self.coords, indices=ring_idx)
        # Shells are counter-clockwise, holes clockwise (the generator and
        # polygons_from_shapely both normalise orientation this way).
        is_shell = shapely.is_ccw(rings)
        part_of_ring = np.cumsum(is_shell) - 1
        parts = shapely.polygons(rings, indices=part_of_ring)
        geom_of_ring = np.repeat(np.arange(self.n_geoms), np.diff(self.geom_ring_offsets))
        geom_of_part = geom_of_ring[is_shell]
        n_parts = np.bincount(geom_of_part, minlength=self.n_geoms)
        out = np.empty(self.n_geoms, dtype=object)
        single = n_parts == 1
        out[geom_of_part[single[geom_of_part]]] = parts[single[geom_of_part]]
        multi = ~single[geom_of_part]
        if multi.any():
            shapely.multipolygons(parts[multi], indices=geom_of_part[multi], out=out)
        return out


def polygons_from_shapely(geoms) -> PolygonBuffers:
    """Flatten shapely Polygons/MultiPolygons (holes allowed) into owned buffers."""
    import shapely

    geoms = np.asarray(geoms, dtype=object)
    if geoms.ndim != 1:
        raise BadParameter("polygons must be a 1-D sequence of shapely Polygon/MultiPolygon")
    kinds = shapely.get_type_id(geoms)
    bad = ~np.isin(kinds, (3, 6))  # Polygon, MultiPolygon
    if bad.any():
        raise BadParameter(
            f"polygon {int(np.flatnonzero(bad)[0])} is not a Polygon or MultiPolygon; "
            "pass only areal geometries")
    if shapely.is_empty(geoms).any():
        raise BadParameter("empty polygons are not supported; drop them before the join")
    # Shells CCW, holes CW: to_shapely and the area kernels rely on it.
    geoms = shapely.orient_polygons(geoms, exterior_cw=False)
    parts, part_geom = shapely.get_parts(geoms, return_index=True)
    n_int = shapely.get_num_interior_rings(parts)
    rings_per_geom = np.bincount(part_geom, weights=1 + n_int, minlength=len(geoms)).astype(np.int64)
    rings = shapely.get_rings(parts)
    coords, ring_idx = shapely.get_coordinates(rings, return_index=True)
    ring_len = np.bincount(ring_idx, minlength=len(rings))
    return PolygonBuffers(
        coords=np.ascontiguousarray(coords, dtype=np.float64),
        ring_offsets=np.concatenate([[0], np.cumsum(ring_len)]).astype(np.int64),
        geom_ring_offsets=np.concatenate([[0], np.cumsum(rings_per_geom)]).astype(np.int64),
    )


def points_from_any(points) -> np.ndarray:
    """An (N, 2) float64 array from an array-like or a sequence of shapely Points."""
    arr = np.asarray(points)
    if arr.dtype == object:
        import shapely

        if not (shapely.get_type_id(arr) == 0).all():
            raise BadParameter("points must be shapely Points or an (N, 2) float array")
        arr = shapely.get_coordinates(arr)
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise BadParameter(f"points must have shape (N, 2), got {arr.shape}")
    if not np.isfinite(arr).all():
        raise BadParameter("points contain NaN or infinite coordinates")
    return arr
