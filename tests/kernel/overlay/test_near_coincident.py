"""Layers whose boundaries nearly coincide: every version, on both devices, equals shapely (oracle.RULE).

Each case once gave a wrong area: a piece of an edge was kept when its *rounded* midpoint lay inside the other
polygon, and where the piece runs within rounding distance of the other boundary that point can fall on the wrong
side of it; a crossing at a tiny angle got a parameter from a denominator that had lost every digit (or rounded to
zero); a crossing that rounded to an end of its segment, boundaries crossing at a shared vertex, or a vertex on the
other ring's edge whose parameter along it rounded to the edge's end left no record, so v1 and v2 took a ring the
other boundary cuts for a whole one, and v3 carried a ring's inside/outside status past a point where it changes.
"""
import numpy as np
import pytest
import shapely
from shapely import affinity

from app.kernel.robust import orient2d_flags
from app.kernel.segments import DISJOINT, OVERLAP, TOUCH, classify_pairs

from app.kernel.datagen import make_polygons
from app.kernel.geometry import PolygonBuffers
from app.kernel.overlay import overlay_areas
from app.kernel.overlay.oracle import compare, layer_measures, shapely_overlay
from tests.conftest import DEVICES

VERSIONS = ["v1", "v2", "v3", "v4"]


def matches(left, right, device, version):
    left, right = np.asarray(left, dtype=object), np.asarray(right, dtype=object)
    got = overlay_areas(left, right, device=device, version=version)
    res = compare(got, shapely_overlay(left, right), layer_measures(left), layer_measures(right))
    assert res["matches"], res
    return got


def perturbed(n, vertices, seed, offset, ulps):
    """A layer and the same layer with every vertex moved by up to ``ulps`` ulps, each coordinate on its own (a
    ring's last vertex set back to its first, so rings stay closed)."""
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
    """A triangle against itself with one vertex moved an ulp down (0.4 to 0.39999999999999997): the two
    boundaries run within rounding of each other along both of that vertex's edges. Every version gave 0.88 for
    2.36."""
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


# A's right edge runs from (0.5, -1) up to (0.5, 1). B's vertex (0.5, 1 - 2^-53) lies exactly on it, strictly inside,
# but its parameter along the edge, (2 - 2^-53) / 2, rounds to 1; likewise (-1 + 2^-53, 1) on A's top edge, from
# (0.5, 1) to (-1, 1), at (1.5 - 2^-53) / 1.5. Those contacts were dropped as if at the edges' own ends (which split
# nothing), and nothing marked them: A's ring kept no record of B's boundary.
EPS = 2.0 ** -53
SQUARE = [(-1, -1), (0.5, -1), (0.5, 1), (-1, 1)]
ROUNDED_TOUCHES = {
    # B crosses A's boundary only at those two vertices: A's ring had no record at all, v1 and v2 judged it whole
    # by its first vertex (outside B) and every version gave 0.375.
    "only_contacts_round": ([(0.5, 1 - EPS), (2, 2), (-1 + EPS, 1), (0, 0)], 0.75),
    # B also crosses A's top edge at (0, 1): v1 and v2 cut A's ring there, but v3 carried "outside" from A's right
    # edge over the unrecorded crossing at (0.5, 1 - 2^-53) and gave 1.625.
    "v3_walks_past_it": ([(0.5, 1 - EPS), (2, 2), (0, 2), (0, 0)], 0.25),
    # B runs up A's right edge from that vertex to A's corner: a shared stretch 2^-53 long whose parameters on A's
    # edge both round to 1, then B leaves through the corner.
    "shared_stretch_at_a_corner": ([(0.5, 1 - EPS), (0.5, 1), (2, 2), (-1 + EPS, 1), (0, 0)], 0.75),
    # B's vertices at A's corners and at a point an ulp along A's bottom edge from its end (exact, no rounding).
    "vertices_at_corners": ([(0.5, 1), (2, 2), (-1, 1), (0, 0), (0.5, -1 + EPS)], None),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("swap", [False, True], ids=["a_left", "b_left"])
@pytest.mark.parametrize("case", sorted(ROUNDED_TOUCHES))
def test_a_vertex_on_an_edge_whose_parameter_rounds_to_its_end(device, version, swap, case):
    """A vertex of one ring exactly on an edge of the other, 2^-54 of the edge from its end, records the contact at
    t = 1 on that edge (a mark: it cuts no piece; in v3 the next piece is tested). Swapped, the vertex is A's on
    B's edge, the other of refine's two paths."""
    ring, want = ROUNDED_TOUCHES[case]
    a, b = shapely.Polygon(SQUARE), shapely.Polygon(ring)
    assert b.is_valid
    exp = shapely.intersection(a, b).area
    if want is not None:
        assert exp == pytest.approx(want, rel=1e-15)
    left, right = ([b], [a]) if swap else ([a], [b])
    got = matches(left, right, device, version)
    assert got[2].tolist() == pytest.approx([exp], rel=1e-12)


SWEEP_SHAPES = [
    [(-1, -1), (0.5, -1), (0.5, 1), (-1, 1)],
    [(0, 0), (1, 1), (0, 2), (-1, 1)],                      # edges of slope +-1
    [(0, 0), (4, 0), (3, 2), (1, 3)],                       # slopes -2 and -1/2 (and one not dyadic)
    [(-1.5, -0.75), (1.25, -0.75), (1.25, 0.5), (0.25, 2.5), (-1.5, 0.5)],
    [(0, 0), (2, 0), (2, 1), (1, 1), (1, 3), (0, 3)],       # not convex
]


def _step_along(c, d, k):
    """Corner c moved k steps towards direction d (an edge from c): a step is an ulp of the coordinate that moves
    (the larger where both do; never below 2^-60), so the point stays exactly on edges that are axis-aligned or of
    slope +-1, +-2 or +-1/2."""
    sx, sy = np.sign(d[0]), np.sign(d[1])
    step = max(abs(np.nextafter(c[0], c[0] + sx) - c[0]) if sx else 0.0,
               abs(np.nextafter(c[1], c[1] + sy) - c[1]) if sy else 0.0, 2.0 ** -60)
    if sx and sy and abs(d[1]) < abs(d[0]):
        return (c[0] + k * sx * step * abs(d[0] / d[1]), c[1] + k * sy * step)
    return (c[0] + k * sx * step, c[1] + k * sy * step * (abs(d[1] / d[0]) if sx else 1.0))


def _snapped_ring(A, rng):
    """A ring with vertices on A's edges one or two steps (_step_along) from A's corners, or at them."""
    n = len(A)
    cx, cy = np.mean(A, axis=0)
    ccw = shapely.Polygon(A).exterior.is_ccw
    pts = []
    if rng.random() < 0.5 and shapely.Polygon(A).convex_hull.area == shapely.Polygon(A).area:
        # From a point near corner C on the edge into C, out around C (outside both of C's edges), to a point near
        # the next corner on the edge out of C, ... and back through a point inside: the boundaries meet only at
        # the snapped points, which all sit where a parameter can round to 1.
        i = int(rng.integers(n))
        for j in range(int(rng.integers(1, n))):
            c, prv, nxt = A[(i + j) % n], A[(i + j - 1) % n], A[(i + j + 1) % n]
            if j == 0:
                pts.append(_step_along(c, (prv[0] - c[0], prv[1] - c[1]), int(rng.integers(1, 3))))
            normals = [(d[1], -d[0]) if ccw else (-d[1], d[0])
                       for d in ((c[0] - prv[0], c[1] - prv[1]), (nxt[0] - c[0], nxt[1] - c[1]))]
            pts.append((c[0] + normals[0][0] + normals[1][0], c[1] + normals[0][1] + normals[1][1]))
            pts.append(_step_along(nxt, (c[0] - nxt[0], c[1] - nxt[1]), int(rng.integers(1, 3))))
        pts.append((cx + rng.normal() * 0.05, cy + rng.normal() * 0.05))
        return pts
    for i in range(n):
        c, prv, nxt = A[i], A[i - 1], A[(i + 1) % n]
        before = _step_along(c, (prv[0] - c[0], prv[1] - c[1]), int(rng.integers(1, 3)))
        after = _step_along(c, (nxt[0] - c[0], nxt[1] - c[1]), int(rng.integers(1, 3)))
        pts += [[c], [before], [after], [before, after], [before, c], [c, after], []][int(rng.integers(7))]
        if rng.random() < 0.6:       # a detour towards the next corner, inside or outside A
            mx, my = 0.5 * (c[0] + nxt[0]), 0.5 * (c[1] + nxt[1])
            f = rng.choice([-0.6, -0.3, 0.4, 0.8, 1.5])
            pts.append((mx + f * (mx - cx) + rng.normal() * 0.1, my + f * (my - cy) + rng.normal() * 0.1))
    return pts[::-1] if rng.random() < 0.3 else pts


def snapped_layers(seed, n=30):
    """One polygon A, a shape across the origin scaled by a power of two (a parameter rounds to an edge's end only
    where the edge is long beside the point's coordinate), and n valid polygons with vertices snapped onto A's edges
    next to its corners (_snapped_ring)."""
    rng = np.random.default_rng(seed)
    shape = np.array(SWEEP_SHAPES[seed % len(SWEEP_SHAPES)], dtype=float)
    shape = (shape - np.round(shape.mean(axis=0) * 4) / 4) * 2.0 ** int(rng.integers(-3, 4))
    A = [tuple(p) for p in shape.tolist()]
    rings = []
    while len(rings) < n:
        pts = _snapped_ring(A, rng)
        b = shapely.Polygon(pts) if len(pts) >= 3 else None
        if b is not None and b.is_valid and b.area > 0:
            rings.append(b)
    return np.array([shapely.Polygon(A)], dtype=object), np.array(rings, dtype=object)


SWEEP_SEEDS = range(60)


def test_the_sweep_puts_vertices_where_a_parameter_rounds_to_an_edges_end():
    """The sweep below tests what it says: many of B's vertices lie exactly on an edge of A, strictly inside it,
    with a parameter along it (as refine takes it) that rounds to 1."""
    rounded = 0
    for seed in SWEEP_SEEDS:
        left, right = snapped_layers(seed)
        a = shapely.get_coordinates(left[0].exterior)
        b = shapely.get_coordinates(right)
        for (x0, y0), (x1, y1) in zip(a[:-1], a[1:]):
            on, _ = orient2d_flags(np.full(len(b), x0), np.full(len(b), y0), np.full(len(b), x1),
                                   np.full(len(b), y1), b[:, 0], b[:, 1])
            use_x = abs(x1 - x0) >= abs(y1 - y0)
            t = (b[:, 0] - x0) / (x1 - x0) if use_x else (b[:, 1] - y0) / (y1 - y0)
            inside = (on == 0) & ~(((b[:, 0] == x0) & (b[:, 1] == y0)) | ((b[:, 0] == x1) & (b[:, 1] == y1)))
            inside &= (np.minimum(x0, x1) <= b[:, 0]) & (b[:, 0] <= np.maximum(x0, x1))
            inside &= (np.minimum(y0, y1) <= b[:, 1]) & (b[:, 1] <= np.maximum(y0, y1))
            rounded += int((inside & ((t == 0.0) | (t == 1.0))).sum())
    assert rounded > 200


@pytest.mark.parametrize("e,f,want", [
    # f ends on e, 2^-54 of e from e's end (the parameter rounds to 1); f's own end is a mark.
    (((0.5, -1), (0.5, 1)), ((0, 0), (0.5, 1 - EPS)), ([1.0], [1.0])),
    # f starts there.
    (((0.5, -1), (0.5, 1)), ((0.5, 1 - EPS), (2, 2)), ([1.0], [0.0])),
    # e ends on f there: the other of refine's two paths.
    (((0, 0), (0.5, 1 - EPS)), ((0.5, -1), (0.5, 1)), ([1.0], [1.0])),
    # e starts on f, at f's end: a shared vertex, two exact parameters.
    (((0.5, 1), (-1, 1)), ((0.5, -1), (0.5, 1)), ([0.0], [1.0])),
    # End to end on one line: a single shared point.
    (((0, 0), (1, 0)), ((1, 0), (2, 0)), ([1.0], [0.0])),
])
def test_every_touch_leaves_a_record_on_both_segments(e, f, want):
    """classify_pairs (refine_pairs' twin) with marks: a touch records its parameter on both segments, 0 and 1
    included."""
    (e0, e1), (f0, f1) = np.array(e, dtype=float), np.array(f, dtype=float)
    r = classify_pairs(*(np.array([v]) for v in (*e0, *e1, *f0, *f1)), marks=True)
    assert r.kind[0] == TOUCH
    got = ([t for t in r.e_t[0].tolist() if t == t], [t for t in r.f_t[0].tolist() if t == t])
    assert got == want


def test_every_contact_of_the_sweeps_boundaries_leaves_a_record_on_both_edges():
    """Over the sweep's polygons, every edge of A against every edge of B: the pairs that meet (exactly) are the
    rings that shapely finds meeting, and each leaves a split record or a shared stretch on both of its edges."""
    for seed in SWEEP_SEEDS[:20]:
        left, right = snapped_layers(seed)
        a = shapely.get_coordinates(left[0].exterior)
        for b_poly in right:
            b = shapely.get_coordinates(b_poly.exterior)
            i, j = (k.ravel() for k in np.meshgrid(np.arange(len(a) - 1), np.arange(len(b) - 1), indexing="ij"))
            r = classify_pairs(a[i, 0], a[i, 1], a[i + 1, 0], a[i + 1, 1], b[j, 0], b[j, 1], b[j + 1, 0],
                               b[j + 1, 1], marks=True)
            meet = r.kind != DISJOINT
            assert meet.any() == shapely.intersects(left[0].exterior, b_poly.exterior)
            shared = r.kind == OVERLAP
            assert ((~np.isnan(r.e_t)).any(axis=1) | shared)[meet].all(), seed
            assert ((~np.isnan(r.f_t)).any(axis=1) | shared)[meet].all(), seed


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("swap", [False, True], ids=["a_left", "b_left"])
def test_vertices_snapped_onto_edges_next_to_corners(device, version, swap):
    """Randomised: polygons whose vertices lie on A's edges (or just off them) one or two ulps from A's corners,
    at its corners, or along its edges into them, against A: every pair within the verification's tolerance."""
    for seed in SWEEP_SEEDS:
        left, right = snapped_layers(seed)
        if swap:
            left, right = right, left
        got = overlay_areas(left, right, device=device, version=version)
        res = compare(got, shapely_overlay(left, right), layer_measures(left), layer_measures(right))
        assert res["matches"], (seed, res)


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
    if version in ("v3", "v4"):
        for k in ("cut_rings", "fragments", "fragments_kept", "pip_tests"):
            assert meta["cpu"][k] == meta["gpu"][k], k
