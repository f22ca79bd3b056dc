"""overlay v3 on the CPU: each cut ring's inside/outside status carried along it (cpu._walk), as the GPU's
area_cut_rings walks it, instead of a point-in-polygon test per piece."""
import numpy as np

from app.kernel.overlay.cpu import TRUST_T, _walk
from app.kernel.plan import get_plan_class
from app.runtime.device import select
from app.runtime.execute import backend_for, xp_for
from app.runtime.nvtx import Nvtx
from app.runtime.recorder import Recorder


def walk(pieces, records, answers, shared=()):
    """pieces: (ring, row, t0, t1); records: (row, t, proper crossing?); answers: piece -> (inside, on the
    boundary, in the box) for the tests of the pieces' middle points. Returns (keep, tests, the pieces tested)."""
    ring, r, t0, t1 = (np.array(c) for c in zip(*pieces))
    ring_of_row = np.zeros(r.max() + 1, dtype=np.int64)
    ring_of_row[r] = ring
    # Each record comes before the first piece of its row that starts at or after its t, else before the
    # first piece of a later row (the walk meets it between those two pieces).
    before = np.array([next((q for q in range(len(r)) if r[q] > row or (r[q] == row and t0[q] >= t)), len(r))
                       for row, t, _ in records], dtype=np.int64)
    flip = np.array([f for *_, f in records], dtype=bool)
    asked = []

    def classify_piece_middles(q):
        asked.extend(q.tolist())
        inside, bnd, box = (np.array([answers[i][k] for i in q], dtype=bool) for k in range(3))
        return inside, bnd, box

    is_shared = np.isin(np.arange(len(r)), list(shared))
    keep = np.zeros(len(r), dtype=bool)
    keep, tests = _walk(r, t0.astype(float), t1.astype(float), is_shared, keep, ring_of_row, before, flip,
                        classify_piece_middles)
    return keep.tolist(), tests, sorted(asked)


def test_proper_crossings_flip_the_status_and_touches_make_it_unknown():
    # One ring of three edges (rows 0-2). Row 0 is cut at t = .5 by a proper crossing, row 1 has a touch
    # mark at its start (t = 0), row 2 a proper crossing at t = 1 (the next edge's start: none here).
    pieces = [(0, 0, 0, .5), (0, 0, .5, 1), (0, 1, 0, 1), (0, 2, 0, 1)]
    records = [(0, .5, True), (1, 0.0, False), (2, 1.0, True)]
    answers = {0: (True, False, True), 2: (False, False, True)}
    keep, tests, asked = walk(pieces, records, answers)
    # Tested: the ring's first piece, and the first after the touch; the piece after the crossing flips.
    assert asked == [0, 2] and tests == 2
    assert keep == [True, False, False, False]


def test_an_untrusted_test_leaves_the_next_piece_unknown():
    # A touch at t = .5 makes piece 1 unknown. It is shorter than TRUST_T of its edge: its answer holds for
    # itself but is not carried, so piece 2 is tested too (carried, it would have been flipped from piece 1).
    pieces = [(0, 0, 0, .5), (0, 0, .5, .5 + TRUST_T / 2), (0, 0, .5 + TRUST_T / 2, 1), (0, 1, 0, 1)]
    records = [(0, .5, False), (0, .5 + TRUST_T / 2, True)]
    answers = {0: (False, False, True), 1: (True, False, True), 2: (True, False, True)}
    keep, tests, asked = walk(pieces, records, answers)
    assert asked == [0, 1, 2] and keep == [False, True, True, True]
    # A midpoint on the other boundary is not carried either (a piece on the boundary is not kept).
    pieces = [(0, 0, 0, .5), (0, 0, .5, 1), (0, 1, 0, 1)]
    answers = {0: (False, False, True), 1: (False, True, True), 2: (True, False, True)}
    keep, tests, asked = walk(pieces, [(0, .5, False)], answers)
    assert asked == [0, 1, 2] and keep == [False, False, True]


def test_outside_the_box_is_trusted_and_costs_no_test_and_shared_pieces_reset():
    # Ring 0: its first piece's midpoint is outside the other polygon's box (no edge loop: no test counted).
    # Ring 1: a shared piece first (its keep comes from the overlap records), then the status is unknown.
    pieces = [(0, 0, 0, .5), (0, 0, .5, 1), (1, 1, 0, .5), (1, 1, .5, 1), (1, 2, 0, 1)]
    records = [(0, .5, True), (1, .5, False)]
    answers = {0: (False, False, False), 3: (True, False, True)}
    keep, tests, asked = walk(pieces, records, answers, shared=(2,))
    assert asked == [0, 3] and tests == 1
    assert keep == [False, True, False, True, True]      # ring 0 flips into the polygon; ring 1 stays inside


def test_v3_on_the_cpu_tests_few_pieces_and_matches_v1_exactly():
    """The same areas as v1 (which tests every piece) on shared borders, with far fewer point tests."""
    out, meta = {}, {}
    for version in ("v1", "v3"):
        plan = get_plan_class("overlay", version)({"left": 400, "right": 400, "layout": "shifted", "seed": 3})
        inputs = plan.make_inputs()
        backend, _ = backend_for(plan, select("cpu"))
        out[version], record = Recorder("cpu", xp_for("cpu"), Nvtx(False, "overlay")).run(plan, inputs, backend)
        meta[version] = {s["name"]: s["meta"] for s in record.stages}
        assert plan.verify(inputs, out[version])["matches"]
    for a, b in zip(out["v1"], out["v3"]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)
    assert meta["v3"]["area_reconstruction"]["pip_tests"] * 10 < meta["v1"]["area_reconstruction"]["pip_tests"]
    assert meta["v3"]["exact_intersection_refine"]["end_marks"] >= 0
