"""``JoinReplay``: joins of many batches with the same counts, the stages after the build replayed as one CUDA graph.

At 100k points x 10k polygons the eager plan is bound by its host: nine kernel launches and the Python around
them take longer than the kernels run (H200 nodes: 0.16-0.19 ms after the build eagerly, 0.08-0.09 ms replayed as
one graph; a whole batch end to end 0.609 against 0.788 and 0.849 against 1.169 ms on two of them,
tests/benchmark/bench_replay.py).
Join v3, v4 and v5 read no size from the device before the result's length, so the stages after the build can be
captured once and replayed for new data with the same counts -- the same points count, polygon count, ring
count and vertex count -- written into the buffers the graph was captured with (app.runtime.graph). This class
does that for a caller:

- the first batch runs eagerly (its output is the answer), the stages after its build are captured, and one
  replay of the graph on the same data must give the same output, or no graph is kept;
- each later batch with the captured counts is copied into the graph's input buffers, the graph is replayed,
  and the counts the device found come back with the result's length: where the candidate pairs outgrew the
  room sized before capture, the replay's result is incomplete, so the batch runs eagerly instead (the plan
  grows its room) and the graph is captured again around the larger room;
- a batch of other counts is captured anew (the graph holds the counts as launch arguments).

The answer is the eager plan's, pair for pair, for every batch (tests/runtime/test_join_replay.py checks each
against shapely).
"""
from __future__ import annotations

import numpy as np

from app.errors import BadParameter, DeviceUnavailable
from app.kernel.geometry import PolygonBuffers, points_from_any, polygons_from_shapely
from app.kernel.join.plan import PREDICATES, JoinInputs

REPLAYABLE = ("v3", "v4", "v5")     # the versions whose only read from the device is the result's length
# v4 by default, though v5 is the eager plan's: v5 saves the host launches, which a graph has already saved, and its
# grid barriers cost more than the kernel boundaries they replace. On an H200, replayed: 90.6 against 98.4 us at
# 100k x 10k, 299.1 against 311.8 us at 1M x 100k (interleaved, L2 flushed).
DEFAULT_VERSION = "v4"


class JoinReplay:
    """``replay(points, polygons)`` -> (point_index, polygon_index), as ``spatial_join`` returns them, for batch
    after batch; batches of the same counts after the first replay one captured CUDA graph. ``polygons`` may be
    shapely geometries (checked and flattened on every call, which costs far more than the join) or the
    ``PolygonBuffers`` they flatten to (``app.kernel.geometry.polygons_from_shapely``), made once by the caller
    and taken as that function checked them (valid polygons, coordinates in range): not checked again.

    ``stats`` counts the batches: ``replayed``, ``eager`` (first of their counts, or their candidates outgrew
    the graph's room) and ``captures``; ``refused`` says why a capture kept no graph, where one kept none."""

    def __init__(self, predicate: str = "within", version: str = DEFAULT_VERSION, make_valid: bool = False):
        from app.runtime.device import select

        if predicate not in PREDICATES:
            raise BadParameter(f"unknown predicate {predicate!r}; use one of {', '.join(PREDICATES)}")
        if version not in REPLAYABLE:
            raise BadParameter(f"join {version} reads sizes from the device before its result, so no graph of it "
                               f"serves new data; use {' or '.join(REPLAYABLE)}")
        try:
            select("gpu")
        except DeviceUnavailable as exc:
            why = str(exc).split(";")[0].split(" but ")[-1]       # the reason, not the CLI's flag
            raise BadParameter(f"JoinReplay replays CUDA graphs and needs a GPU ({why}); spatial_join runs on the "
                               "CPU too") from None
        self.predicate, self.version, self.make_valid = predicate, version, make_valid
        self.stats = {"replayed": 0, "eager": 0, "captures": 0}
        self._graph = None           # (counts, its AfterBuild, its Captured) once captured
        self._stream = None
        self.refused: str | None = None     # why the last capture kept no graph, where one kept none

    def __call__(self, points, polygons) -> tuple[np.ndarray, np.ndarray]:
        xy, kept = points_from_any(points)
        polys = polygons if isinstance(polygons, PolygonBuffers) else \
            polygons_from_shapely(polygons, make_valid=self.make_valid)
        inputs = JoinInputs(xy, polys, self.predicate)
        counts = (len(xy), polys.n_geoms, polys.n_rings, polys.n_coords)
        out = self._replayed(inputs, counts) if self._graph and self._graph[0] == counts else None
        if out is None:
            out = self._capture(inputs, counts)
        pt = np.asarray(out[0], dtype=np.int32)
        # As spatial_join: unusable points were left out; map positions back to the caller's indices.
        return (kept[pt].astype(np.int32) if kept is not None else pt), np.asarray(out[1], dtype=np.int32)

    def _capture(self, inputs: JoinInputs, counts: tuple) -> tuple:
        """An eager run of ``inputs`` (the answer), then the stages after a fresh build of them captured, kept
        only if a replay gives the eager run's answer. Every capture has a backend of its own: an eager run of
        other counts on the graph's backend would reallocate the buffers the graph reads."""
        import cupy as cp

        from app.kernel.plan import get_plan_class
        from app.runtime.device import select
        from app.runtime.execute import backend_for
        from app.runtime.graph import AfterBuild

        self._graph, self.refused = None, None
        self.stats["eager"] += 1
        plan = get_plan_class("join", self.version)({"points": max(counts[0], 1), "polygons": max(counts[1], 1),
                                                     "predicate": self.predicate})
        backend, _ = backend_for(plan, select("gpu"))
        self._stream = self._stream or cp.cuda.Stream(non_blocking=True)
        with self._stream:
            if not (counts[0] and counts[1]):        # nothing to join: no graph to keep
                return self._eager(plan, inputs, backend)
            stages, blockers = AfterBuild.from_eager_run(plan, inputs, backend, self._stream)
            if stages is None:      # not expected of v3-v5: the answer eagerly, and why no graph
                self.refused = "; ".join(blockers)
                return self._eager(plan, inputs, backend)
            answer = stages.reference
            captured = stages.capture()
            self.stats["captures"] += 1
            self._graph = (counts, stages, captured)
            again = self._replayed(inputs, counts, count=False)
            if again is None or not all(np.array_equal(a, b) for a, b in zip(again, answer)):
                self._graph = None      # the replay disagreed with the eager run: no graph kept
                self.refused = "a replay of the captured graph did not give the eager run's answer"
        return answer

    @staticmethod
    def _eager(plan, inputs: JoinInputs, backend) -> tuple:
        import cupy as cp

        from app.runtime.nvtx import Nvtx
        from app.runtime.recorder import Recorder

        out, _ = Recorder("gpu", cp, Nvtx(False, "join"), per_stage=False).run(plan, inputs, backend)
        return backend.outputs_to_host(out)

    def _replayed(self, inputs: JoinInputs, counts: tuple, count: bool = True) -> tuple | None:
        """The batch written into the graph's input buffers, the graph replayed, the result read back; None where
        the candidates outgrew the graph's room (the replay's result would be short)."""
        from app.kernel.join.gpu import CANDIDATES, REFINE
        from app.runtime.recorder import read_to_host

        _, stages, captured = self._graph
        state, cp = captured.state, captured.cp
        with self._stream:
            # The batch through the plan's own build (the eager run's pinned staging), then copied on the device
            # into the buffers the graph reads: a device copy runs at ~2 TB/s, and the build is the same code a
            # profile times. Copied by numpy into pinned buffers instead, a batch took 13.3 against the eager
            # plan's 2.4 ms end to end at 1M x 100k on an H200 node.
            fresh = stages.plan.run_stages({"inputs": inputs}, stages.build, stages.backend, stages.bare)
            for name in ("points", "coords", "ring_offsets", "geom_ring_offsets"):
                dst, src = state[name], fresh[name]
                cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes,
                                            cp.cuda.runtime.memcpyDeviceToDevice, self._stream.ptr)
            captured.graph.launch(self._stream)
            words = read_to_host(cp, state["ledger"]["all"])
            if int(words[CANDIDATES][0]) > len(state["cand_pt"]):
                return None
            hits = int(words[REFINE][0])
            pt, poly = state["sorted_pairs"]
            out = stages.backend.outputs_to_host((pt[:hits], poly[:hits]))
        if count:
            self.stats["replayed"] += 1
        return out
