"""overlay v1: polygon layer A x layer B -> intersection area of every overlapping pair."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.kernel import datagen
from app.kernel.geometry import PolygonBuffers
from app.kernel.plan import Cost, Footprint, KernelPlan, Param, StageSpec, register, set_default
from app.kernel.robust import ORIENT_FILTER_FLOPS

LAYOUTS = ("random", "shifted", "self", "grid")
SHOELACE_FLOPS = 8     # an edge's term of a ring's doubled area about its first vertex
# refine_pairs, as its SASS executes it (ncu counted exactly these totals on an H200 for v2 and v3 at 2k x 2k:
# 2,512,978 FLOPs, 19,271 pairs, 7,810 proper crossings). A candidate pair: four orientation filters and the two
# differences that choose the axis its overlap is measured on. A proper crossing: its parameter on both segments,
# each two double-double orientation values (49 FLOPs each: four error-free differences, two error-free products,
# their error-free difference, the rounding bound and the tails), their difference and a division (15: a
# reciprocal refined by FMAs), 114 in all (overlay_exact.cu's crossing_param).
REFINE_PAIR_FLOPS = 4 * ORIENT_FILTER_FLOPS + 2
CROSSING_FLOPS = 2 * 114
BLOCK_SIZES = (256, 128, 512)


@dataclass(frozen=True)
class OverlayInputs:
    left: PolygonBuffers
    right: PolygonBuffers


PARAMS = (
    Param("left", int, 10_000, "polygons in layer A", minimum=1),
    Param("right", int, 10_000, "polygons in layer B", minimum=1),
    Param("vertices", int, 16, "shell vertices per polygon (random/shifted/self layouts)", minimum=3),
    Param("layout", str, "random", "random: two layers; shifted: B = A moved by a third of a polygon; "
                                   "self: B = A; grid: unit squares vs grid-aligned rectangles/L-shapes",
          choices=LAYOUTS),
    Param("seed", int, 0, "random seed of the generator", minimum=0),
)

STAGES = (
    StageSpec("owned_buffer_build", "setup", "copy both layers' coordinates and offsets into owned buffers"),
    StageSpec("segment_extraction", "setup", "edge table and bbox per polygon, both layers", {"block": BLOCK_SIZES}),
    StageSpec("segment_mbr_filter", "filter", "grid bbox join of polygon pairs, then every near edge pair "
                                               "of each polygon pair (brute force) tested by MBR",
              {"block": BLOCK_SIZES, "level_bias": (0, -1, 1)}),
    StageSpec("exact_intersection_refine", "refine", "robust disjoint/proper/touch/collinear-overlap "
                                                     "classification, split points on both segments",
              {"block": BLOCK_SIZES}),
    StageSpec("reconstruction_event_sort", "sort", "split points ordered along each edge of each pair",
              {"block": BLOCK_SIZES}),
    StageSpec("area_reconstruction", "emit", "pieces inside the other polygon (or shared, same direction) "
                                             "summed with the shoelace formula per pair", {"block": BLOCK_SIZES}),
)


class OverlayPlan(KernelPlan):
    kernel = "overlay"
    params_spec = PARAMS
    stages = STAGES

    def footprint(self) -> Footprint:
        # Per vertex of either layer: coordinates, segments with their boxes, candidate segment pairs,
        # split events and ring pieces on the device; a shapely copy and the oracle's intersections on
        # the host.
        p = self.params
        verts = (p["left"] + p["right"]) * (p["vertices"] + 1)
        return Footprint(host_bytes=600 * verts, device_bytes=400 * verts,
                         scale="left" if p["left"] >= p["right"] else "right",
                         indices={"segments": verts})

    def make_inputs(self) -> OverlayInputs:
        p = self.params
        if p["layout"] == "grid":
            left = datagen.make_grid_squares(p["left"])
            side = int(np.ceil(np.sqrt(p["left"])))
            return OverlayInputs(left, datagen.make_grid_aligned(p["right"], side, p["seed"]))
        left = datagen.make_polygons(p["left"], p["vertices"], p["seed"])
        if p["layout"] == "self":
            return OverlayInputs(left, left)
        if p["layout"] == "shifted":
            r = datagen.EXTENT * np.sqrt(0.5 / (p["left"] * np.pi))
            return OverlayInputs(left, datagen.shifted(left, r / 3, r / 5))
        return OverlayInputs(left, datagen.make_polygons(p["right"], p["vertices"], p["seed"] + 1_000_003))

    def backend(self, device: str):
        if device == "gpu":
            from app.kernel.overlay.gpu import OverlayGPU

            return OverlayGPU(self.tiling, self.version)
        from app.kernel.overlay.cpu import OverlayCPU

        return OverlayCPU(self.cpu_stages_of or self.version)

    def cost(self, stage: str, rows_in: int, rows_out: int, meta: dict, inputs: OverlayInputs) -> Cost:
        va, vb = inputs.left.n_coords, inputs.right.n_coords
        g = inputs.left.n_geoms + inputs.right.n_geoms
        if stage == "owned_buffer_build":
            return Cost(inputs.left.nbytes() + inputs.right.nbytes(), kind="host_link", note="host->device copy")
        if stage == "segment_extraction":
            # Each edge's shoelace term as written, (a.x - o.x) * (b.y - o.y) - (b.x - o.x) * (a.y - o.y) added to
            # the ring's sum: 6 add/sub, 2 mul. ncu counts 7.1 an edge in polygon_tables at 2k x 2k (the compiler
            # shares a difference between neighbouring edges): the model is 1.12x its count.
            rings = inputs.left.n_rings + inputs.right.n_rings
            edges = va + vb - rings
            return Cost((va + vb) * 16 + rings * (4 + 40) + g * (4 + 32), edges * SHOELACE_FLOPS,
                        note="read coordinates and offsets; write each ring's area and box and each polygon's bbox; "
                             f"{SHOELACE_FLOPS} flops an edge (its shoelace term)")
        if stage == "segment_mbr_filter":
            # The edge-pair filter reads both polygons' coordinates for every polygon pair (6.9 MB of DRAM reads in
            # edge_pairs_warp at 10k x 10k on an H200, against 6.55 MB of coordinates).
            pairs = meta.get("polygon_pairs", 0)
            return Cost(g * 32 + pairs * 8 + rows_out * 12 + _pair_coords(pairs, inputs) * 16,
                        note="bboxes, polygon pairs, each pair's coordinates (each at most once), candidate segment "
                             "pairs out")
        if stage == "exact_intersection_refine":
            # A crossing's parameters are most of the FLOPs: at 2k x 2k the filters alone were 0.28 of ncu's count.
            proper = meta.get("proper", 0)
            return Cost(rows_in * (12 + 64) + rows_out * 12, rows_in * REFINE_PAIR_FLOPS + proper * CROSSING_FLOPS,
                        note=f"pair ids and both segments in, split events out; {REFINE_PAIR_FLOPS} flops a pair "
                             f"(4 orientation filters, the axis choice), {CROSSING_FLOPS} a proper crossing (its "
                             "parameter on both segments from double-double orientations)")
        if stage == "reconstruction_event_sort":
            return Cost(rows_in * 12 * 2, note="one read+write pass over the events")
        if stage == "area_reconstruction":
            # rows_in is the polygon pairs on both backends (neither reports the pairs' edge slots in this stage's
            # metadata). Each pair's rings are cut along their edges or tested whole: their coordinates and ring
            # tables (offsets, doubled area, box: 44 bytes a ring) are read, each at most once.
            rings = inputs.left.n_rings + inputs.right.n_rings
            return Cost(_pair_coords(rows_in, inputs) * 16 + rings * 44 + rows_in * 8
                        + meta.get("pip_tests", 0) * 16 + rows_out * 16,
                        meta.get("pip_tests", 0) * 17 * 7,
                        note="each pair's coordinates (each at most once) and ring tables, pair ids, fragment "
                             "midpoints, areas out; ~17 edge tests per midpoint")
        raise KeyError(stage)

    def verify(self, inputs: OverlayInputs, output) -> dict:
        from app.kernel.overlay.oracle import compare, layer_measures, shapely_overlay

        left, right = inputs.left.to_shapely(), inputs.right.to_shapely()
        exp = shapely_overlay(left, right)
        res = compare(tuple(np.asarray(a) for a in output), exp, layer_measures(left), layer_measures(right))
        res["oracle"] = f"shapely.intersection(a, b).area ({res['tolerance']})"
        return res


def _pair_coords(pairs: int, inputs: OverlayInputs) -> float:
    """The coordinates a stage reads for ``pairs`` polygon pairs, each once: the pairs' own (a mean polygon of
    each layer a pair), but no more than both layers hold. At 10k x 10k the pairs' own are 2.2x the layers'
    (each polygon is in about two pairs; the kernels find the repeats in L2), so the layers' bound it."""
    left, right = inputs.left, inputs.right
    mean = left.n_coords / max(left.n_geoms, 1) + right.n_coords / max(right.n_geoms, 1)
    return min(pairs * mean, left.n_coords + right.n_coords)


@register
class OverlayV1(OverlayPlan):
    version = "v1"
    summary = "brute-force segment-MBR filter: every near edge of a x every near edge of b, per polygon pair"


@register
class OverlayV2(OverlayPlan):
    version = "v2"
    summary = ("sort-and-sweep segment-MBR filter: per polygon pair, b's near edges sorted by lowest y; "
               "each near edge of a tests only the prefix that can reach it")


@register
class OverlayV3(OverlayPlan):
    version = "v3"
    summary = ("v1's candidates found in one pass (half a warp per polygon pair, b's edges broadcast by shuffles), no "
               "size read before the result (polygon pairs, candidates and edge slots in rooms kept from run to run), "
               "and each cut ring's inside/outside status carried along it (flipped at proper crossings) instead of "
               "a point-in-polygon test per piece (on the CPU: v1's candidates, the status carried the same way)")


@register
class OverlayV4(OverlayV3):
    version = "v4"
    summary = ("v3 with the filter's first eight launches -- B bucketed by cell, the polygon pairs counted, placed "
               "and sorted, their edge slots scanned -- one cooperative launch, whose grid waits at barriers between "
               "the steps: the filter issues two launches where v3 issues nine (on the CPU it runs v3's stages)")
    cpu_stages_of = "v3"


set_default("overlay", "v4", "the fastest at the default sizes on an NVIDIA H200, the versions interleaved in one "
                             "process with L2 flushed (python -m tests.benchmark.bench_ab overlay --versions v3,v4, "
                             "300 rounds): after the build 0.490 ms against v3's 0.547 (v3 1.12x [1.10-1.13] of v4's "
                             "time), end to end 1.012 against 1.067 ms (1.05x [1.03-1.07]); at 100k x 100k (30 rounds) "
                             "1.009 against 1.025 ms after the build (1.02x [1.01-1.02]), end to end a tie. v3 was "
                             "measured the same way against v1 and v2: 0.650 against 1.048 and 1.061 ms after the build")
