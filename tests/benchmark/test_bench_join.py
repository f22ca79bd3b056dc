"""bench_join.time_plan: the build and the stages after it from marked runs, end to end from bare ones."""
import numpy as np
import pytest

from app.kernel.plan import get_plan_class
from tests.benchmark import bench_join


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_end_to_end_is_timed_on_bare_runs_and_their_result_is_checked(device):
    plan = get_plan_class("join", "v4")({"points": 3000, "polygons": 300, "vertices": 16})
    inputs = plan.make_inputs()
    _, ref = bench_join.time_shapely(inputs, 1)
    r = bench_join.time_plan(plan, inputs, device, 6)
    # A bare run records two marks, the run's first and last: a marked run of this plan records one a stage more.
    assert r["e2e_marks"] == [2]
    assert r["build"] > 0 and r["after"] > 0 and r["e2e"] > 0
    lo, hi = r["e2e_ci"]
    assert lo <= r["e2e"] <= hi
    # After the build once more, from runs with one mark at the build's end: a time of the same stages, inside
    # the run's total, with its interval.
    lo, hi = r["after_one_mark_ci"]
    assert 0 < lo <= r["after_one_mark"] <= hi and r["after_one_mark"] < r["total"] + r["e2e"]
    # The result returned is the last bare run's, equal to shapely's.
    assert all(np.array_equal(a, b) for a, b in zip(r["out"], ref))
    if device == "gpu":
        assert all(np.array_equal(a, b) for a, b in zip(r["out_pinned"], ref))
    # The host's pace before each round: the loop's median, and on a GPU an empty kernel's launch.
    assert 1e-6 < r["host_loop"] < 1e-2
    assert (r["launch_pace"] is None) == (device == "cpu")
    if device == "gpu":
        assert 1e-7 < r["launch_pace"] < 1e-3 and "a launch" in bench_join.pace_text(r)
