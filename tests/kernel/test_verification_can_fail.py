"""The oracle check says "mismatch" when the output is wrong, and the CLI exits 9 keeping the profile."""
import numpy as np
import pytest

from app.kernel.plan import get_plan_class
from app.runtime.execute import run_once


@pytest.fixture(scope="module", params=["join", "overlay"])
def case(request):
    small = {"join": {"points": 2000, "polygons": 200}, "overlay": {"left": 200, "right": 200}}[request.param]
    plan = get_plan_class(request.param, None)(small)
    inputs = plan.make_inputs()
    return plan, inputs, run_once(plan, inputs, "cpu")


def test_the_right_answer_matches(case):
    plan, inputs, out = case
    assert plan.verify(inputs, out)["matches"]


@pytest.mark.parametrize("tamper", ["drop", "duplicate", "shift", "perturb"])
def test_every_kind_of_wrong_answer_is_caught(case, tamper):
    plan, inputs, out = case
    out = [np.array(a, copy=True) for a in out]
    if tamper == "drop":
        out = [a[1:] for a in out]
    elif tamper == "duplicate":
        out = [np.concatenate([a[:1], a]) for a in out]
    elif tamper == "shift":
        out[1] = out[1] + 1
    elif plan.kernel == "overlay":
        out[2][len(out[2]) // 2] *= 1 + 1e-6          # one area off by a millionth
    else:
        out[0][-1] = out[0][-1] + 1
    assert plan.verify(inputs, tuple(out))["matches"] is False


def test_points_handed_to_the_kernels_are_finite():
    from app.kernel.geometry import points_from_any

    xy, kept = points_from_any(np.array([[0.5, 0.5], [np.nan, 1], [2, np.inf], [3, 3]]))
    assert np.isfinite(xy).all() and xy.tolist() == [[0.5, 0.5], [3, 3]] and kept.tolist() == [0, 3]
