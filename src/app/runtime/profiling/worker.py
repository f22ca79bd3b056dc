"""The worker role: what a subprocess mode (annotation, ncu, nsys) runs under the profiler.

The parent re-invokes the same CLI with ``--worker OUT.json``: the worker builds
the plan, compiles, does the cold run and the warm-ups outside any NVTX range,
then runs the plan ``iterations`` times, each inside a ``<kernel>@profile`` range
with one NVTX range per stage -- the same plan.run as every other mode. ncu's
``--nvtx-include <kernel>@profile/`` therefore sees only warm iterations, and the
timeline analysis of nsys mode only looks inside those ranges. For nsys mode the
worker also times the host's paces before each iteration, outside the ranges
(app.runtime.launch_pace.Paces, as event mode does before its timed runs).

With ``collect="cupti"`` the worker traces itself with CUPTI (no nsys): it first
times the same iterations untraced, then traced, so the tracing overhead is
measured rather than assumed.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict

from app.errors import DeviceUnavailable
from app.runtime import device as devmod
from app.runtime import launch_pace
from app.runtime.execute import backend_for, xp_for
from app.runtime.nvtx import Nvtx
from app.runtime.recorder import Recorder
from app.runtime.timing import warm_up

PROFILE_RANGE = "profile"
# Runs of the plan traced by CUPTI before the first reported iteration, discarded (see run_worker).
CUPTI_WARM_RUNS = 3


def verify_output(plan, inputs, host_output) -> dict:
    """The oracle's verdict on the output. An oracle that cannot run (shapely missing or raising) is recorded as
    ``{"error": ..., "matches": None}`` -- neither a pass nor a mismatch -- so the finished profile is still
    written and says so, rather than lost to a traceback."""
    try:
        return plan.verify(inputs, host_output)
    except Exception as exc:        # the oracle's failure, whatever it is; Ctrl-C and SIGTERM still stop the run
        lines = str(exc).strip().splitlines()
        return {"error": f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__, "matches": None}


def _iterations(rec: Recorder, nvtx: Nvtx, plan, inputs, backend, n: int, before=None) -> tuple[list, tuple]:
    """``n`` runs, each in a profile range; ``before`` is called before each, outside every range (the paces'
    timing, as event mode times them outside its timed runs)."""
    records, output = [], None
    for _ in range(n):
        if before is not None:
            before()
        nvtx.push(PROFILE_RANGE)
        output, record = rec.run(plan, inputs, backend)
        nvtx.pop()
        records.append(record)
    return records, output


def run_worker(plan, device: str, warmup, out_path: str, iterations: int = 1, collect: str = "none",
               verify: bool = True, pace: bool = False) -> int:
    """``pace``: time the host's paces before each profiled iteration (nsys mode; under ncu they would time ncu)."""
    # The parent insists on a GPU; the worker runs where it is told (--device gpu from the parent).
    selection = devmod.select(device)
    dev = selection.selected
    inputs = plan.make_inputs()
    backend, compile_info = backend_for(plan, selection)
    xp = xp_for(dev)
    trace = None
    if collect == "cupti":
        from app.runtime.profiling.cupti_trace import CuptiTrace

        trace = CuptiTrace()
    nvtx = Nvtx(True, plan.kernel, clock=trace.clock if trace is not None else None)
    if trace is None and not nvtx.active:
        raise DeviceUnavailable(f"NVTX is unavailable ({nvtx.reason}); the profiler cannot find the stages")
    # Everything the iterations use is made before the cold run and the warm-ups, which then run straight into
    # them on the same recorder, its ranges off: on an H200 host, with the NVTX names and the recorder made after
    # the warm-up, the first of 30 iterations under nsys ran 1.84 and 1.91x their median; made before, 1.34 and
    # 1.08x (another H200 host).
    nvtx.prepare([PROFILE_RANGE, *(s.name for s in plan.stages)])
    rec = Recorder(dev, xp, nvtx)
    paces = launch_pace.Paces(dev, xp) if pace else None
    with rec.ranges_off():                      # cold run and warm-ups: not profiled
        rec.run(plan, inputs, backend)
        warm_up(lambda: rec.run(plan, inputs, backend), warmup, lambda: None)
    extra = {}
    if trace is not None:
        untraced, _ = _iterations(rec, nvtx, plan, inputs, backend, iterations)
        nvtx.log.clear()
        trace.start()
        # CUPTI's first traced launches pay its set-up: the first traced iteration of the join fixture (an H200)
        # took 5.3 ms, the next 1.0 ms, and 325 us a launch in the first pace timing once that came first. So a
        # few iterations are traced first, the paces' launches before each, untimed, and their ranges dropped
        # from the log: the analysis reads only inside the logged ranges (as it skips the warm-up under nsys), and
        # they run straight into the first reported iteration.
        _iterations(rec, nvtx, plan, inputs, backend, CUPTI_WARM_RUNS, paces.warm if paces is not None else None)
        nvtx.log.clear()
    records, output = _iterations(rec, nvtx, plan, inputs, backend, iterations,
                                  paces.sample if paces is not None else None)
    if trace is not None:
        extra["cupti"] = trace.stop() | {"ranges": nvtx.log}
        extra["overhead"] = {"untraced_wall_seconds": [r.wall_seconds for r in untraced],
                             "traced_wall_seconds": [r.wall_seconds for r in records]}
    if paces is not None:
        extra["pace"] = {"loop_seconds": paces.loop, "launch_seconds": paces.launches}
    # After the profiled iterations and outside every range: the oracle check the other modes make.
    verification = verify_output(plan, inputs, backend.outputs_to_host(output)) if verify else None
    first = records[0]
    costs = {s["name"]: asdict(plan.cost(s["name"], s["rows_in"], s["rows_out"], s["meta"], inputs))
             for s in first.stages}
    doc = {"costs": costs, "kernel": plan.kernel, "version": plan.version, "params": plan.params, "tiling": plan.tiling,
           "selection": selection.as_dict(), "nvtx": nvtx.report(), "compile": compile_info,
           "stages": first.stages, "total_seconds": first.total_seconds,
           "iterations": [{"stages": [{"name": s["name"], "seconds": s["seconds"], "host_seconds": s["host_seconds"]}
                                      for s in r.stages],
                           "total_seconds": r.total_seconds, "wall_seconds": r.wall_seconds} for r in records],
           "artifacts": backend.artifacts(), "verification": verification} | extra
    with open(out_path, "w") as f:
        json.dump(doc, f, default=str)
    print(f"worker: profiled {iterations} warm run(s) of {plan.kernel} {plan.version}", file=sys.stderr)
    return 0
