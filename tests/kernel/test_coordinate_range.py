"""Coordinates the exact predicates support (geometry.COORD_RANGE: 0, or between 1e-100 and 1e100 in magnitude) give
exact answers at both ends; outside it the public API refuses them with one ValueError line naming the range."""
import numpy as np
import pytest
import shapely
from shapely import affinity

from app.errors import BadParameter
from app.kernel.datagen import make_polygons
from app.kernel.geometry import (COORD_RANGE, CoordinateRangeError, PolygonBuffers, out_of_range,
                                 polygons_from_shapely)
from app.kernel.join import spatial_join
from app.kernel.overlay import overlay_areas
from app.kernel.overlay.oracle import compare, layer_measures, shapely_overlay
from tests.conftest import DEVICES
from tests.kernel.test_exact_predicates import exact_point_class


@pytest.mark.parametrize("call,what", [
    (lambda: overlay_areas([shapely.box(0, 0, 1, 1), shapely.box(1e160, 0, 2e160, 1)], [shapely.box(0, 0, 1, 1)]),
     "polygon 1 has a coordinate (2e+160)"),
    (lambda: overlay_areas([shapely.box(0, 0, 1, 1)], [shapely.Polygon([(0, 0), (1, 1e-120), (0, 1)])]),
     "polygon 0 has a coordinate (1e-120)"),
    (lambda: spatial_join([(0.5, 0.5), (3e101, 0.0)], [shapely.box(0, 0, 1, 1)]), "point 1 has a coordinate (3e+101)"),
    (lambda: spatial_join([(0.5, 0.5)], [shapely.box(-1e120, 0, 1, 1)]), "polygon 0 has a coordinate (-1e+120)"),
])
def test_coordinates_outside_the_range_are_refused_with_one_line(call, what):
    with pytest.raises(ValueError) as err:
        call()
    assert isinstance(err.value, CoordinateRangeError) and isinstance(err.value, BadParameter)
    text = str(err.value)
    assert what in text and COORD_RANGE in text and "\n" not in text
    assert "set to 0 values that are only rounding noise around 0" in text


def test_a_polygon_make_valid_repairs_is_checked_again():
    """A bowtie whose corners are all in range: make_valid adds a vertex where its edges cross, at x = -1.4e-125
    (rounding noise around 0), which the check before the repair never saw."""
    bowtie = shapely.Polygon([(-3.5e-100, 1.5e-100), (2.5e-100, -1.5e-100), (-2.5e-100, 4.5e-100),
                              (2.5e-100, 1.5e-100)])
    assert not bowtie.is_valid and out_of_range(shapely.get_coordinates(shapely.make_valid(bowtie))).any()
    with pytest.raises(CoordinateRangeError) as err:
        polygons_from_shapely([shapely.box(0, 0, 1, 1), bowtie], make_valid=True)
    text = str(err.value)
    assert "polygon 1 has a coordinate (" in text and "after make_valid repaired it" in text
    assert COORD_RANGE in text and "rounding noise around 0" in text and "\n" not in text
    with pytest.raises(BadParameter, match="polygon 1 is invalid"):      # without the repair: refused as invalid
        polygons_from_shapely([shapely.box(0, 0, 1, 1), bowtie])


def test_zero_nan_and_the_range_ends_are_accepted():
    polygons_from_shapely([shapely.box(0, 0, 1e100, 1e100), shapely.box(1e-100, 1e-100, 2e-100, 2e-100)])
    pt, poly = spatial_join([(np.nan, 0.0), (2e-100, 2e-100), (0.0, 0.0)],
                            [shapely.box(0, 0, 4e-100, 4e-100)], "intersects", device="cpu")
    assert pt.tolist() == [1, 2] and poly.tolist() == [0, 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [1e-90, 1e90])
def test_a_triangle_at_the_range_ends_joins_exactly(device, scale):
    """Points against a triangle scaled to 1e-90 (its vertices, edge midpoints, points along its edges and random
    points around it): 10% of the answers were wrong, their orientations' detleft * detright underflowing to zero
    and skipping the exact path."""
    rng = np.random.default_rng(0)
    tri = shapely.Polygon([(0, 0), (scale, 0.3 * scale), (0.2 * scale, 1.7 * scale)])
    c = shapely.get_coordinates(tri)
    a, b = c[:-1], np.roll(c[:-1], -1, 0)
    t = rng.random((200, 1))
    pts = np.concatenate([c[:-1], (a + b) / 2] + [a[i] + t * (b[i] - a[i]) for i in range(3)]
                         + [rng.random((200, 2)) * scale * 1.8])
    truth = [exact_point_class(*map(float, p), c.tolist()) for p in pts]
    for predicate in ("within", "intersects"):
        want = [i for i, (inside, on) in enumerate(truth) if inside or (on and predicate == "intersects")]
        got = spatial_join(pts, [tri], predicate, device=device)[0]
        assert got.tolist() == want, predicate


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [1e-95, 1e95])
def test_overlay_at_the_range_ends_equals_shapely(device, scale):
    f = scale / 1000.0
    left = np.array([affinity.scale(g, f, f, origin=(0, 0)) for g in make_polygons(120, 12, seed=3).to_shapely()])
    right = np.array([affinity.scale(g, f, f, origin=(0, 0)) for g in make_polygons(120, 12, seed=4).to_shapely()])
    for version in ("v1", "v3"):
        got = overlay_areas(left, right, device=device, version=version)
        res = compare(got, shapely_overlay(left, right), layer_measures(left), layer_measures(right))
        assert res["matches"], (version, res)


def test_owned_buffers_of_huge_coordinates_still_rebuild_their_polygons():
    """to_shapely took every ring of 1e160 coordinates for a hole (GEOS's signed area overflowed) and crashed."""
    p = polygons_from_shapely([shapely.Polygon([(0, 0), (2, 0), (2, 2), (0, 2)], [[(0.5, 0.5), (0.5, 1), (1, 1)]])])
    big = PolygonBuffers(p.coords * 1e160, p.ring_offsets, p.geom_ring_offsets).to_shapely()
    assert big[0].bounds == (0.0, 0.0, 2e160, 2e160) and len(big[0].interiors) == 1


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("value,refused", [(1e-200, True), (1e101, True), (1e-100, False), (1e100, False),
                                           (3.5, False)])
def test_points_of_one_sign_are_checked_as_closely_as_mixed_ones(sign, value, refused):
    """The check's quick path (every coordinate of one sign, read from the array's minimum and maximum) refuses
    and accepts exactly what the row-by-row test does: one coordinate out of range among 10,000 fine ones."""
    from app.kernel.geometry import points_from_any

    pts = sign * np.random.default_rng(0).uniform(1.0, 100.0, (10_000, 2))
    pts[4_321, 1] = sign * value
    if refused:
        with pytest.raises(CoordinateRangeError, match="point 4321 has a coordinate"):
            points_from_any(pts)
    else:
        xy, kept = points_from_any(pts)
        assert kept is None and np.array_equal(xy, pts)
