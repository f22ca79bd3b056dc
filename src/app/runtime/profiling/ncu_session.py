"""One ncu session: the plan's worker re-invoked under ncu, with the device lock held.

Shared by annotation and ncu modes. ncu is limited to the worker's
``<kernel>@profile`` NVTX range, so the compile, cold and warm-up runs and the
input generation are never profiled; clocks are left alone unless asked
(``--clock-control none`` by default, truth rule 7).
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass

from app.errors import AppError
from app.kernel.gpu_build import LINEINFO_ENV
from app.runtime.profiling.parsers.columns import check_ncu_version, oldest_ncu
from app.runtime.profiling.session import gpu_session, worker_command, worker_env
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


@contextmanager
def run_under_ncu(plan, options, ncu_args: list[str], label: str):
    """Yields the NcuRun; its temporary folder (worker JSON, .ncu-rep) is removed afterwards."""
    ncu = find_tool("ncu", options.ncu)
    # Before anything runs: an ncu whose version cannot be read is refused, one older than every column map warned
    # about.
    version = check_ncu_version(tool_version(ncu), ncu)
    with gpu_session(plan, options, label) as ses:
        ncu_args = [a.replace("{tmp}", ses.tmpdir) for a in ncu_args]
        cmd = [ncu, "--clock-control", options.clock_control, "--nvtx", "--nvtx-include",
               f"{plan.kernel}@{PROFILE_RANGE}/", *ncu_args,
               # --no-verify reaches the worker: its oracle runs in the very process ncu profiles
               *worker_command(plan, ses.worker_json, options.warmup, verify=options.verify)]
        with explain_unknown_option(version):
            stdout, _ = run_tool(cmd, timeout=options.ncu_timeout, label=label,
                                 progress=progress_printer(f"[{label}] "),
                                 env=worker_env() | {LINEINFO_ENV: "1"})
        if "No kernels were profiled" in stdout:
            raise AppError(f"{label} profiled no kernels: the NVTX filter {plan.kernel}@{PROFILE_RANGE}/ matched "
                           "nothing (was the worker's NVTX range emitted? is the nvtx package installed?)")
        yield NcuRun(stdout, ses.load_worker(label), ses.tmpdir, ncu, version, cmd, ses.selection)


@contextmanager
def explain_unknown_option(version: str | None):
    """An ncu that refuses one of the options this tool passes is too old for it, whatever it calls itself:
    say so, with the release the column maps start at."""
    try:
        yield
    except AppError as exc:
        if not re.search(r"unrecogni[sz]ed option|unknown option", str(exc)):
            raise
        raise AppError(f"{exc} -- this ncu ({version or 'version unknown'}) refuses an option this tool passes, "
                       f"which Nsight Compute {oldest_ncu()} and newer accept: pass --ncu PATH to a newer "
                       "(or complete) install") from None
