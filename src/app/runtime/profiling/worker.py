"""The worker role: what a subprocess mode (annotation, ncu) runs under the profiler.

The parent re-invokes the same CLI with ``--worker OUT.json``: the worker builds
the plan, compiles, does the cold run and the warm-ups outside any NVTX range,
then runs the plan once inside ``<kernel>@profile`` with one NVTX range per
stage, so the profiler's ``--nvtx-include <kernel>@profile/`` sees exactly one
warm iteration of the stage kernels -- the same plan.run as every other mode.
"""
from __future__ import annotations

import json
import sys

from app.errors import DeviceUnavailable
from app.runtime import device as devmod
from app.runtime.execute import backend_for, xp_for
from app.runtime.nvtx import Nvtx
from app.runtime.recorder import Recorder

PROFILE_RANGE = "profile"


def run_worker(plan, device: str, warmup: int, out_path: str) -> int:
    # The parent insists on a GPU; the worker runs where it is told (--device gpu from the parent).
    selection = devmod.select(device)
    dev = selection.selected
    inputs = plan.make_inputs()
    backend, compile_info = backend_for(plan, selection)
    quiet = Recorder(dev, xp_for(dev), Nvtx(False, plan.kernel))
    for _ in range(1 + warmup):                 # cold run + warm-ups: not profiled
        quiet.run(plan, inputs, backend)
    nvtx = Nvtx(True, plan.kernel)
    if not nvtx.active:
        raise DeviceUnavailable(f"NVTX is unavailable ({nvtx.reason}); the profiler cannot find the stages")
    nvtx.push(PROFILE_RANGE)
    _, record = Recorder(dev, xp_for(dev), nvtx).run(plan, inputs, backend)
    nvtx.pop()
    from dataclasses import asdict

    costs = {s["name"]: asdict(plan.cost(s["name"], s["rows_in"], s["rows_out"], s["meta"], inputs))
             for s in record.stages}
    doc = {"costs": costs, "kernel": plan.kernel, "version": plan.version, "params": plan.params, "tiling": plan.tiling,
           "selection": selection.as_dict(), "nvtx": nvtx.report(), "compile": compile_info,
           "stages": record.stages, "total_seconds": record.total_seconds,
           "artifacts": backend.artifacts()}
    with open(out_path, "w") as f:
        json.dump(doc, f, default=str)
    print(f"worker: profiled one warm run of {plan.kernel} {plan.version}", file=sys.stderr)
    return 0
