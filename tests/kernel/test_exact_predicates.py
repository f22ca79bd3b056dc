"""The exact predicates behind the overlay's near-coincident cases and the join's tiny coordinates, against
Fractions: orientation signs at 1e-90 scale, orientation values to an ulp, crossing parameters of nearly collinear
segments, and the classification of a point e0 + t (e1 - e0) on a segment (not of its rounding)."""
from fractions import Fraction as F

import numpy as np
import pytest

from app.kernel.pip import classify, classify_segment_points, edge_table, segment_points
from app.kernel.robust import (orient2d, orient2d_exact_value, orient2d_values, segment_coord_exact,
                               segment_orient_exact)
from app.kernel.segments import PROPER, classify_pairs


def exact_orient(ax, ay, bx, by, cx, cy):
    return (F(ax) - F(cx)) * (F(by) - F(cy)) - (F(ay) - F(cy)) * (F(bx) - F(cx))


def sign(v):
    return (v > 0) - (v < 0)


def near_collinear(n, scale, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (n, 2)) * scale
    b = rng.uniform(-1, 1, (n, 2)) * scale
    c = a + rng.uniform(-0.5, 1.5, n)[:, None] * (b - a)
    c += rng.integers(-2, 3, (n, 2)) * np.spacing(c)
    return a, b, c


@pytest.mark.parametrize("scale", [1e-95, 1e-90, 1e-80, 1.0, 1e90])
def test_orientation_signs_are_exact_at_every_supported_scale(scale):
    """detleft * detright underflowed to zero near 1e-80 and skipped the exact path: 10% wrong at 1e-90."""
    a, b, c = near_collinear(1500, scale, 1)
    got, n_exact = orient2d(a[:, 0], a[:, 1], b[:, 0], b[:, 1], c[:, 0], c[:, 1])
    ref = [sign(exact_orient(*a[i], *b[i], *c[i])) for i in range(len(a))]
    assert n_exact > 0 and got.tolist() == ref


def test_orientation_values_are_within_two_ulps():
    a, b, c = near_collinear(1500, 1e3, 2)
    rng = np.random.default_rng(3)
    c[::2] = rng.uniform(-1e3, 1e3, (750, 2))              # half of them far from collinear
    for f in (orient2d_values, orient2d_exact_value):
        v = f(a[:, 0], a[:, 1], b[:, 0], b[:, 1], c[:, 0], c[:, 1])
        ref = [exact_orient(*a[i], *b[i], *c[i]) for i in range(len(a))]
        for got, want in zip(v.tolist(), ref):
            assert sign(F(got)) == sign(want)
            assert abs(F(got) - want) <= 2 * F(float(np.spacing(abs(got)))) if want else got == 0.0


def test_a_crossing_at_a_tiny_angle_gets_its_parameter_to_a_few_ulps():
    """t_e = O3 / (O3 - O4) from orientation values to an ulp: within a few ulps of the exact crossing where the
    textbook (w x d_f) / (d_e x d_f) lost every digit."""
    rng = np.random.default_rng(4)
    n = 400
    e0 = rng.uniform(0, 1e3, (n, 2)) + 1e6
    e1 = rng.uniform(0, 1e3, (n, 2)) + 1e6
    f0 = e0 + rng.integers(-3, 4, (n, 2)) * np.spacing(e0)
    f1 = e1 + rng.integers(-3, 4, (n, 2)) * np.spacing(e1)
    r = classify_pairs(*e0.T, *e1.T, *f0.T, *f1.T, marks=True)
    proper = np.flatnonzero(r.kind == PROPER)
    assert len(proper) > 50
    for i in proper:
        o3 = exact_orient(*f0[i], *f1[i], *e0[i])
        o4 = exact_orient(*f0[i], *f1[i], *e1[i])
        o1 = exact_orient(*e0[i], *e1[i], *f0[i])
        o2 = exact_orient(*e0[i], *e1[i], *f1[i])
        assert abs(F(r.e_t[i, 0]) - o3 / (o3 - o4)) <= F(2.0 ** -50)
        assert abs(F(r.f_t[i, 0]) - o1 / (o1 - o2)) <= F(2.0 ** -50)


def exact_point_class(px, py, ring):
    """(inside, on the boundary) of the rational point (px, py) against a closed ring."""
    px, py = F(px), F(py)
    inside = False
    for (ax, ay), (bx, by) in zip(ring[:-1], ring[1:]):
        ax, ay, bx, by = map(F, (ax, ay, bx, by))
        o = (ax - px) * (by - py) - (ay - py) * (bx - px)
        if o == 0 and min(ax, bx) <= px <= max(ax, bx) and min(ay, by) <= py <= max(ay, by):
            return False, True
        if (ay > py) != (by > py) and (o > 0) == (by > ay):
            inside = not inside
    return inside, False


def test_points_on_segments_are_classified_exactly_not_their_rounding():
    """Segments within ulps of a triangle's edges, their points at random t: the rounded point is on the wrong
    side of the edge for many of them, the exact classification never is."""
    rng = np.random.default_rng(5)
    tri = np.array([[2.1, 0.4], [-0.7, 2.0], [-1.9, 1.0], [2.1, 0.4]]) + 1e3
    edges = edge_table(tri, np.array([0, 4]), np.array([0, 1]))
    n = 3000
    k = rng.integers(0, 3, n)
    s0, s1 = tri[k], tri[k + 1]
    x0 = s0 + rng.integers(-2, 3, (n, 2)) * np.spacing(s0)
    x1 = s1 + rng.integers(-2, 3, (n, 2)) * np.spacing(s1)
    t = rng.uniform(0, 1, n)
    parity, boundary, n_exact = classify_segment_points(x0[:, 0], x0[:, 1], x1[:, 0], x1[:, 1], t, edges,
                                                        np.zeros(n, dtype=np.int64))
    mx, my, _, _ = segment_points(x0[:, 0], x0[:, 1], x1[:, 0], x1[:, 1], t)
    rounded, rounded_bnd, _, _ = classify(np.c_[mx, my], edges, np.arange(n), np.zeros(n, dtype=np.int64))
    wrong_rounded = 0
    for i in range(n):
        px = F(x0[i, 0]) + F(t[i]) * (F(x1[i, 0]) - F(x0[i, 0]))
        py = F(x0[i, 1]) + F(t[i]) * (F(x1[i, 1]) - F(x0[i, 1]))
        inside, on = exact_point_class(px, py, tri.tolist())
        assert (bool(parity[i] and not boundary[i]), bool(boundary[i])) == (inside, on), i
        wrong_rounded += bool(rounded[i] and not rounded_bnd[i]) != inside
    assert n_exact > 0 and wrong_rounded > 100


def test_the_exact_segment_predicates_agree_with_fractions():
    rng = np.random.default_rng(6)
    a, b, c = near_collinear(600, 1e2, 7)
    t = rng.uniform(0, 1, 600)
    so = segment_orient_exact(c[:, 0], c[:, 1], b[:, 0], b[:, 1], a[:, 0], a[:, 1], b[:, 0], b[:, 1], t)
    sc = segment_coord_exact(c[:, 1], a[:, 1], b[:, 1], t)
    for i in range(600):
        px = F(a[i, 0]) + F(t[i]) * (F(b[i, 0]) - F(a[i, 0]))
        py = F(a[i, 1]) + F(t[i]) * (F(b[i, 1]) - F(a[i, 1]))
        o = (F(c[i, 0]) - px) * (F(b[i, 1]) - py) - (F(c[i, 1]) - py) * (F(b[i, 0]) - px)
        assert so[i] == sign(o) and sc[i] == sign(F(c[i, 1]) - py)
