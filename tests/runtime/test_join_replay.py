"""JoinReplay: batch after batch of the same counts, the stages after the build replayed as one CUDA graph. Every
batch's answer is checked against shapely; the graph serves only batches it can answer completely."""
import numpy as np
import pytest

from app.errors import BadParameter
from app.kernel.datagen import make_points, make_polygons, shifted
from app.kernel.geometry import PolygonBuffers, polygons_from_shapely
from app.kernel.join import JoinReplay
from app.kernel.join.plan import JoinInputs, JoinV4


def _check(points, polys, got, predicate="within"):
    check = JoinV4().verify(JoinInputs(points, polys, predicate), got)
    assert check["matches"], check
    return check["pairs"]


@pytest.mark.parametrize("kw,fragment", [({"version": "v2"}, "use v3 or v4"),
                                         ({"predicate": "near"}, "unknown predicate 'near'")])
def test_a_version_or_predicate_it_cannot_replay_is_refused_in_one_line(kw, fragment):
    with pytest.raises(BadParameter, match=fragment):
        JoinReplay(**kw)


def test_without_a_gpu_it_says_so_and_names_the_cpu_path():
    from app.runtime.device import probe_gpu

    if probe_gpu()[0]:
        pytest.skip("a GPU is here: the refusal is for machines without one")
    with pytest.raises(BadParameter, match=r"needs a GPU \(.*\); spatial_join runs on the CPU too"):
        JoinReplay()


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3", "v4", "v5"])
def test_batches_of_the_same_counts_replay_one_graph_and_match_shapely(version):
    polys = make_polygons(2_000, 16, 0)
    replay = JoinReplay(version=version)
    pairs = []
    for k in range(4):
        batch_polys = shifted(polys, 0.2 * k, -0.1 * k)
        if k == 2:       # the same counts, other rings and polygons at each index: the offsets are new data too
            batch_polys = polygons_from_shapely(batch_polys.to_shapely()[::-1])
            assert not np.array_equal(batch_polys.ring_offsets, polys.ring_offsets)
        pts = make_points(20_000, k, layout="uniform", polygons=batch_polys)
        got = replay(pts, batch_polys)
        pairs.append(_check(pts, batch_polys, got))
        # the same batch through the polygons' shapely form: the same answer
        if k == 3:
            again = replay(pts, batch_polys.to_shapely())
            assert all(np.array_equal(a, b) for a, b in zip(again, got))
    assert replay.stats == {"replayed": 4, "eager": 1, "captures": 1}
    assert len(set(pairs)) > 1 and min(pairs) > 0          # the answers changed with the data


def _grown(polys: PolygonBuffers, factor: float) -> PolygonBuffers:
    """Each polygon scaled about its bbox's centre: the same counts and rings, ``factor`` times the extent, so a
    point falls in many more bboxes."""
    starts = polys.ring_offsets[polys.geom_ring_offsets[:-1]]
    lo, hi = np.minimum.reduceat(polys.coords, starts), np.maximum.reduceat(polys.coords, starts)
    centre = ((lo + hi) / 2)[np.repeat(np.arange(polys.n_geoms), np.diff(np.append(starts, polys.n_coords)))]
    return PolygonBuffers(centre + (polys.coords - centre) * factor, polys.ring_offsets, polys.geom_ring_offsets)


@pytest.mark.gpu
def test_a_batch_whose_candidates_outgrow_the_room_runs_eagerly_and_is_captured_again():
    """The graph's candidate room is the eager run's (2 pairs a point at first): polygons grown 6 times give about
    20 a point, which a replay would cut short. That batch runs eagerly, its answer complete, and the graph is
    captured again around the grown room, which the next such batch replays."""
    polys = make_polygons(2_000, 16, 0)
    pts = make_points(20_000, 3, layout="uniform", polygons=polys)
    big = _grown(polys, 6.0)
    replay = JoinReplay()
    small_pairs = _check(pts, polys, replay(pts, polys))
    assert replay.stats == {"replayed": 0, "eager": 1, "captures": 1}
    assert _check(pts, big, replay(pts, big)) > 5 * small_pairs
    assert replay.stats == {"replayed": 0, "eager": 2, "captures": 2}
    assert _check(pts, big, replay(pts, big)) > 0 and _check(pts, polys, replay(pts, polys)) == small_pairs
    assert replay.stats == {"replayed": 2, "eager": 2, "captures": 2}


@pytest.mark.gpu
def test_other_counts_are_captured_anew_and_unusable_points_keep_their_indices():
    polys = make_polygons(500, 8, 2)
    replay = JoinReplay(predicate="intersects")
    for seed, n in enumerate((5_000, 7_000, 7_000)):
        pts = make_points(n, seed, layout="uniform", polygons=polys)
        pts[::97] = np.nan                                          # unusable: matched to nothing, index kept
        got = replay(pts, polys)
        ok = np.isfinite(pts).all(axis=1)
        assert not np.isin(got[0], np.flatnonzero(~ok)).any()
        _check(pts, polys, got, "intersects")
    assert replay.stats == {"replayed": 1, "eager": 2, "captures": 2}


@pytest.mark.gpu
def test_a_batch_with_nothing_to_join_is_answered_without_a_graph():
    polys = make_polygons(300, 8, 1)
    replay = JoinReplay()
    empty = replay(np.empty((0, 2)), polys)
    assert len(empty[0]) == len(empty[1]) == 0 and empty[0].dtype == np.int32
    pts = make_points(3_000, 4, layout="uniform", polygons=polys)
    _check(pts, polys, replay(pts, polys))
    assert replay.stats == {"replayed": 0, "eager": 2, "captures": 1} and replay.refused is None
