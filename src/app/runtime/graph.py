"""``--graph``: the plan's stages after the host->device build, captured as one CUDA graph and replayed.

A plan that reads allocation sizes from the device mid-run cannot be captured as it stands: a graph
holds device work only. What can be captured is the run for *these* inputs: an eager run records the
sizes it read (``SizeTape``), the build runs eagerly, and the stages after it are captured with the
recorded sizes handed back instead of read. Replaying that graph does exactly the eager run's device
work, with every kernel launch, memset and scan already queued: the difference between the two times
is the host's share (launch calls, Python, the size round trips). Where the stages read sizes mid-run the
graph is valid for these sizes only. A plan whose only read is the result's length, after its last launch
(join v3 and v4, overlay v3), replays for new data with the same counts (points, polygons, rings, vertices: the
graph holds some as launch arguments, and its buffers were sized for them) written into the buffers it was
captured with, as long as what the device finds fits the rooms sized before capture; those counts come back
with the result's length, to check (tests/runtime/test_graph_new_data.py replays new data this way).

The replay's output is checked equal to the eager run's before any time is reported. Eager and graph
runs are interleaved on one stream, each timed the same way, as the profile's own runs time the stages
after the build: the L2 policy applied, the build run (its copies queued, not waited for), then one pair
of events around the stages after it (no per-stage marks on either side), so on both sides the host
queues those stages while the build's last copies are still running. Timed from a finished build
instead, the eager side paid the host's whole launch time with an idle GPU: 535 us against the profile's
own 378 us for join v4 at 1M x 100k on an H200. Where the plan reads its result's length after its last
launch, a timed replay reads it too, from the same device words, as the eager run does.
"""
from __future__ import annotations

import statistics

import numpy as np

from app.runtime.nvtx import Nvtx
from app.runtime.recorder import Recorder, SizeTape, mid_plan_reads, read_to_host
from app.runtime.stats import median_interval

RELAXED_CAPTURE = 2      # cudaStreamCaptureModeRelaxed: a pool allocation during capture is allowed
# Which inputs a graph of stages that read no size before the result's length serves, said once for the profile's
# capturability judgment (app.runtime.timing) and the replay's own text (tests/runtime/test_graph_new_data.py
# holds it to its words).
NEW_DATA_SCOPE = ("new data with the same counts (some are launch arguments in the graph), written into the buffers "
                  "it was captured with, while the counts the device finds fit the rooms sized before capture (they "
                  "come back with the result's length)")


def build_stages(record) -> int:
    """How many leading stages copy host data in (the build): they run eagerly, outside the graph."""
    k = 0
    while k < len(record.stages) and record.stages[k]["counters"]["h2d_copies"]:
        k += 1
    return k


def replay_blockers(record, first: int) -> list[str]:
    """What keeps the stages after the build out of a graph even with their sizes replayed."""
    out = []
    for s in record.stages[first:]:
        c = s["counters"]
        if c["h2d_copies"]:
            out.append(f"{s['name']}: copies host data in after the build")
        if c["syncs"] > c["allocation_size_reads"]:
            out.append(f"{s['name']}: {c['syncs'] - c['allocation_size_reads']} host read(s) other than sizes")
    return out


def taped_run(plan, inputs, backend):
    """One eager run, marked as a profile's are, that keeps the sizes it reads: (its output on the host, its
    RunRecord, the tape). A capture replays the tape's sizes."""
    import cupy as cp

    tape = SizeTape()
    out, record = Recorder("gpu", cp, Nvtx(False, plan.kernel), tape=tape).run(plan, inputs, backend)
    return backend.outputs_to_host(out), record, tape


class AfterBuild:
    """The stages after a plan's build on one stream: captured as a graph, run eagerly, and timed alike.

    ``tape`` holds the sizes an eager run read: a capture hands them back instead of reading the device.
    Every capture and every timed run first runs the build eagerly, with no per-stage marks."""

    def __init__(self, plan, inputs, backend, stream, tape: SizeTape, first: int):
        import cupy as cp

        self.cp, self.plan, self.inputs, self.backend, self.stream, self.tape = cp, plan, inputs, backend, stream, tape
        self.build, self.after = plan.stages[:first], plan.stages[first:]
        self.bare = Recorder("gpu", cp, Nvtx(False, plan.kernel), per_stage=False)   # no marks, real size reads
        self._start, self._end = cp.cuda.Event(), cp.cuda.Event()
        self.record, self.reference = None, None     # set by from_eager_run: the taped run and its output

    @classmethod
    def from_eager_run(cls, plan, inputs, backend, stream) -> tuple["AfterBuild | None", list[str]]:
        """One taped eager run (inside ``with stream``), then the stages after its build: (the AfterBuild, with
        the run's RunRecord as ``record`` and its output on the host as ``reference``, and no blockers), or
        (None, what keeps the stages after the build out of a graph)."""
        reference, record, tape = taped_run(plan, inputs, backend)
        first = build_stages(record)
        blockers = replay_blockers(record, first)
        if blockers:
            return None, blockers
        stages = cls(plan, inputs, backend, stream, tape, first)
        stages.record, stages.reference = record, reference
        return stages, []

    def capture(self, boundary=None) -> "Captured":
        """A fresh build, then the stages after it captured as one graph. ``boundary(k)``, where given, is called
        inside the capture after the k-th of those stages, for each but the last (bench_marks puts event
        record nodes there)."""
        state = self.plan.run_stages({"inputs": self.inputs}, self.build, self.backend, self.bare)
        self.stream.synchronize()
        self.tape.replay()
        self.tape.result_arrays = []
        taped = Recorder("gpu", self.cp, Nvtx(False, self.plan.kernel), per_stage=False, tape=self.tape)
        self.stream.begin_capture(mode=RELAXED_CAPTURE)
        try:
            for k, spec in enumerate(self.after):
                self.plan.run_stages(state, [spec], self.backend, taped)
                if boundary is not None and k < len(self.after) - 1:
                    boundary(k)
        finally:
            graph = self.stream.end_capture()
        return Captured(self.cp, graph, state, list(self.tape.result_arrays), self.stream)

    def eager(self, fresh: dict) -> None:
        """The stages after the build launched one by one on ``fresh`` (a build's state), with no per-stage marks."""
        self.plan.run_stages(fresh, self.after, self.backend, self.bare)

    def timed(self, run, flush) -> float:
        """Seconds of ``run(fresh)`` timed as the profile's runs time the stages after the build: the L2 policy
        applied, the build run (its copies queued, not waited for), then one pair of events around ``run``."""
        flush()
        self.bare.defer()        # the stages' bookkeeping after the clock, as in a recorder's run
        fresh = self.plan.run_stages({"inputs": self.inputs}, self.build, self.backend, self.bare)
        self._start.record(self.stream)
        run(fresh)
        self._end.record(self.stream)
        self._end.synchronize()
        self.bare.settle()
        return self.cp.cuda.get_elapsed_time(self._start, self._end) / 1e3


class Captured:
    """A captured graph of the stages after the build, the state its buffers belong to, and the device arrays
    a caller reads the result's length from after a replay."""

    def __init__(self, cp, graph, state: dict, result_arrays: list, stream):
        self.cp, self.graph, self.state, self.result_arrays, self.stream = cp, graph, state, result_arrays, stream

    def replay(self, _fresh=None) -> None:
        """The replay, then the result's length read as the eager run reads it (a caller needs it to cut the
        result): timed, the two cover the same work. The graph reads the buffers of the build it was captured
        after (the same data), not ``_fresh`` (the state of the build a timed run hands over): that build is
        there so the host and the copy engine are where they are in a plan's run."""
        self.graph.launch(self.stream)
        for array in self.result_arrays:
            read_to_host(self.cp, array)


GRAPH_MAX_PAIRS = 400       # the graph pairs' cap, the instrumentation pairs' own (timing.OVERHEAD_MAX_PAIRS)

def graph_replay(plan, inputs, backend, flush, runs: int, progress=None, warmup="auto") -> dict:
    """Time graph replay of the stages after the build next to the same stages run eagerly (interleaved),
    after ``warmup`` pairs of them (a count, or "auto": until a pair's time is steady, as a profile's warm-up)."""
    import cupy as cp

    from app.runtime.timing import warm_up     # timing imports this module

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stages, blockers = AfterBuild.from_eager_run(plan, inputs, backend, stream)
        if blockers:
            return {"replayed": False, "why": "no replay: " + "; ".join(blockers)}
        ref_host = stages.reference
        captured = stages.capture()
        captured.replay()
        if not _equal(backend.outputs_to_host(captured.state["output"]), ref_host):
            return {"replayed": False, "why": "the graph's output differs from the eager run's: no figure is given"}
        # Warmed as the profile's own runs are: on an H100 the first 30 pairs after a capture took 533 us eager and
        # 118.8 us replayed (medians), against 291-325 and 106-107 us in the 90 pairs after them.
        warmed = warm_up(lambda: stages.timed(stages.eager, flush) + stages.timed(captured.replay, flush), warmup,
                         lambda: None, progress, seconds=lambda pair: pair)
        # As many pairs as the profile's timed runs, up to the overhead pairs' cap (--bench_runs auto can run
        # thousands); each pair's order alternates, so neither side always runs first after the other.
        runs = min(runs, GRAPH_MAX_PAIRS)
        eager, replay = [], []
        for i in range(runs):
            if progress:
                progress.update(f"graph replay {i + 1}/{runs}")
            if i % 2:
                replay.append(stages.timed(captured.replay, flush))
                eager.append(stages.timed(stages.eager, flush))
            else:
                eager.append(stages.timed(stages.eager, flush))
                replay.append(stages.timed(captured.replay, flush))
        if not _equal(backend.outputs_to_host(captured.state["output"]), ref_host):
            return {"replayed": False, "why": "the graph's output changed between replays: no figure is given"}
    e, g = statistics.median(eager), statistics.median(replay)
    after = len(stages.after)
    return {"replayed": True, "runs": runs, "warmup": warmed, "stages": [s.name for s in stages.after],
            "eager_after_build_seconds": e, "graph_after_build_seconds": g,
            "graph_ci95": list(median_interval(replay)), "eager_ci95": list(median_interval(eager)),
            "speedup": e / g if g > 0 else None, "size_reads_replayed": len(stages.tape.reads),
            "result_reads_in_replay": len(captured.result_arrays),
            "why": f"the {after} stages after the build captured as one CUDA graph {_scope(stages)}, "
                   f"output checked equal to the eager run's; after {warmed['runs']} warm-up pairs, eager and "
                   "replay runs interleaved (which goes first alternating pair by pair), each timed from the end "
                   "of its own build, as the profile's runs are"
                   + ("; each replay timed with its read of the result's length, as an eager run reads it"
                      if captured.result_arrays else "")}


def _equal(got, want) -> bool:
    return len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def _scope(stages: AfterBuild) -> str:
    """Which inputs the captured graph serves: new data of the same counts, when nothing but the result's length
    was read; otherwise these inputs' sizes only."""
    if not sum(mid_plan_reads(s["counters"]) for s in stages.record.stages[len(stages.build):]):
        return f"with no size read before the result's length (it serves {NEW_DATA_SCOPE})"
    return f"with the {len(stages.tape.reads)} allocation sizes an eager run read (valid for these inputs' sizes only)"
