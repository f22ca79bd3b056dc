"""join v1: points x polygons with a Morton-ordered uniform-grid filter."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from app.kernel import datagen, grid
from app.kernel.geometry import PolygonBuffers
from app.kernel.plan import Cost, Footprint, KernelPlan, Param, StageSpec, columns_problem, register, set_default
from app.kernel.robust import ORIENT_FILTER_FLOPS

PREDICATES = ("within", "intersects")
BLOCK_SIZES = (256, 128, 512)


@dataclass(frozen=True)
class JoinInputs:
    points: np.ndarray          # (N, 2) float64
    polygons: PolygonBuffers
    predicate: str


PARAMS = (
    Param("points", int, 100_000, "number of points", minimum=0),
    Param("polygons", int, 10_000, "number of polygons", minimum=1),
    Param("vertices", int, 16, "shell vertices per polygon", minimum=3),
    Param("predicate", str, "within", "within (strict interior) or intersects (boundary counts)",
          choices=PREDICATES),
    Param("layout", str, "uniform", "point layout", choices=("uniform", "clustered")),
    Param("seed", int, 0, "random seed of the generator", minimum=0),
)

STAGES = (
    StageSpec("owned_buffer_build", "setup", "copy points, coordinates and offsets into owned (device) buffers"),
    StageSpec("bounds", "setup", "per-polygon bbox and the world box", {"block": BLOCK_SIZES}),
    StageSpec("morton_sort", "sort", "counting sort of points into level-k Morton grid cells",
              {"block": BLOCK_SIZES, "level_bias": (0, -1, 1)}),
    StageSpec("candidate_filter", "filter", "each polygon tests the points of the grid cells its bbox covers",
              {"block": BLOCK_SIZES}),
    StageSpec("predicate_refine", "refine", "crossing-number point-in-polygon, exact orientation fallback",
              {"block": (256, 128)}),   # refine is compiled with __launch_bounds__(256, 4)
    StageSpec("output_sort", "sort", "pairs sorted by point, then polygon", {"block": BLOCK_SIZES}),
)


@register
class JoinV1(KernelPlan):
    kernel = "join"
    version = "v1"
    summary = "grid-binned filter: points bucketed by Morton cell, each polygon scans the cells its bbox covers"
    params_spec = PARAMS
    stages = STAGES

    def footprint(self) -> Footprint:
        # Per point: 16 B of coordinates, Morton keys, orders and candidate pairs on the device, plus
        # shapely Points and query results for the oracle on the host (about 150 B). Per vertex: 16 B of
        # coordinates and a shapely copy. Measured peaks stay under these (1M x 100k: ~0.3 GB host).
        # The GPU plan's pinned staging buffers hold one more host copy of the inputs (16 B a point or vertex).
        p = self.params
        n, coords = p["points"], p["polygons"] * (p["vertices"] + 1)
        return Footprint(host_bytes=236 * n + 96 * coords + 400 * p["polygons"],
                         device_bytes=160 * n + 48 * coords + 96 * p["polygons"],
                         scale="points" if n >= coords else "polygons",
                         indices={"points": n, "polygon vertices": coords})

    def make_inputs(self) -> JoinInputs:
        p = self.params
        polys = datagen.make_polygons(p["polygons"], p["vertices"], p["seed"])
        pts = datagen.make_points(p["points"], p["seed"], layout=p["layout"], polygons=polys)
        return JoinInputs(pts, polys, p["predicate"])

    def backend(self, device: str):
        if device == "gpu":
            from app.kernel.join.gpu import JoinGPU

            return JoinGPU(self.tiling, self.version)
        from app.kernel.join.cpu import JoinCPU

        return JoinCPU(self.version)

    def cost(self, stage: str, rows_in: int, rows_out: int, meta: dict, inputs: JoinInputs) -> Cost:
        """Minimum bytes each stage must move through device memory, and its fp64 flops."""
        n, g = len(inputs.points), inputs.polygons.n_geoms
        v = inputs.polygons.n_coords
        if stage == "owned_buffer_build":
            return Cost(n * 16 + inputs.polygons.nbytes(), kind="host_link", note="host->device copy")
        if stage == "bounds":
            return Cost(v * 16 + n * 16 + g * 32, note="read coords and points once, write bboxes")
        if stage == "morton_sort":
            # v4 and v5 also write the coordinates in bucketed order (16 B a point), which the filter reads.
            return Cost(n * 16 + n * 4 + 4 * meta.get("grid_cells", 0) * 2 + 16 * meta.get("bucketed_coordinates", 0),
                        note="read points, write the bucketed order (v4, v5: and the coordinates in it), count and "
                             "scan the cell table")
        if stage == "candidate_filter":
            e = meta.get("grid_entries", 0)
            return Cost(g * 32 + n * 20 + e * 4 * 3 + rows_out * 8,
                        note="bboxes, each bucketed point and its coordinates once, cell lists (v2), pairs out")
        if stage == "predicate_refine":
            # FLOPs from the edges an orientation test ran on (those whose y-range holds the point), not every
            # edge scanned: at 20k x 2k 24,452 of 231,064, and ncu measured 9 x 24,452 fp64 operations.
            tests = meta.get("orientation_tests", 0)
            return Cost(rows_in * 8 + v * 16 + n * 16 + rows_out * 12, tests * ORIENT_FILTER_FLOPS,
                        note="pairs in, every coordinate and point once, hits and their ranks by point out; "
                             f"{ORIENT_FILTER_FLOPS} flops an orientation test (edges level with the point)")
        if stage == "output_sort":
            return Cost(rows_in * (8 + 4 + 8) + n * 12,
                        note="read hit keys and ranks, write two int32 columns, scan per-point counts")
        raise KeyError(stage)

    def verify(self, inputs: JoinInputs, output) -> dict:
        from app.kernel.join.oracle import shapely_join

        exp_pt, exp_poly = shapely_join(inputs.points, inputs.polygons, inputs.predicate)
        problem = _shape_problem(output, len(inputs.points), inputs.polygons.n_geoms)
        if problem:         # a malformed answer is a wrong one (exit 9), not a check that could not run
            first = np.asarray(output[0]) if len(output) else np.zeros(0)
            return {"oracle": "shapely.STRtree.query", "matches": False, "problem": problem,
                    "pairs": len(first) if first.ndim else 0, "expected_pairs": int(len(exp_pt))}
        got_pt, got_poly = (np.asarray(a) for a in output)
        same = np.array_equal(exp_pt, got_pt) and np.array_equal(exp_poly, got_poly)
        result = {"oracle": "shapely.STRtree.query", "matches": bool(same),
                  "pairs": int(len(got_pt)), "expected_pairs": int(len(exp_pt))}
        if not same:
            got = set(zip(got_pt.tolist(), got_poly.tolist()))
            exp = set(zip(exp_pt.tolist(), exp_poly.tolist()))
            result["missing"] = sorted(exp - got)[:5]
            result["extra"] = sorted(got - exp)[:5]
        return result


def _shape_problem(output, n_points: int, n_polygons: int) -> str | None:
    """What makes ``output`` no answer of the join's form before any pair is compared: not two columns (point,
    polygon), a column not a 1-D array of integers, columns of different lengths, an index out of range."""
    problem, cols = columns_problem(output, {"point": "iu", "polygon": "iu"})
    if problem:
        return problem
    if len(cols[0]) != len(cols[1]):
        return f"columns of different lengths ({len(cols[0])}, {len(cols[1])})"
    for name, col, n in (("point", cols[0], n_points), ("polygon", cols[1], n_polygons)):
        if len(col) and (col.min() < 0 or col.max() >= n):
            return f"a {name} index out of range (0 to {n - 1:,})"
    return None


@register
class JoinV2(JoinV1):
    version = "v2"
    summary = ("cell-list filter: polygons listed in every grid cell their bbox covers, each point "
               "(Morton-bucketed) tests its own cell's list -- point-major, one more size read")



@register
class JoinV3(JoinV1):
    version = "v3"
    summary = ("v1 with no host read before the end: grid chosen on the device, candidate buffers with a room "
               "kept from run to run, one read sizes the result -- launches queue without a stall and the "
               "stages after the build replay as one CUDA graph (on the CPU it runs v1's stages)")
    cpu_stages_of = "v1"

    def footprint(self) -> Footprint:
        # On top of v1: the cell table for the largest grid level (grid.MAX_TABLE int32), and candidate room for
        # 2 pairs a point at first (36 B a pair: the pair, its hit key, slot and the two output columns).
        base = super().footprint()
        return replace(base, device_bytes=base.device_bytes + 4 * grid.MAX_TABLE + 72 * self.params["points"])


@register
class JoinV4(JoinV3):
    version = "v4"
    summary = ("v3 with the points' coordinates laid out by grid cell (the filter reads each cell's points as one "
               "contiguous run) and the filter in one launch: a warp lays its polygons' cell runs end to end, counts "
               "while keeping the candidates in shared memory, reserves room for them with one atomic add (1 to 16 "
               "polygons a warp, by polygon count) and writes them from there; no count pass, no scan (on the CPU it "
               "runs v1's stages)")

    def footprint(self) -> Footprint:
        # On top of v3: the coordinates in bucketed order (16 B a point).
        base = super().footprint()
        return replace(base, device_bytes=base.device_bytes + 16 * self.params["points"])


@register
class JoinV5(JoinV4):
    version = "v5"
    summary = ("v4 with morton_sort and output_sort each one cooperative launch: their steps (count, scan, scatter; "
               "scan, scatter, sort each point's polygons) wait for the whole grid at barriers instead of ending a "
               "kernel, so the run launches five kernels where v4 launches nine (on the CPU it runs v1's stages)")


set_default("join", "v5", "the fastest at the default sizes on an NVIDIA H200, the versions interleaved in one process "
                          "with L2 flushed and every stage marked (python -m tests.benchmark.bench_ab join): after the "
                          "build 0.140 ms against v4's 0.148 ms (300 rounds, paired ratio 1.06x [1.04-1.09]; 1.07x "
                          "[1.03-1.11] on another node), and 0.179 against 0.185, 0.201, 0.274 and 0.346 ms for v4, v3, "
                          "v1 and v2 on a third (60 rounds); end to end 0.428 against 0.441 ms. It saves host launches, "
                          "so it gains where the host paces the plan: with no stage marks, the stages queued behind the "
                          "build's copies, v4 is level or ahead (120.3 against 125.7 us, the interquartile ranges "
                          "overlapping; 329.6 against 336.1 us at 1M x 100k), and replayed as a CUDA graph v4 is the "
                          "faster (90.6 against 98.4 us: the grid barriers cost more than kernel boundaries in a graph)")
