"""The CPU path's building blocks against plain references: the counting sort by grid cell (one 16-bit radix
pass up to level 8, two above) and the point-in-polygon classification against shapely, pair by pair."""
import numpy as np
import pytest

from app.kernel import grid
from app.kernel.pip import classify, edge_table


@pytest.mark.parametrize("level", [1, 7, 8, 9, 11])
def test_bucket_is_the_stable_sort_by_cell_at_every_level(level):
    rng = np.random.default_rng(level)
    cells = rng.integers(0, 1 << 2 * level, 50_000).astype(np.uint32)
    cells[:500] = cells[0]                                  # long runs of one cell: stability shows
    if level > 8:
        cells[500:900] = (1 << 16) + 3                      # equal low digits, different high ones
        cells[900:1300] = 3
    order, start = grid.bucket(cells, level)
    np.testing.assert_array_equal(order, np.argsort(cells, kind="stable"))
    assert len(start) == (1 << 2 * level) + 1 and start[-1] == len(cells)
    np.testing.assert_array_equal(np.diff(start), np.bincount(cells, minlength=1 << 2 * level))


def test_classify_matches_shapely_pair_by_pair_across_chunks(monkeypatch):
    """Squares and triangles with holes, points inside, outside and on edges and vertices; chunks of a few
    edge tests so pairs fall on every side of a chunk's end."""
    import shapely

    from app.kernel import pip
    from app.kernel.geometry import polygons_from_shapely

    monkeypatch.setattr(pip, "CHUNK_EDGE_TESTS", 37)
    geoms = [shapely.box(0, 0, 4, 4), shapely.Polygon([(0, 0), (6, 0), (3, 5)], [[(2, 1), (4, 1), (3, 2)]]),
             shapely.box(10, 10, 11, 12).difference(shapely.box(10.25, 10.25, 10.75, 10.75))]
    polys = polygons_from_shapely(geoms)
    rng = np.random.default_rng(3)
    pts = np.concatenate([rng.uniform(-1, 12, (400, 2)), [[0, 0], [2, 0], [4, 4], [3, 1], [3, 5], [10.25, 10.5],
                                                          [10.5, 10.5], [2, 1.5]]])
    pt, geom = (a.ravel() for a in np.meshgrid(np.arange(len(pts)), np.arange(len(geoms)), indexing="ij"))
    parity, boundary, _, _ = classify(pts, edge_table(polys.coords, polys.ring_offsets, polys.geom_ring_offsets),
                                   pt, geom)
    shp = shapely.points(pts[pt])
    targets = np.array(geoms, dtype=object)[geom]
    np.testing.assert_array_equal(boundary, shapely.touches(shp, targets))
    np.testing.assert_array_equal(parity & ~boundary, shapely.within(shp, targets))
    assert boundary.sum() >= 6 and (parity & ~boundary).sum() > 50
