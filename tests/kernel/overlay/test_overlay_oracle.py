"""Overlay areas equal shapely.intersection(a, b).area (oracle.RULE: 1e-9 of the smaller polygon's area, with rounding's
floor) on both devices."""
import numpy as np
import pytest
import shapely

from app.kernel.overlay import overlay_areas
from app.kernel.overlay.oracle import compare, layer_measures, shapely_overlay
from app.kernel.overlay.plan import OverlayV1
from tests.conftest import DEVICES


VERSIONS = ["v1", "v2", "v3", "v4"]


def assert_matches_shapely(left, right, device, version=None):
    got = overlay_areas(left, right, device=device, version=version)
    exp = shapely_overlay(left, right)
    res = compare(got, exp, layer_measures(left), layer_measures(right))
    assert res["matches"], res
    return got


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout,seed,vertices", [("random", 0, 16), ("random", 7, 16), ("shifted", 1, 16),
                                                  ("self", 2, 16), ("grid", 3, 16),
                                                  ("shifted", 4, 45)])   # rings longer than a warp
def test_layouts(device, layout, seed, vertices, version):
    plan = OverlayV1({"left": 1500, "right": 1200, "layout": layout, "seed": seed, "vertices": vertices})
    inp = plan.make_inputs()
    left, right = inp.left.to_shapely(), inp.right.to_shapely()
    got = assert_matches_shapely(left, right, device, version)
    assert len(got[0]) > 500
    kinds = shapely.get_type_id(left)
    if layout != "grid":   # the generator's layers carry holes and MultiPolygons
        assert (kinds == 6).any() and (shapely.get_num_interior_rings(left[kinds == 3]) > 0).any()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_shared_borders_holes_and_touching(device, version):
    # Adjacent squares (shared edges: zero area), a square against itself, a polygon
    # with a hole against the hole's exact outline and a square straddling it,
    # a MultiPolygon, and squares touching at a corner only.
    sq = shapely.box
    left = np.array([
        sq(0, 0, 2, 2),
        shapely.Polygon([(10, 0), (14, 0), (14, 4), (10, 4)], [[(11, 1), (11, 3), (13, 3), (13, 1)]]),
        shapely.MultiPolygon([sq(20, 0, 21, 1), sq(22, 0, 23, 1)]),
        sq(30, 0, 31, 1),
    ], dtype=object)
    right = np.array([
        sq(2, 0, 4, 2),                  # shares an edge with left[0]: zero area, not reported
        sq(0, 0, 2, 2),                  # identical to left[0]
        sq(1, 1, 3, 3),                  # overlaps left[0] by 1
        sq(11, 1, 13, 3),                # exactly the hole of left[1]: zero area
        sq(12, 2, 15, 5),                # straddles left[1]'s hole corner and its shell
        sq(20.5, 0, 22.5, 1),            # overlaps both parts of the MultiPolygon
        sq(31, 1, 32, 2),                # touches left[3] at one corner
    ], dtype=object)
    got = assert_matches_shapely(left, right, device, version)
    pairs = dict(zip(zip(got[0].tolist(), got[1].tolist()), got[2].tolist()))
    assert (0, 0) not in pairs and (1, 3) not in pairs and (3, 6) not in pairs
    assert pairs[(0, 1)] == pytest.approx(4.0) and pairs[(0, 2)] == pytest.approx(1.0)
    assert pairs[(2, 5)] == pytest.approx(1.0)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_boundaries_through_vertices(device, version):
    # Where one boundary meets the other at a vertex, no split falls inside a segment: v3's walk along a ring
    # must not carry its inside/outside status past such a point. A crossing exactly through a corner, a
    # vertex touching an edge from inside (no crossing), a square inscribed in a diamond (every corner on the
    # other boundary), and the reverse.
    P = shapely.Polygon
    left = np.array([
        shapely.box(0, 0, 4, 4),
        shapely.box(20, 0, 24, 4),
        shapely.box(30, 0, 34, 4),
        P([(42, -2), (46, 2), (42, 6), (38, 2)]),
        shapely.box(50, 0, 54, 4),
    ], dtype=object)
    right = np.array([
        P([(2, 2), (6, 2), (6, 6)]),                      # its hypotenuse crosses left[0] through (4, 4)
        P([(22, 0), (23, 2), (21, 2)]),                   # a vertex on left[1]'s bottom edge, inside it
        P([(32, -2), (36, 2), (32, 6), (28, 2)]),         # left[2] inscribed: all four corners on its edges
        shapely.box(40, 0, 44, 4),                        # inscribed in left[3]
        P([(52, 0), (53, -2), (56, 2), (53, 2)]),         # a vertex on left[4]'s edge, crossing it there
    ], dtype=object)
    got = assert_matches_shapely(left, right, device, version)
    pairs = dict(zip(zip(got[0].tolist(), got[1].tolist()), got[2].tolist()))
    assert pairs[(0, 0)] == pytest.approx(2.0) and pairs[(1, 1)] == pytest.approx(2.0)
    assert pairs[(2, 2)] == pytest.approx(16.0) and pairs[(3, 3)] == pytest.approx(16.0)
    assert (4, 4) in pairs


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("layout", ["random", "self", "grid"])
def test_gpu_and_cpu_stage_metadata_agree(layout, version):
    from app.runtime.device import select
    from app.runtime.execute import backend_for, xp_for
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    from app.kernel.plan import get_plan_class

    plan = get_plan_class("overlay", version)({"left": 3000, "right": 3000, "layout": layout})
    inp = plan.make_inputs()
    rec = {}
    for device in ("cpu", "gpu"):
        backend, _ = backend_for(plan, select(device))
        out, rec[device] = Recorder(device, xp_for(device), Nvtx(False, "overlay")).run(plan, inp, backend)
    by = {d: {s["name"]: s for s in r.stages} for d, r in rec.items()}
    for stage, keys in {"segment_mbr_filter": ("polygon_pairs", "pairs_examined", "candidates", "grid_level",
                                               "bbox_tests"),
                        "exact_intersection_refine": ("proper", "touch", "collinear_overlap", "ambiguous_pairs",
                                                      "split_events")}.items():
        for k in keys:
            assert by["cpu"][stage]["meta"][k] == by["gpu"][stage]["meta"][k], (stage, k)
    assert by["cpu"]["area_reconstruction"]["rows_out"] == by["gpu"]["area_reconstruction"]["rows_out"]
    # The filter's rows in are both layers' polygons on either device (the CPU's read its pairs), its rows out the
    # candidate edge pairs.
    assert {d: (by[d]["segment_mbr_filter"]["rows_in"], by[d]["segment_mbr_filter"]["rows_out"]) for d in by} == {
        d: (6000, by["gpu"]["segment_mbr_filter"]["meta"]["candidates"]) for d in by}
    if version in ("v3", "v4"):
        # The CPU carries the status along each ring as the GPU walks it: the same marks, cut rings, pieces,
        # kept pieces and point-in-polygon tests, exactly.
        assert by["cpu"]["exact_intersection_refine"]["meta"]["end_marks"] == \
            by["gpu"]["exact_intersection_refine"]["meta"]["end_marks"]
        for k in ("cut_rings", "fragments", "fragments_kept", "pip_tests"):
            assert by["cpu"]["area_reconstruction"]["meta"][k] == by["gpu"]["area_reconstruction"]["meta"][k], k


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3", "v4"])
@pytest.mark.parametrize("layout", ["random", "self"])
@pytest.mark.parametrize("small", ["pairs", "candidates", "slots"])
def test_v3_counts_past_a_room_grow_it_and_run_again_exactly(layout, small, version):
    """v3 reads no size before its result: polygon pairs, candidate edge pairs and edge slots go into rooms kept
    from run to run, checked by the one read at the end. A run that counts more than a room holds grows it and
    runs the filter to the areas again in that same run (and says so); the next run fits, with that one read."""
    import cupy as cp

    from app.kernel.overlay.gpu import OverlayGPU
    from app.kernel.plan import get_plan_class
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    plan = get_plan_class("overlay", version)({"left": 800, "right": 700, "layout": layout, "seed": 5})
    inp = plan.make_inputs()
    backend = OverlayGPU(plan.tiling, version)
    backend.compile()
    out, rec = Recorder("gpu", cp, Nvtx(False, "overlay")).run(plan, inp, backend)     # rooms fitted to these
    fitted = dict(backend.rooms)
    backend.rooms = fitted | {small: 50}
    for first in (True, False):
        out, rec = Recorder("gpu", cp, Nvtx(False, "overlay")).run(plan, inp, backend)
        assert plan.verify(inp, tuple(cp.asnumpy(a) for a in out))["matches"]
        by = {s["name"]: s for s in rec.stages}
        filt, area = by["segment_mbr_filter"]["meta"], by["area_reconstruction"]
        assert ("room_grown" in area["meta"]) == first
        if first:
            assert f"{small} did not fit the room for 50" in area["meta"]["room_grown"]
        reads = {name: s["counters"]["allocation_size_reads"] for name, s in by.items()}
        assert reads == {**dict.fromkeys(by, 0), "area_reconstruction": 2 if first else 1}
        assert area["counters"]["result_size_reads"] == reads["area_reconstruction"]
        assert filt["polygon_pairs"] <= filt["pair_room"] and filt["candidates"] <= filt["candidate_room"]
        assert backend.rooms == fitted


def _v3_backend_and_run(version="v3"):
    import cupy as cp

    from app.kernel.overlay.gpu import OverlayGPU
    from app.kernel.plan import get_plan_class
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    backend = OverlayGPU(get_plan_class("overlay", version)({}).tiling, version)
    backend.compile()

    def run(plan, inp):
        out, rec = Recorder("gpu", cp, Nvtx(False, "overlay")).run(plan, inp, backend)
        assert plan.verify(inp, tuple(cp.asnumpy(a) for a in out))["matches"]
        return {s["name"]: s for s in rec.stages}

    return backend, run


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3", "v4"])
def test_v3_runs_leave_the_cell_table_zeroed_and_the_summary_ready_for_the_next(version):
    """A warm v3 run launches no init_summary or memset: the run before set the summary back to its identities
    (sort_pairs) and zeroed the filter's cell table (corner_scatter) and the event sort's count tables
    (slot_scatter). After every run all must be so, also after a run whose room grew, which sums the summary
    again before it runs the filter again."""
    import math

    import cupy as cp

    from app.kernel.plan import get_plan_class

    backend, run = _v3_backend_and_run(version)
    plan = get_plan_class("overlay", version)({"left": 800, "right": 700, "seed": 5})
    inp = plan.make_inputs()
    for grow in (False, False, True, False):
        if grow:
            backend.rooms = dict(backend.rooms) | {"pairs": 50}
        stages = run(plan, inp)
        assert ("room_grown" in stages["area_reconstruction"]["meta"]) is grow
        summary, counts = backend._ready
        assert not cp.asnumpy(counts).any() and not cp.asnumpy(backend._sort_ready).any()
        assert cp.asnumpy(summary).tolist() == [math.inf, math.inf, -math.inf, -math.inf, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.gpu
@pytest.mark.parametrize("version,stop_at", [("v3", "corner_start"), ("v3", "ev_start"), ("v4", "filter_fused"),
                                             ("v4", "ev_start")])
def test_v3_a_run_stopped_after_counting_leaves_the_next_run_exact(version, stop_at):
    """A run stopped between a count and the scatter that zeroes its table again (the scan's launch between them
    interrupted, as by Ctrl-C) leaves that table dirty: the filter's cell table, with the summary summed, or the
    event sort's count tables. The next run, on other layers, must set them up again rather than add to them.
    v4 counts, scans and scatters in one launch: stopped before it, the summary is summed and not yet reset."""
    from app.kernel.plan import get_plan_class

    backend, run = _v3_backend_and_run(version)
    plans = [get_plan_class("overlay", version)({"left": 800, "right": 700, "seed": s}) for s in (5, 6)]
    first = plans[0].make_inputs()
    run(plans[0], first)                        # warm: the next run trusts what this one left
    scan, launch = backend.mod.inclusive_scan, backend._launch_cooperative

    def interrupted(x, out_dtype, tag, n_dev=None):
        if tag == stop_at:
            raise KeyboardInterrupt
        return scan(x, out_dtype, tag, n_dev=n_dev)

    def interrupted_launch(name, *args):
        if name == stop_at:
            raise KeyboardInterrupt
        return launch(name, *args)

    backend.mod.inclusive_scan, backend._launch_cooperative = interrupted, interrupted_launch
    with pytest.raises(KeyboardInterrupt):
        run(plans[0], first)
    backend.mod.inclusive_scan, backend._launch_cooperative = scan, launch
    assert (backend._sort_ready if stop_at == "ev_start" else backend._ready) is None
    run(plans[1], plans[1].make_inputs())


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_a_polygon_with_more_pairs_than_its_stash_is_placed_by_the_second_pass_exactly(version):
    """polygon_pairs keeps each a's first 16 b's in a stash row; an a that meets more is tested again by the emit
    pass, which runs only then and which the filter's metadata counts. Here a[0] meets 49 b's and a[1] three."""
    import cupy as cp

    from app.kernel.geometry import polygons_from_shapely
    from app.kernel.overlay.gpu import PAIR_STASH
    from app.kernel.overlay.plan import OverlayInputs
    from app.kernel.plan import get_plan_class
    from app.runtime.device import select
    from app.runtime.execute import backend_for
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    left = np.array([shapely.box(0, 0, 7, 7), shapely.box(20, 20, 23, 21)], dtype=object)
    crowd = [shapely.box(i + 0.1, j + 0.1, i + 0.6, j + 0.6) for i in range(7) for j in range(7)]
    right = np.array(crowd + [shapely.box(20.5, 20.5, 21.5, 22), shapely.box(21.5, 20, 22, 20.5),
                              shapely.box(22.9, 20.9, 24, 22)], dtype=object)
    assert len(crowd) > PAIR_STASH
    plan = get_plan_class("overlay", version)()
    inp = OverlayInputs(polygons_from_shapely(left), polygons_from_shapely(right))
    backend, _ = backend_for(plan, select("gpu"))
    out, rec = Recorder("gpu", cp, Nvtx(False, "overlay")).run(plan, inp, backend)
    got = tuple(cp.asnumpy(a) for a in out)
    res = compare(got, shapely_overlay(left, right), layer_measures(left), layer_measures(right))
    assert res["matches"], res
    assert len(got[0]) == len(crowd) + 3
    filt = {s["name"]: s for s in rec.stages}["segment_mbr_filter"]["meta"]
    assert filt["polygons_tested_twice"] == 1 and filt["polygon_pairs"] == len(crowd) + 3


def _star(n: int, r_out: float, r_in: float, turn: float, cx: float = 0.0, cy: float = 0.0):
    t = np.linspace(0.0, 2 * np.pi, 2 * n, endpoint=False) + turn
    r = np.where(np.arange(2 * n) % 2 == 0, r_out, r_in)
    return shapely.Polygon(np.c_[cx + r * np.cos(t), cy + r * np.sin(t)])


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_a_pair_with_more_candidates_than_the_warp_stash_is_written_exactly(version):
    """v3's edge-pair filter keeps a warp's hits in a shared-memory stash of 64 and writes it out when full: two
    overlapping 150-point stars make one polygon pair with hundreds of candidate edge pairs (a second, small pair
    beside it has a few). Every version finds the CPU's candidates and shapely's areas."""
    import cupy as cp

    from app.kernel.geometry import polygons_from_shapely
    from app.kernel.overlay.plan import OverlayInputs
    from app.kernel.plan import get_plan_class
    from app.runtime.device import select
    from app.runtime.execute import backend_for, xp_for
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    left = np.array([_star(150, 1.0, 0.55, 0.0), shapely.box(5, 5, 6, 6)], dtype=object)
    right = np.array([_star(150, 0.98, 0.6, 0.013), shapely.box(5.5, 5.5, 7, 7)], dtype=object)
    plan = get_plan_class("overlay", version)()
    inp = OverlayInputs(polygons_from_shapely(left), polygons_from_shapely(right))
    meta = {}
    for device in ("cpu", "gpu"):
        backend, _ = backend_for(plan, select(device))
        out, rec = Recorder(device, xp_for(device), Nvtx(False, "overlay")).run(plan, inp, backend)
        got = tuple(np.asarray(cp.asnumpy(a) if device == "gpu" else a) for a in out)
        res = compare(got, shapely_overlay(left, right), layer_measures(left), layer_measures(right))
        assert res["matches"], (device, res)
        meta[device] = {s["name"]: s["meta"] for s in rec.stages}["segment_mbr_filter"]
    assert meta["gpu"]["polygon_pairs"] == 2
    assert meta["gpu"]["candidates"] == meta["cpu"]["candidates"] > 4 * 64
    assert meta["gpu"]["pairs_examined"] == meta["cpu"]["pairs_examined"]


def _comb(teeth: int, base: float = 0.2, top: float = 1.0):
    """A comb: a bar along y = 0..base with ``teeth`` teeth up to ``top``, tooth i over x = i + 0.25 .. i + 0.75."""
    ring = [(0.0, 0.0), (float(teeth), 0.0), (float(teeth), base)]
    for i in range(teeth - 1, -1, -1):
        ring += [(i + 0.75, base), (i + 0.75, top), (i + 0.25, top), (i + 0.25, base)]
    return shapely.Polygon(ring + [(0.0, base)])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_an_edge_cut_many_times_and_one_shared_in_many_pieces_sort_exactly(device, version):
    """The event sort's worst cases: a bar across an 80-tooth comb has 160 split points on each of its long edges
    (over 256 records in the 32 edge slots v3's sort groups together, so one thread orders them), and a square's
    edge shared with 40 collinear edges of the other polygon has 40 overlap records (each placed by its own
    thread). A small pair beside them has a few records; every area equals shapely's."""
    n_teeth = 80
    left = np.array([shapely.box(-1, 0.4, n_teeth + 1, 0.6), shapely.box(200, 0, 210, 10), shapely.box(300, 0, 302, 2)],
                    dtype=object)
    shared = [(200 + 0.25 * i, 0.0) for i in range(41)] + [(210.0, 5.0), (200.0, 5.0)]
    right = np.array([_comb(n_teeth), shapely.Polygon(shared), shapely.box(301, 1, 303, 3)], dtype=object)
    got = assert_matches_shapely(left, right, device, version)
    assert sorted(np.asarray(got[2]).round(9).tolist()) == [1.0, 0.2 * 0.5 * n_teeth, 50.0]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_the_result_is_int32_indices_and_float64_areas_from_the_plan_and_the_api(device, version):
    """As the join's: indices stay under 2^31 (the plan refuses more vertices), so they are int32, 16 bytes a row
    to write and to copy back. The plan's own output is checked, not only the API's."""
    from app.kernel.plan import get_plan_class
    from app.runtime.execute import run_once

    plan = get_plan_class("overlay", version)({"left": 300, "right": 300})
    inp = plan.make_inputs()
    out = run_once(plan, inp, device)
    assert [c.dtype for c in out] == [np.int32, np.int32, np.float64] and len(out[0]) > 0
    assert plan.verify(inp, out)["matches"]
    got = overlay_areas([shapely.box(0, 0, 2, 2)], [shapely.box(1, 1, 3, 3)], device=device, version=version)
    assert [c.dtype for c in got] == [np.int32, np.int32, np.float64] and got[2].tolist() == [1.0]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_cpu_path_in_chunks_of_a_few_edge_tests_gives_the_same_areas(monkeypatch, version):
    """The CPU path works through its (piece or edge, edge) tests a cache-sized chunk at a time; chunks of 37 put
    pairs and pieces on every side of a chunk's end, and change no area."""
    from app.kernel import pip

    plan = OverlayV1({"left": 400, "right": 350, "layout": "shifted", "seed": 9, "vertices": 16})
    inp = plan.make_inputs()
    left, right = inp.left.to_shapely(), inp.right.to_shapely()
    whole = assert_matches_shapely(left, right, "cpu", version)
    monkeypatch.setattr(pip, "CHUNK_EDGE_TESTS", 37)
    chunked = assert_matches_shapely(left, right, "cpu", version)
    assert len(whole[0]) > 100
    for a, b in zip(whole, chunked):
        np.testing.assert_array_equal(a, b)
