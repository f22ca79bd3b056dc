"""Inputs whose answer is undefined are refused with their index; unusable points keep their index.

Each case here once returned a number that shapely contradicts (issue: silent wrong answers).
"""
import numpy as np
import pytest
import shapely
from shapely.geometry import MultiPolygon, Point, Polygon, box

from app.errors import BadParameter
from app.kernel.cli import main
from app.kernel.join import spatial_join
from app.kernel.overlay import overlay_areas
from tests.conftest import DEVICES

SQ = box(0, 0, 1, 1)
BOWTIE = Polygon([(0, 0), (1, 1), (1, 0), (0, 1)])
OVERLAPPING = MultiPolygon([SQ, box(0.5, 0.5, 1.5, 1.5)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("points", [
    [Point(), Point(.5, .5), Point(5, 5), Point(.25, .25)],
    [None, Point(.5, .5), Point(np.nan, 1), Point(.25, .25)],
    np.array([[np.inf, 0], [.5, .5], [np.nan, np.nan], [.25, .25]]),
])
def test_unusable_points_keep_their_index_and_match_nothing(device, points):
    pt, poly = spatial_join(points, [SQ, box(0.2, 0.2, 0.3, 0.3)], device=device)
    assert pt.tolist() == [1, 3, 3] and poly.tolist() == [0, 0, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_unusable_points_in_bulk_agree_with_shapely(device):
    rng = np.random.default_rng(3)
    xy = rng.uniform(0, 4, (2000, 2))
    xy[rng.choice(2000, 300, replace=False)] = np.nan
    polys = [box(i, j, i + 0.9, j + 0.9) for i in range(4) for j in range(4)]
    pt, poly = spatial_join(xy, polys, device=device)
    tree = shapely.STRtree(polys)
    qp, qg = tree.query(shapely.points(xy), predicate="within")
    order = np.lexsort((qg, qp))
    assert pt.tolist() == qp[order].tolist() and poly.tolist() == qg[order].tolist()


@pytest.mark.parametrize("call,fragment", [
    (lambda: overlay_areas([OVERLAPPING], [SQ]), "polygon 0 is invalid"),
    (lambda: overlay_areas([SQ], [SQ, BOWTIE]), "polygon 1 is invalid (Self-intersection"),
    (lambda: spatial_join([Point(.5, .2)], [BOWTIE]), "pass make_valid=True"),
    (lambda: spatial_join([Point(.5, .2)], [SQ, Polygon()]), "polygon 1 is empty"),
    (lambda: spatial_join([Point(.5, .2)], [SQ, None]), "polygon 1 is not a Polygon or MultiPolygon (got None)"),
    (lambda: spatial_join([Point(.5, .2)], [Point(0, 0)]), "polygon 0 is not a Polygon"),
    (lambda: spatial_join([Point(.5, .2)], [SQ, Polygon([(0, 0), (np.nan, 1), (1, 0)])]), "polygon 1 has NaN"),
    (lambda: spatial_join([Point(.5, .2), shapely.LineString([(0, 0), (1, 1)])], [SQ]), "point 1 is not a Point"),
    (lambda: spatial_join(np.zeros((3, 3)), [SQ]), "points must have shape (N, 2)"),
    (lambda: spatial_join([["a", "b"]], [SQ]), "points must be shapely Points or an (N, 2) float array"),
])
def test_undefined_inputs_are_refused_with_their_index(call, fragment):
    with pytest.raises(BadParameter) as err:
        call()
    assert fragment in str(err.value)


@pytest.mark.parametrize("device", DEVICES)
def test_make_valid_repairs_explicitly_and_matches_shapely(device):
    for poly in (OVERLAPPING, BOWTIE):
        repaired = shapely.make_valid(poly)
        a, b, area = overlay_areas([poly], [SQ], device=device, make_valid=True)
        assert area.tolist() == pytest.approx([shapely.intersection(repaired, SQ).area], rel=1e-9)
        pts = np.random.default_rng(0).uniform(-0.2, 1.7, (500, 2))
        pt, _ = spatial_join(pts, [poly], device=device, make_valid=True)
        assert pt.tolist() == np.flatnonzero(shapely.within(shapely.points(pts), repaired)).tolist()


@pytest.mark.parametrize("raw, value", [("2000", 2000), ("100k", 100_000), ("1M", 1_000_000), ("1.5m", 1_500_000),
                                        ("10_000", 10_000), (7, 7), ("2G", 2_000_000_000)])
def test_sizes_are_written_as_users_write_them(raw, value):
    from app.kernel.plan import parse_count

    assert parse_count(raw) == value


@pytest.mark.parametrize("raw", ["1.5k7", "0.0001k", "nank", "infM", "k", "ten", True])
def test_a_size_that_is_not_a_whole_number_is_one_line(raw, capsys):
    assert main(["join", "--points", str(raw), "--device", "cpu"]) == 2
    assert "--points expects int" in capsys.readouterr().err
