"""Whether GPU clocks are locked: the state scripts/lock-gpu-clock.sh leaves behind,
plus a read-only nvidia-smi query of the clocks now. The tool never changes clocks."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys


def state_path() -> str:
    return os.environ.get("APP_CLOCK_STATE", "/tmp/app-kernel-clock-state.json")


LOCK_SCRIPT = "scripts/lock-gpu-clock.sh"
STATE_FIELDS = {"gpu": int, "name": str, "locked_sm_mhz": int, "readback_sm_mhz": (int, type(None)),
                "max_sm_mhz": (int, type(None)), "locked_at": str, "by": str}


def read_state(path: str, gpu_name: str | None) -> tuple[dict | None, str | None]:
    """(state, None) when ``path`` holds exactly what the lock script writes, for this GPU;
    (None, why) otherwise. The file sits where others may write: it is input like any other."""
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({exc})"
    if not isinstance(state, dict) or set(state) != set(STATE_FIELDS):
        return None, "not the lock script's format"
    for key, kind in STATE_FIELDS.items():
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            return None, f"field {key!r} has the wrong type"
    if state["by"] != LOCK_SCRIPT or state["locked_sm_mhz"] <= 0:
        return None, "not written by " + LOCK_SCRIPT
    if state["gpu"] != 0 or (gpu_name and state["name"] != gpu_name):
        return None, f"it records GPU {state['gpu']} ({state['name']}), not GPU 0 ({gpu_name or '?'})"
    return state, None


def clock_report(selected: str) -> dict:
    if selected != "gpu":
        return {"locked": False, "detail": "CPU run: GPU clocks do not apply"}
    report: dict = {"locked": False, "detail": "not locked: run scripts/lock-gpu-clock.sh to lock"}
    now = _query_now()
    state, why = read_state(state_path(), now.get("name"))
    if state:
        report = {"locked": True, "detail": f"locked by {state['by']} at {state['locked_sm_mhz']} MHz", "state": state}
    elif why:
        report["detail"] = f"not locked as far as this tool can tell: the clock state file {state_path()} was ignored ({why})"
        print(f"warning: {report['detail']}", file=sys.stderr)
    if now:
        report["now"] = {k: v for k, v in now.items() if k != "name"}
    return report


def _query_now() -> dict:
    smi = os.environ.get("NVIDIA_SMI") or shutil.which("nvidia-smi")
    if not smi:
        return {}
    try:
        out = subprocess.run([smi, "-i", "0", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,name",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            sm, sm_max, mem, name = (x.strip() for x in out.stdout.strip().splitlines()[0].split(",", 3))
            return {"sm_mhz": sm, "sm_max_mhz": sm_max, "mem_mhz": mem, "name": name}
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return {}
