"""--baseline: a previous profile's trace.json, checked before any profiling starts.

A baseline is input like any other: the path must be a regular file of sane size
holding a trace of this tool, with finite times, and it must describe the same
kernel, version, parameters and device as the run it is compared with -- a
comparison across those is refused unless ``--force``, and then every report
says so at the top.
"""
from __future__ import annotations

import json
import math
import os
import stat

from app.errors import BadParameter

MAX_BYTES = 64 << 20          # a trace of this tool is kilobytes; anything this large is not one


def _fail(path, why: str):
    raise BadParameter(f"--baseline {path}: {why}; pass a profile folder or its trace.json")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_baseline(path: str | None, plan=None, device_name: str | None = None, force: bool = False) -> dict | None:
    if not path:
        return None
    p = os.path.join(path, "trace.json") if os.path.isdir(path) else path
    try:
        st = os.stat(p)
    except OSError as exc:
        _fail(path, f"not a readable profile trace ({p}: {exc.strerror})")
    if not stat.S_ISREG(st.st_mode):
        _fail(path, f"{p} is not a regular file")
    if st.st_size > MAX_BYTES:
        _fail(path, f"{p} is {st.st_size / 2**20:,.0f} MiB, too large to be a profile trace")
    try:
        with open(p, encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, ValueError) as exc:
        _fail(path, f"not a readable profile trace ({exc})")
    _check_shape(path, trace)
    mismatch = _mismatch(trace, plan, device_name)
    if mismatch and not force:
        raise BadParameter(f"--baseline {path} was measured for {mismatch}; compare like with like, or pass "
                           "--force to compare anyway (the report will say so)")
    if mismatch:
        trace["_mismatch"] = mismatch
    return trace


def _check_shape(path, trace) -> None:
    if not isinstance(trace, dict):
        _fail(path, "not a profile trace (the JSON is not an object)")
    for key in ("kernel", "version"):
        if not isinstance(trace.get(key), str):
            _fail(path, f"field {key!r} is missing or not a string")
    total = trace.get("total_elapsed_seconds")
    if not _finite(total) or total <= 0:
        _fail(path, f"total_elapsed_seconds={total!r} is not a finite positive number")
    stages = trace.get("stages")
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        _fail(path, "field 'stages' is missing or not a list of stages")
    for s in stages:
        if not isinstance(s.get("name"), str) or not _finite(s.get("elapsed_seconds")) or s["elapsed_seconds"] < 0:
            _fail(path, f"stage {s.get('name')!r} has no finite elapsed_seconds ({s.get('elapsed_seconds')!r})")
    if not isinstance(trace.get("device", {}), dict) or not isinstance(trace.get("metadata", {}), dict):
        _fail(path, "fields 'device' and 'metadata' must be objects")


def _mismatch(trace: dict, plan, device_name: str | None) -> str:
    if plan is None:
        return ""
    diffs = []
    if trace["kernel"] != plan.kernel:
        diffs.append(f"kernel {trace['kernel']} (this run: {plan.kernel})")
    elif trace["version"] != plan.version:
        diffs.append(f"version {trace['version']} (this run: {plan.version})")
    params = trace.get("metadata", {}).get("params")
    if trace["kernel"] == plan.kernel and params is not None and params != plan.params:
        changed = sorted(k for k in set(params) | set(plan.params) if params.get(k) != plan.params.get(k))
        diffs.append("other parameters (" + ", ".join(f"{k}={params.get(k)} vs {plan.params.get(k)}"
                                                      for k in changed) + ")")
    theirs = trace.get("device", {}).get("name")
    if device_name and theirs and theirs != device_name:
        diffs.append(f"device {theirs} (this run: {device_name})")
    return "; ".join(diffs)
