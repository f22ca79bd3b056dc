"""GeoArrow-style owned buffers: flat fp64 coordinates plus offset arrays.

A polygon layer is ``coords`` (V, 2) with every ring closed (last vertex repeats
the first), ``ring_offsets`` (R+1) into coords and ``geom_ring_offsets`` (G+1)
into rings. A MultiPolygon simply owns the rings of all its parts: point-in-
polygon parity and shoelace areas over all rings of a geometry give the right
answer for valid (multi)polygons, so the kernels never need the part level.

Coordinates must be 0 or between COORD_MIN and COORD_MAX in magnitude (COORD_RANGE):
the exact predicates (robust.py, common.cuh, overlay_exact.cu) sum products of
coordinate differences, and of those with split parameters, as expansions of
doubles, exact only while no product overflows (from about 1e150 the overlay's
expansions do, and orient2d's determinant from about 1e154) and every product's
rounding error is itself a double (below about 1e-146 it underflows: at 1e-160
every near-degenerate orientation came out wrong). The range bounds coordinates only:
the overlay's exact test of a point e0 + t (e1 - e0) on an edge also multiplies such
terms by the split parameter t, which has no lower bound, and is exact only while no
such product underflows (|t| from about 1e-60 at the bottom of the range; see
robust.py's caveat). polygons_from_shapely and points_from_any, through which the
public API's inputs come, refuse a coordinate outside the range with
CoordinateRangeError, a ValueError; polygons_from_shapely checks the polygons
make_valid repaired again (a repair adds vertices where edges cross, which can fall
outside the range: a bowtie with corners near 1e-100 can get one at 1e-125).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.errors import BadParameter

COORD_MIN, COORD_MAX = 1e-100, 1e100
COORD_RANGE = "0 or between 1e-100 and 1e100 in magnitude"


class CoordinateRangeError(BadParameter, ValueError):
    """A coordinate the exact predicates cannot decide with: outside COORD_RANGE (a ValueError, and a BadParameter
    for the CLI)."""


def out_of_range(coords: np.ndarray) -> np.ndarray:
    """Per row of ``coords`` (finite values): whether a coordinate lies outside COORD_RANGE."""
    a = np.abs(coords)
    return ((a > COORD_MAX) | ((a < COORD_MIN) & (a != 0.0))).any(axis=-1)


def _refuse_range(kind: str, i: int, values, repaired: bool = False) -> None:
    bad = [float(v) for v in np.ravel(values) if v != 0.0 and not (COORD_MIN <= abs(v) <= COORD_MAX)]
    where = " after make_valid repaired it" if repaired else ""
    raise CoordinateRangeError(f"{kind} {i} has a coordinate ({bad[0]:g}) outside the supported range{where}: every "
                               f"coordinate must be {COORD_RANGE} (the exact orientation tests overflow or underflow "
                               f"outside it); scale the data into that range, and set to 0 values that are only "
                               f"rounding noise around 0")


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
        # polygons_from_shapely both normalise orientation this way). Decided on coordinates scaled by a power of
        # two (exact) where they are large: GEOS's signed area overflows near 1e154, every ring then reads as a hole
        # and no polygon can be built.
        big = float(np.abs(self.coords).max(initial=0.0))
        scaled = shapely.linearrings(self.coords * 2.0 ** -int(np.frexp(big)[1]), indices=ring_idx) \
            if big > 1e100 else rings
        is_shell = shapely.is_ccw(scaled)
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


def polygons_from_shapely(geoms, make_valid: bool = False) -> PolygonBuffers:
    """Flatten shapely Polygons/MultiPolygons (holes allowed) into owned buffers.

    The kernels are exact for *valid* polygons only: a self-intersecting ring or
    overlapping parts have no defined area or interior, so an invalid geometry is
    refused with its index, unless ``make_valid=True`` asks for shapely's repair
    (its polygonal part is kept). Every refusal names the first offending index.
    """
    import shapely

    geoms = np.asarray(geoms, dtype=object)
    if geoms.ndim != 1:
        raise BadParameter("polygons must be a 1-D sequence of shapely Polygon/MultiPolygon")
    kinds = shapely.get_type_id(geoms)
    _refuse(~np.isin(kinds, (3, 6)), "polygon {i} is not a Polygon or MultiPolygon (got {what}); pass only "
                                     "areal geometries", geoms)
    _refuse(shapely.is_empty(geoms), "polygon {i} is empty; drop empty polygons first", geoms)
    coords = shapely.get_coordinates(geoms)
    if not np.isfinite(coords).all():
        _refuse(np.array([not np.isfinite(shapely.get_coordinates(g)).all() for g in geoms]),
                "polygon {i} has NaN or infinite coordinates; fix or drop it", geoms)
    _refuse_polygon_range(geoms, coords)
    invalid = ~shapely.is_valid(geoms)
    if invalid.any():
        if not make_valid:
            i = int(np.flatnonzero(invalid)[0])
            raise BadParameter(f"polygon {i} is invalid ({shapely.is_valid_reason(geoms[i])}) and its area or interior "
                               f"is undefined; repair it with shapely.make_valid, or pass make_valid=True "
                               f"({int(invalid.sum())} invalid polygon(s) in all)")
        geoms = geoms.copy()
        geoms[invalid] = [_polygonal(shapely.make_valid(g)) for g in geoms[invalid]]
        _refuse(shapely.is_empty(geoms), "polygon {i} has no area left after make_valid; drop it", geoms)
        # The repair adds vertices where edges cross: check those too (only the repaired polygons changed).
        repaired = np.flatnonzero(invalid)
        _refuse_polygon_range(geoms[repaired], shapely.get_coordinates(geoms[repaired]), repaired)
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


def _refuse_polygon_range(geoms, coords, index=None) -> None:
    """Refuse the first of ``geoms`` with a coordinate outside COORD_RANGE (``coords``: theirs, in order), named by
    its index (``index[i]`` where given: the polygons make_valid repaired, checked again)."""
    import shapely

    far = out_of_range(coords)
    if not far.any():
        return
    owner = shapely.get_coordinates(geoms, return_index=True)[1]
    i = int(owner[np.flatnonzero(far)[0]])
    _refuse_range("polygon", i if index is None else int(index[i]), shapely.get_coordinates(geoms[i]),
                  repaired=index is not None)


def _polygonal(geom):
    """The areal part of what shapely.make_valid returns (it may add lines or points)."""
    import shapely

    if shapely.get_type_id(geom) in (3, 6):
        return geom
    parts = [p for p in shapely.get_parts(geom) if shapely.get_type_id(p) in (3, 6)]
    return shapely.union_all(parts) if parts else shapely.Polygon()


def _refuse(mask, message: str, geoms) -> None:
    if mask.any():
        i = int(np.flatnonzero(mask)[0])
        g = geoms[i]
        raise BadParameter(message.format(i=i, what=type(g).__name__ if g is not None else "None"))


def points_from_any(points) -> tuple[np.ndarray, np.ndarray | None]:
    """(coords, kept) from an (N, 2) array-like or a sequence of shapely Points.

    A point that is None, empty, NaN or infinite keeps its index and matches
    nothing, as in shapely: ``coords`` holds only the usable points and ``kept``
    maps their positions back to the caller's indices (None when all are usable).
    """
    arr = np.asarray(points)
    if arr.dtype == object:
        import shapely

        if arr.ndim != 1:
            raise BadParameter(f"points must be a 1-D sequence of shapely Points or an (N, 2) array, got shape "
                               f"{arr.shape}")
        kinds = shapely.get_type_id(arr)
        _refuse(~np.isin(kinds, (-1, 0)), "point {i} is not a Point (got {what}); pass shapely Points or an "
                                          "(N, 2) float array", arr)
        usable = (kinds == 0) & ~shapely.is_empty(arr)
        xy = np.full((len(arr), 2), np.nan)
        xy[usable] = shapely.get_coordinates(arr[usable])
        arr = xy
    try:
        arr = np.ascontiguousarray(arr, dtype=np.float64)
    except (TypeError, ValueError):
        raise BadParameter("points must be shapely Points or an (N, 2) float array") from None
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise BadParameter(f"points must have shape (N, 2), got {arr.shape}")
    # Every coordinate of one sign and inside the range (a NaN fails every test): nothing to refuse or leave out,
    # known from two reductions that allocate nothing, where the row-by-row test below makes masks of every row
    # (40 against 2 ms at 1M points on a 2-core host, paid by every JoinReplay batch). Mixed signs, a 0, a NaN or
    # an infinity take the row-by-row test.
    if arr.size:
        lo, hi = arr.min(), arr.max()
        if (COORD_MIN <= lo and hi <= COORD_MAX) or (-COORD_MAX <= lo and hi <= -COORD_MIN):
            return arr, None
    finite = np.isfinite(arr).all(axis=1)
    far = np.flatnonzero(finite & out_of_range(np.where(np.isfinite(arr), arr, 0.0)))
    if len(far):
        _refuse_range("point", int(far[0]), arr[far[0]])
    if finite.all():
        return arr, None
    kept = np.flatnonzero(finite)
    return np.ascontiguousarray(arr[kept]), kept
