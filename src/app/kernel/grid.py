"""Quantisation shared by both devices: Morton codes and the uniform grid level.

CPU and GPU compute exactly the same integer codes from the same fp64
operations, so their candidate sets -- and their pairs_examined -- agree.
"""
from __future__ import annotations

import math

import numpy as np

BITS = 16                  # per axis: 32-bit Morton codes
MAX_LEVEL = 11             # 4^11 = 4.2M cells at most: the bucket table stays <= 16 MB


def world_scale(world) -> tuple[float, float, float, float]:
    """(minx, miny, sx, sy): q = floor((x - minx) * sx) maps the world box to [0, 2^16)."""
    minx, miny, maxx, maxy = (float(v) for v in world[:4])
    w, h = max(maxx - minx, 1e-300), max(maxy - miny, 1e-300)
    return minx, miny, (1 << BITS) / w, (1 << BITS) / h


def quantise(x, origin, scale, xp=np):
    q = xp.floor((x - origin) * scale)
    return xp.clip(q, 0, (1 << BITS) - 1).astype(xp.uint32)


def spread_bits(v, xp=np):
    """Interleave zeros between the low 16 bits of v (uint32)."""
    v = v.astype(xp.uint32) & 0x0000FFFF
    v = (v | (v << 8)) & 0x00FF00FF
    v = (v | (v << 4)) & 0x0F0F0F0F
    v = (v | (v << 2)) & 0x33333333
    v = (v | (v << 1)) & 0x55555555
    return v


def morton(qx, qy, xp=np):
    return spread_bits(qx, xp) | (spread_bits(qy, xp) << 1)


def grid_level(world, mean_w: float, mean_h: float, bias: int = 0) -> int:
    """Cells about the size of an average polygon bbox: each point sees ~1 cell of candidates."""
    minx, miny, maxx, maxy = (float(v) for v in world[:4])
    extent = max(maxx - minx, maxy - miny, 1e-300)
    cell = max(mean_w, mean_h, extent / (1 << MAX_LEVEL))
    level = int(math.floor(math.log2(extent / cell))) + bias if cell > 0 else 0
    return int(min(max(level, 1), MAX_LEVEL))
