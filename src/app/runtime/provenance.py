"""params.json: everything needed to know what was measured, where, and with what."""
from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata

from app.analysis.devices import REPO_ROOT
from app.runtime.clocks import clock_report, gpu_uuid


def git_revision() -> dict:
    def git(*args):
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        rev = git("rev-parse", "HEAD")
        return {"commit": rev or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def package_versions(names=("numpy", "cupy-cuda13x", "cupy-cuda12x", "cupy", "nvtx", "shapely",
                            "pandas", "jinja2", "matplotlib")) -> dict:
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def params_json(plan, selection, *, mode: str, options: dict, argv: list[str] | None, tools: dict | None = None,
                clocks: dict | None = None) -> dict:
    """``clocks``: the block clock_report built from the snapshots around the runs (taken now if None)."""
    argv = argv if argv is not None else sys.argv
    return {
        "kernel": plan.kernel, "version": plan.version, "mode": mode,
        "params": plan.params, "options": options, "tiling": plan.tiling,
        "device": {"name": selection.device_name} | selection.info,
        "requested_runtime": selection.requested,
        "selected_runtime": selection.selected,
        "planner_selected_runtime": selection.planner,
        "selection_reason": selection.reason,
        "clocks": clocks if clocks is not None else clock_report(selection.selected, gpu_uuid(selection)),
        "tools": package_versions() | (tools or {}),
        "command_line": argv[0] + " " + shlex.join(argv[1:]),
        "git": git_revision(),
        "host": host_info(),
    }


def host_info() -> dict:
    """The host, and the glibc tunables the process started with: GLIBC_TUNABLES can make numpy's copies into the
    pinned staging buffers stream past the cache (docs/modes/event.md), which changes the build's time. None
    when unset."""
    return {"hostname": platform.node(), "platform": platform.platform(),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES")}
