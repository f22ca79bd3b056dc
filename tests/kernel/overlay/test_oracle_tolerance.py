"""The overlay's verification tolerance (oracle.RULE): 1e-9 of the smaller polygon's area, never below rounding's
floor (16 ulps of the pair's largest |coordinate| times the smaller perimeter); a pair only one side reports is a
mismatch above that floor. Scaled by the larger polygon's area, as it was, the tolerance beside a 40 km square
(1.6 m^2) let a 1 m^2 square inside it be reported at one and a half times its area, and a 0.25 m^2 square inside it
go missing altogether: the cases below."""
import numpy as np
import pytest
import shapely

from app.kernel.overlay import overlay_areas
from app.kernel.overlay.oracle import FLOOR_ULPS, RULE, compare, layer_measures, pair_tolerances, shapely_overlay
from app.kernel.plan import get_plan_class
from app.runtime.execute import run_once

BIG = np.array([shapely.box(0, 0, 40_000, 40_000)], dtype=object)                     # 40 km x 40 km (m)
SMALL = np.array([shapely.box(100, 100, 101, 101), shapely.box(200, 200, 200.5, 200.5)], dtype=object)


def verdict(got):
    return compare(got, shapely_overlay(BIG, SMALL), layer_measures(BIG), layer_measures(SMALL))


def test_the_right_answer_passes_and_the_record_states_the_rule():
    res = verdict(overlay_areas(BIG, SMALL, device="cpu"))
    assert res["matches"] and res["tolerance"] == RULE
    assert "smaller polygon's area" in RULE and "perimeter" in RULE and "only one side reports" in RULE


@pytest.mark.parametrize("tamper", ["one and a half", "a millionth off", "dropped", "extra"])
def test_a_wrong_small_pair_beside_a_large_polygon_is_caught(tamper):
    a, b, area = (np.array(x) for x in overlay_areas(BIG, SMALL, device="cpu"))
    if tamper == "one and a half":
        area[0] *= 1.5
    elif tamper == "a millionth off":
        area[1] *= 1 + 1e-6
    elif tamper == "dropped":
        a, b, area = a[:1], b[:1], area[:1]
    else:                                          # a pair of polygons that do not meet, reported with 1e-6 m^2
        far = np.array([shapely.box(50_000, 0, 50_001, 1)], dtype=object)
        small = np.concatenate([SMALL, far])
        res = compare((np.r_[a, 0], np.r_[b, 2], np.r_[area, 1e-6]), shapely_overlay(BIG, small),
                      layer_measures(BIG), layer_measures(small))
        assert not res["matches"] and res["worst"][0][0] == (0, 2)
        return
    res = verdict((a, b, area))
    assert not res["matches"], res
    assert res["mismatched_pairs"] == 1


def test_the_floor_is_rounding_and_forgives_only_below_it():
    """A difference of a few ulps of the coordinates times the perimeter passes (rounding of intersection points
    alone makes it); a pair one side misses is forgiven only while its area is below the floor."""
    ml, mr = layer_measures(BIG), layer_measures(SMALL)
    both, one = pair_tolerances([0, 0], [0, 1], ml, mr)
    floor = FLOOR_ULPS * np.spacing(40_000.0) * np.array([4.0, 2.0])
    np.testing.assert_allclose(one, floor)
    np.testing.assert_allclose(both, np.maximum(1e-9 * np.array([1.0, 0.25]), floor))
    exp = shapely_overlay(BIG, SMALL)
    near = (exp[0], exp[1], exp[2] + 0.5 * both)
    assert compare(near, exp, ml, mr)["matches"]
    assert not compare((exp[0], exp[1], exp[2] + 2 * both), exp, ml, mr)["matches"]
    # A sliver below the floor that only shapely reports is forgiven; one above it is not.
    for area, ok in ((0.5 * one[1], True), (2 * one[1], False)):
        e = (np.r_[exp[0], 0], np.r_[exp[1], 1], np.r_[exp[2][:1], area])
        assert compare((exp[0][:1], exp[1][:1], exp[2][:1]), e, ml, mr)["matches"] is ok


def test_areas_only_still_judge_by_the_smaller_polygon():
    """Callers that give only the polygons' areas (no perimeters or coordinates) get the relative rule without
    the floor, and the record says so."""
    exp = shapely_overlay(BIG, SMALL)
    res = compare((exp[0][:1], exp[1][:1], exp[2][:1] * 1.5), exp, shapely.area(BIG), shapely.area(SMALL))
    assert not res["matches"] and res["mismatched_pairs"] == 2 and "no absolute floor" in res["tolerance"]


def test_the_plans_verification_names_the_rule():
    plan = get_plan_class("overlay", "v3")({"left": 200, "right": 200})
    inp = plan.make_inputs()
    res = plan.verify(inp, run_once(plan, inp, "cpu"))
    assert res["matches"] and res["tolerance"] == RULE and RULE in res["oracle"]
