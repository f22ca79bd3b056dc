"""``--graph``: the plan's stages after the host->device build, captured as one CUDA graph and replayed.

A plan that reads allocation sizes from the device mid-run cannot be captured as it stands: a graph
holds device work only. What can be captured is the run for *these* inputs: an eager run records the
sizes it read (``SizeTape``), the build runs eagerly, and the stages after it are captured with the
recorded sizes handed back instead of read. Replaying that graph does exactly the eager run's device
work, with every kernel launch, memset and scan already queued: the difference between the two times
is the host's share (launch calls, Python, the size round trips). Where the stages read sizes mid-run the
graph is valid for these sizes only; a plan whose only read is the result's length, after its last launch
(join v3), replays for any input whose data fits the buffers sized before capture.

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


def graph_replay(plan, inputs, backend, flush, runs: int, progress=None) -> dict:
    """Time graph replay of the stages after the build next to the same stages run eagerly (interleaved)."""
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        tape = SizeTape()
        taped = Recorder("gpu", cp, Nvtx(False, plan.kernel), tape=tape)
        ref_out, ref = taped.run(plan, inputs, backend)
        ref_host = backend.outputs_to_host(ref_out)
        first = build_stages(ref)
        blockers = replay_blockers(ref, first)
        if blockers:
            return {"replayed": False, "why": "no replay: " + "; ".join(blockers)}
        after = plan.stages[first:]
        bare = Recorder("gpu", cp, Nvtx(False, plan.kernel), per_stage=False)    # no marks, real size reads
        state = plan.run_stages({"inputs": inputs}, plan.stages[:first], backend, bare)
        stream.synchronize()
        tape.replay()
        stream.begin_capture(mode=RELAXED_CAPTURE)
        try:
            plan.run_stages(state, after, backend, Recorder("gpu", cp, Nvtx(False, plan.kernel), per_stage=False,
                                                            tape=tape))
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        got = backend.outputs_to_host(state["output"])
        if len(got) != len(ref_host) or not all(np.array_equal(a, b) for a, b in zip(got, ref_host)):
            return {"replayed": False, "why": "the graph's output differs from the eager run's: no figure is given"}
        # Both sides alike, as the profile's runs: L2 flushed, the build run (its copies queued), then one pair
        # of events around the stages after it -- launched one by one (eager, no per-stage marks) or as the
        # graph. The graph reads the buffers of the build it was captured after (the same data): the build
        # before a replay is there so the host and the copy engine are where they are in a plan's run.
        start, end = cp.cuda.Event(), cp.cuda.Event()

        def timed(run) -> float:
            flush()
            bare.defer()        # the stages' bookkeeping after the clock, as in a recorder's run
            fresh = plan.run_stages({"inputs": inputs}, plan.stages[:first], backend, bare)
            start.record(stream)
            run(fresh)
            end.record(stream)
            end.synchronize()
            bare.settle()
            return cp.cuda.get_elapsed_time(start, end) / 1e3

        def replay_and_read(_fresh) -> None:
            """The replay, then the result's length read as the eager run reads it (a caller needs it to
            cut the result): the two times cover the same work."""
            graph.launch(stream)
            for array in tape.result_arrays:
                read_to_host(cp, array)

        eager, replay = [], []
        for i in range(runs):
            if progress:
                progress.update(f"graph replay {i + 1}/{runs}")
            eager.append(timed(lambda fresh: plan.run_stages(fresh, after, backend, bare)))
            replay.append(timed(replay_and_read))
        again = backend.outputs_to_host(state["output"])
        if not all(np.array_equal(a, b) for a, b in zip(again, ref_host)):
            return {"replayed": False, "why": "the graph's output changed between replays: no figure is given"}
    e, g = statistics.median(eager), statistics.median(replay)
    return {"replayed": True, "runs": runs, "stages": [s.name for s in after],
            "eager_after_build_seconds": e, "graph_after_build_seconds": g,
            "graph_ci95": list(median_interval(replay)), "eager_ci95": list(median_interval(eager)),
            "speedup": e / g if g > 0 else None, "size_reads_replayed": len(tape.reads),
            "result_reads_in_replay": len(tape.result_arrays),
            "why": f"the {len(after)} stages after the build captured as one CUDA graph {_scope(ref, first, tape)}, "
                   "output checked equal to the eager run's; eager and replay runs interleaved, each timed "
                   "from the end of its own build, as the profile's runs are"
                   + ("; each replay timed with its read of the result's length, as an eager run reads it"
                      if tape.result_arrays else "")}


def _scope(record, first: int, tape) -> str:
    """Which inputs the captured graph serves: any whose data fits, when nothing but the result's length was read."""
    if not sum(mid_plan_reads(s["counters"]) for s in record.stages[first:]):
        return ("with no size read before the result's length (it serves any input whose data fits the buffers "
                "sized before capture)")
    return f"with the {len(tape.reads)} allocation sizes an eager run read (valid for these inputs' sizes only)"
