"""One ncu session: the plan's worker re-invoked under ncu, with the device lock held.

Shared by annotation and ncu modes. ncu is limited to the worker's
``<kernel>@profile`` NVTX range, so the compile, cold and warm-up runs and the
input generation are never profiled; clocks are left alone unless asked
(``--clock-control none`` by default, truth rule 7).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass

from app.errors import AppError, DeviceUnavailable
from app.runtime import device as devmod
from app.runtime.lock import device_lock
from app.runtime.profiling.tools import find_tool, progress_printer, run_tool, tool_version
from app.runtime.profiling.worker import PROFILE_RANGE


@dataclass
class NcuRun:
    stdout: str
    worker: dict
    tmpdir: str
    ncu: str
    ncu_version: str | None
    command: list
    selection: object


def worker_command(plan, out_json: str, warmup: int) -> list[str]:
    args = [sys.executable, "-m", "app.kernel", plan.kernel, plan.version, "--worker", out_json,
            "--device", "gpu", "--warmup", str(warmup)]
    for name, value in plan.params.items():
        args += [f"--{name}", str(value)]
    return args


@contextmanager
def run_under_ncu(plan, options, ncu_args: list[str], label: str):
    """Yields the NcuRun; its temporary folder (worker JSON, .ncu-rep) is removed afterwards."""
    ncu = find_tool("ncu", options.ncu)
    selection = devmod.select("gpu" if options.device == "auto" else options.device)
    if selection.selected != "gpu":
        raise DeviceUnavailable(f"{label} needs a GPU; use --prof_type event on the CPU")
    if plan.tiling != type(plan)(plan.params).tiling:
        raise AppError(f"{label} runs the worker with default tiling; custom tiling is not passed through yet")
    tmpdir = tempfile.mkdtemp(prefix=f"app-{label.split()[0]}-")
    try:
        out_json = os.path.join(tmpdir, "worker.json")
        ncu_args = [a.replace("{tmp}", tmpdir) for a in ncu_args]
        cmd = [ncu, "--clock-control", options.clock_control, "--nvtx", "--nvtx-include",
               f"{plan.kernel}@{PROFILE_RANGE}/", *ncu_args, *worker_command(plan, out_json, options.warmup)]
        # The worker must import this very checkout even when the package is not installed.
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p))
        with device_lock("gpu0"):
            stdout, _ = run_tool(cmd, timeout=options.ncu_timeout, label=label,
                                 progress=progress_printer(f"[{label}] "), env=env)
        if "No kernels were profiled" in stdout or not os.path.exists(out_json):
            raise AppError(f"{label} profiled no kernels: the NVTX filter {plan.kernel}@{PROFILE_RANGE}/ matched "
                           "nothing (was the worker's NVTX range emitted? is the nvtx package installed?)")
        with open(out_json) as f:
            worker = json.load(f)
        yield NcuRun(stdout, worker, tmpdir, ncu, tool_version(ncu), cmd, selection)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
