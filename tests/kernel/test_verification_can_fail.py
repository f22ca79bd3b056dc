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


@pytest.mark.parametrize("malform", ["a column fewer", "a column more", "two-dimensional", "float indices",
                                     "ragged", "index past the end", "negative index"])
def test_a_malformed_answer_is_a_mismatch_with_its_problem_not_a_check_that_could_not_run(case, malform):
    """A kernel that hands back the wrong shape gave a wrong answer (exit 9, 'does not match', the problem named);
    it must not read as a check that failed to run (exit 10)."""
    plan, inputs, out = case
    out = [np.array(a, copy=True) for a in out]
    if malform == "a column fewer":
        out = out[:-1]
    elif malform == "a column more":
        out = out + [out[0]]
    elif malform == "two-dimensional":
        out[0] = np.stack([out[0], out[0]], axis=1)
    elif malform == "float indices":
        out[1] = out[1].astype(np.float64)
    elif malform == "ragged":
        out[1] = out[1][:-1]
    elif malform == "index past the end":
        out[1][-1] = 10**6
    else:
        out[0][0] = -1
    v = plan.verify(inputs, tuple(out))
    assert v["matches"] is False and v["problem"], v
    from app.analysis.baseline import what_differs
    assert what_differs(v).startswith(f"not a valid answer ({v['problem']})")
