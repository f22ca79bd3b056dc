"""Layers whose boundaries nearly coincide: every version, on both devices, equals shapely (oracle.RULE).

Each case once gave a wrong area: a piece of an edge was kept when its *rounded* midpoint lay inside the other
polygon, and where the piece runs within rounding distance of the other boundary that point can fall on the wrong
side of it; a crossing at a tiny angle got a parameter from a denominator that had lost every digit (or rounded to
zero); a crossing that rounded to an end of its segment, or boundaries crossing at a shared vertex, left no record,
so v1 and v2 took a ring the other boundary cuts for a whole one.
"""
import numpy as np
import pytest
import shapely
from shapely import affinity

from app.kernel.datagen import make_polygons
from app.kernel.geometry import PolygonBuffers
from app.kernel.overlay import overlay_areas
from app.kernel.overlay.oracle import compare, layer_measures, shapely_overlay
from tests.conftest import DEVICES

VERSIONS = ["v1", "v2", "v3"]


def matches(left, right, device, version):
    left, right = np.asarray(left, dtype=object), np.asarray(right, dtype=object)
    got = overlay_areas(left, right, device=device, version=version)
    res = compare(got, shapely_overlay(left, right), layer_measures(left), layer_measures(right))
    assert res["matches"], res
    return got


def perturbed(n, vertices, seed, offset, ulps):
    """A layer and the same layer with every vertex moved by up to ``ulps`` ulps (rings kept closed, as
    /tmp/exact/po4.py of the audit made them)."""
    rng = np.random.default_rng(seed)
    P = make_polygons(n, vertices, seed=seed)
    A = PolygonBuffers(P.coords + offset, P.ring_offsets, P.geom_ring_offsets)
    c = A.coords + rng.integers(-ulps, ulps + 1, A.coords.shape) * np.spacing(A.coords)
    c[A.ring_offsets[1:] - 1] = c[A.ring_offsets[:-1]]
    B = PolygonBuffers(c, A.ring_offsets, A.geom_ring_offsets)
    la, rb = A.to_shapely(), B.to_shapely()
    assert shapely.is_valid(rb).all()
    return la, rb


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_a_vertex_one_ulp_away(device, version):
    """The audit's case: B is A with one vertex an ulp lower. Every version gave 0.88 for 2.36."""
    A = shapely.Polygon([(2.1, 0.4), (-0.7, 2.0), (-1.9, 1.0)])
    B = shapely.Polygon([(2.1, 0.39999999999999997), (-0.7, 2.0), (-1.9, 1.0)])
    got = matches([A], [B], device, version)
    assert got[2].tolist() == pytest.approx([shapely.intersection(A, B).area], rel=1e-12)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_boundaries_crossing_at_a_shared_vertex(device, version):
    """The rings meet only at shared vertices (touches at segment ends), yet cross there: v1 and v2 found no
    split, took both rings for whole ones, and gave 8 for 2."""
    got = matches([shapely.box(0, 0, 2, 2)], [shapely.Polygon([(2, 2), (0, 0), (3, -1)])], device, version)
    assert got[2].tolist() == pytest.approx([2.0])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [0.0, 1e3, 1e6])
@pytest.mark.parametrize("ulps", [1, 4, 64])
def test_every_vertex_moved_by_a_few_ulps(device, version, offset, ulps):
    """Every vertex of B within a few ulps of A's: edges cross at tiny angles all along each ring. At one ulp
    v1 and v2 got 274 of 706 pairs wrong, v3 119."""
    la, rb = perturbed(200, 8, 1, offset, ulps)
    got = matches(la, rb, device, version)
    assert len(got[0]) > 300


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [0.1, 1 / 3])
def test_a_layer_moved_and_moved_back(device, version, d):
    """Translating by d and back changes a few coordinates by rounding: 2-3 pairs per version were wrong."""
    left = make_polygons(200, 16, seed=0).to_shapely()
    right = np.array([affinity.translate(affinity.translate(g, d, d), -d, -d) for g in left], dtype=object)
    assert (shapely.get_coordinates(left) != shapely.get_coordinates(right)).any()
    got = matches(left, right, device, version)
    self_pairs = dict(zip(zip(got[0].tolist(), got[1].tolist()), got[2].tolist()))
    assert [self_pairs[(i, i)] for i in range(len(left))] == pytest.approx(shapely.area(left).tolist(), rel=1e-12)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_a_small_feature_on_a_large_polygons_edge(device, version):
    """The shoelace's origin is the middle of the pair's bboxes' overlap: from the middle of a 40 km square, the
    pieces of a 1 m^2 feature on its edge were summed with errors of 1e-7 of the feature's area."""
    left = [shapely.box(0, 0, 40_000, 40_000), shapely.box(-40_000, -40_000, 0, 0)]
    right = [shapely.box(39_999.7, 100.1, 40_000.3, 101.3),
             shapely.Polygon([(-0.3, -0.2), (0.45, -0.31), (0.1, 0.27)])]
    got = matches(left, right, device, version)
    exp = shapely_overlay(np.array(left, dtype=object), np.array(right, dtype=object))
    np.testing.assert_allclose(got[2], exp[2], rtol=1e-10)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("angle", [1e-15, 1e-13])
def test_edges_crossing_at_a_tiny_angle(device, version, angle):
    """Each polygon against itself turned about its centroid by a tiny angle: every edge crosses its twin at an
    angle the textbook intersection formula cannot resolve (at 1e-15, 88 of 218 pairs were wrong in v1 and v2,
    54 in v3)."""
    left = make_polygons(100, 12, seed=2).to_shapely()
    right = np.array([affinity.rotate(g, angle, origin=g.centroid, use_radians=True) for g in left], dtype=object)
    assert shapely.is_valid(right).all()
    matches(left, right, device, version)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_the_gpu_redoes_the_rings_its_filter_cannot_decide_and_counts_as_the_cpu(version):
    """On the GPU a ring with a piece the rounded point cannot decide is done again by the exact re-do kernel
    (area_rings_exact, area_cut_rings_exact): the areas are shapely's and, for v3, every count is the CPU's."""
    from app.kernel.geometry import polygons_from_shapely
    from app.kernel.overlay.plan import OverlayInputs
    from app.kernel.plan import get_plan_class
    from app.runtime.device import select
    from app.runtime.execute import backend_for, xp_for
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    la, rb = perturbed(300, 8, 1, 1e3, 1)
    plan = get_plan_class("overlay", version)()
    inp = OverlayInputs(polygons_from_shapely(la), polygons_from_shapely(rb))
    meta = {}
    for device in ("cpu", "gpu"):
        backend, _ = backend_for(plan, select(device))
        out, rec = Recorder(device, xp_for(device), Nvtx(False, "overlay")).run(plan, inp, backend)
        assert plan.verify(inp, tuple(np.asarray(getattr(a, "get", lambda: a)()) for a in out))["matches"]
        meta[device] = {s["name"]: s["meta"] for s in rec.stages}["area_reconstruction"]
    assert meta["gpu"]["exact_rings"] > 0
    if version == "v3":
        for k in ("cut_rings", "fragments", "fragments_kept", "pip_tests"):
            assert meta["cpu"][k] == meta["gpu"][k], k
