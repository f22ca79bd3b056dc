"""lex_order, numpy's 16-bit radix sort a digit at a time, gives np.lexsort's stable order for every kind of
key the numpy paths sort by: cells and pairs (ints, wide and negative too), edge heights and event
parameters (floats, negative, signed zeros, ties), sides (booleans)."""
import numpy as np
import pytest

from app.kernel.sorting import lex_order


@pytest.mark.parametrize("seed", range(6))
def test_lex_order_is_lexsorts_stable_order(seed):
    rng = np.random.default_rng(seed)
    n = 20_000
    ties = np.array([-1.5, -0.0, 0.0, 2.0, 1e-300, -1e300, 3.25])
    y = rng.choice(ties, n) if seed % 2 else rng.standard_normal(n) * 10.0 ** rng.integers(-5, 5, n)
    pair = rng.integers(-7 if seed % 3 == 0 else 0, 70_000 if seed < 3 else 2**40, n)
    side = rng.random(n) < 0.5
    cells = rng.integers(0, 1 << 22, n).astype(np.uint32)
    same = y + 0.0                                   # lexsort orders -0.0 and 0.0 as equal too
    np.testing.assert_array_equal(lex_order(side, y, pair), np.lexsort((side, same, pair)))
    np.testing.assert_array_equal(lex_order(y, pair), np.lexsort((same, pair)))
    np.testing.assert_array_equal(lex_order(cells), np.argsort(cells, kind="stable"))
    np.testing.assert_array_equal(lex_order(np.zeros(n, np.int64)), np.arange(n))     # every digit constant


def test_lex_order_of_nothing_and_of_unsupported_keys():
    assert lex_order(np.zeros(0)).tolist() == []
    with pytest.raises(TypeError, match="complex128"):
        lex_order(np.zeros(3, dtype=complex))
