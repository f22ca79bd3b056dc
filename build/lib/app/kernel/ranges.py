"""Vectorised range expansion shared by the numpy paths."""
from __future__ import annotations

import numpy as np


def expand(starts: np.ndarray, lens: np.ndarray):
    """(owner, index) for every element of the ranges [starts[i], starts[i] + lens[i])."""
    lens = np.asarray(lens, dtype=np.int64)
    owner = np.repeat(np.arange(len(lens)), lens)
    first = np.cumsum(lens) - lens
    return owner, np.arange(len(owner)) + np.repeat(np.asarray(starts, dtype=np.int64) - first, lens)
