from fractions import Fraction

import numpy as np
import pytest

from app.kernel.robust import orient2d, orient2d_exact


def exact_sign(ax, ay, bx, by, cx, cy):
    f = Fraction
    d = (f(ax) - f(cx)) * (f(by) - f(cy)) - (f(ay) - f(cy)) * (f(bx) - f(cx))
    return (d > 0) - (d < 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_near_degenerate_points_get_the_exact_sign(seed):
    rng = np.random.default_rng(seed)
    n = 3000
    a = rng.uniform(0, 1000, (n, 2))
    b = rng.uniform(0, 1000, (n, 2))
    t = rng.uniform(-0.5, 1.5, n)
    c = a + t[:, None] * (b - a)
    c += rng.integers(-2, 3, (n, 2)) * np.spacing(c)   # a few ulps off the line
    sign, n_exact = orient2d(a[:, 0], a[:, 1], b[:, 0], b[:, 1], c[:, 0], c[:, 1])
    ref = np.array([exact_sign(*a[i], *b[i], *c[i]) for i in range(n)])
    assert n_exact > 0                       # the filter really handed cases to the exact path
    np.testing.assert_array_equal(sign, ref)


def test_exactly_collinear_and_classic_failure_cases():
    # Points on a line through fp64 values whose naive determinant is wrong or zero.
    ax = np.array([0.5, 12.0, 0.0, 1e-3])
    ay = np.array([0.5, 12.0, 0.0, 1e-3])
    bx = np.array([12.0, 24.0, 3.0, 7.0])
    by = np.array([12.0, 24.0, 1.0, 7.0])
    cx = np.array([24.0, 0.5 + 2 ** -48, 6.0, 3.0])
    cy = np.array([24.0, 0.5, 2.0, 3.0])
    sign, _ = orient2d(ax, ay, bx, by, cx, cy)
    assert sign.tolist() == [exact_sign(*v) for v in zip(ax, ay, bx, by, cx, cy)]
    assert sign[0] == 0 and sign[2] == 0


def test_exact_path_alone_matches_fractions():
    rng = np.random.default_rng(7)
    v = rng.uniform(-1e6, 1e6, (500, 6))
    s = orient2d_exact(*(v[:, i] for i in range(6)))
    assert s.tolist() == [exact_sign(*row) for row in v]
