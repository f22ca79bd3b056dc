"""Whether GPU clocks are locked: the state scripts/lock-gpu-clock.sh leaves behind,
plus a read-only nvidia-smi query of the clocks now. The tool never changes clocks."""
from __future__ import annotations

import json
import os
import shutil
import subprocess


def state_path() -> str:
    return os.environ.get("APP_CLOCK_STATE", "/tmp/app-kernel-clock-state.json")


def clock_report(selected: str) -> dict:
    if selected != "gpu":
        return {"locked": False, "detail": "CPU run: GPU clocks do not apply"}
    report: dict = {"locked": False, "detail": "not locked: run scripts/lock-gpu-clock.sh to lock"}
    try:
        with open(state_path()) as f:
            state = json.load(f)
        report = {"locked": True, "detail": f"locked by {state.get('by', 'lock script')}", "state": state}
    except (OSError, ValueError):
        pass
    smi = os.environ.get("NVIDIA_SMI") or shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-i", "0", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                sm, sm_max, mem = (x.strip() for x in out.stdout.strip().splitlines()[0].split(","))
                report["now"] = {"sm_mhz": sm, "sm_max_mhz": sm_max, "mem_mhz": mem}
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return report
