"""What every subprocess mode shares: the worker's command line and environment, a GPU check,
a temporary folder that is always removed, the device lock, and reading the worker's JSON.

annotation and ncu run the worker under ncu (ncu_session.py), nsys mode under
nsys or on its own with the CUPTI collector (nsys.py); all of them re-invoke the
same CLI in the worker role, so one code path runs the plan in every mode.
"""
from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass

from app.errors import AppError, DeviceUnavailable
from app.runtime import device as devmod
from app.runtime.autotune import tiling_files
from app.runtime.clocks import clock_report, clock_snapshot, gpu_uuid
from app.runtime.lock import device_key, device_lock
from app.runtime.memory import check_fits
from app.runtime.profiling.tools import tool_tmpdir


def worker_command(plan, out_json: str, warmup: int, iterations: int = 1, collect: str = "none",
                   verify: bool = True, pace: bool = False) -> list[str]:
    args = [sys.executable, "-m", "app.kernel", plan.kernel, plan.version, "--worker", out_json,
            "--worker-tiling", json.dumps(plan.tiling),
            "--device", "gpu", "--warmup", str(warmup), "--worker-iterations", str(iterations),
            "--worker-collect", collect] + ([] if verify else ["--no-verify"]) + (["--worker-pace"] if pace else [])
    for name, value in plan.params.items():
        args += [f"--{name}", str(value)]
    return args


def worker_env() -> dict:
    """The worker must import this very checkout even when the package is not installed."""
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p))


@dataclass
class Session:
    tmpdir: str
    selection: object

    @property
    def worker_json(self) -> str:
        return os.path.join(self.tmpdir, "worker.json")

    def load_worker(self, label: str) -> dict:
        if not os.path.exists(self.worker_json):
            raise AppError(f"{label}: the worker wrote no result ({self.worker_json} is missing)")
        with open(self.worker_json) as f:
            return json.load(f)


@contextmanager
def gpu_session(plan, options, label: str):
    """Check for a GPU, make a temporary folder, hold the device lock.

    The folder (worker JSON, captures) is removed however the block ends.

    The error names only what the user asked for: with the default --device auto there is no
    --device flag to blame, so it says why no GPU is usable and points at the CPU mode."""
    try:
        selection = devmod.select("gpu" if options.device == "auto" else options.device)
    except DeviceUnavailable as exc:
        if options.device == "auto":
            why = devmod.probe_gpu()[1]
            raise DeviceUnavailable(f"{label} needs a GPU and none is usable here ({why}); "
                                    "use --prof_type event to profile on the CPU") from None
        raise DeviceUnavailable(f"{label} needs a GPU: {exc}") from None
    if selection.selected != "gpu":
        raise DeviceUnavailable(f"{label} needs a GPU but --device {options.device} was asked for; "
                                "use --device auto or gpu, or --prof_type event to profile on the CPU")
    check_fits(plan, selection.selected)
    # A folder a killed profile leaves (SIGKILL runs no clean-up) is removed by the next tool run's tool_tmpdir.
    with tool_tmpdir(label.split()[0]) as tmpdir, device_lock(device_key(selection)):
        selection.clock_start = clock_snapshot(selection)     # before the worker; the end in profile_files
        yield Session(tmpdir, selection)


def profile_files(plan, worker: dict, selection, options, mode: str, tools: dict) -> dict:
    """params.json, tiling/ and compiled/ of a subprocess mode's profile, from the worker's report."""
    from app.runtime.provenance import params_json

    clocks = clock_report(selection.selected, gpu_uuid(selection), start=selection.clock_start,
                          end=clock_snapshot(selection))            # after the worker ran
    params = params_json(plan, selection, mode=mode, options=options.as_dict(), argv=options.argv, tools=tools,
                         clocks=clocks)
    files = {"params.json": params}
    files |= tiling_files(plan)
    for stage, arts in worker.get("artifacts", {}).items():
        for fname, content in arts.items():
            files[f"compiled/{stage}/{fname}"] = content
    return files
