"""results.csv: one row per point -- its parameters, where it ran, its times and spread, its status.

Times are medians in microseconds. ``e2e_us`` is the profile's total (host arrays in, result on
the device in a GPU run: the report's "total, median of timed runs"); ``e2e_host_out_us`` also copies the result back to host arrays (event
mode, host clock); ``after_build_us`` leaves out the host->device build where the mode measures
it. Each stage has ``<stage>_us``, ``<stage>_spread_pct`` (the robust relative spread,
1.4826 MAD / median), ``<stage>_bytes`` (the cost model's traffic) and, on a GPU
with a roofline, ``<stage>_floor_us`` (those bytes at the peak memory bandwidth). A value
a point did not measure is left empty, never zero. ``seconds`` is the point's own wall time,
``queued_seconds`` how long it waited for another point on the same device first, and
``window_waited_seconds`` how long its measured runs waited for another profile's on this host.
``host_pace_us`` (with ``host_pace_ci95_lo_us`` and ``_hi_us``) is the median time of the fixed Python loop
event mode times before every timed run: the host CPU's pace while the point ran. Points run in different
processes, and on a shared host one process can run the same code 1.7x slower than the next. ``launch_pace_us``
(with its ``_ci95_lo_us`` and ``_hi_us``), on a GPU: what a launch of an empty kernel cost the host, timed after
the loop (app.runtime.launch_pace), which sees changes of a launch-bound plan's pace the loop can miss.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from app.runtime.cache import write_atomic

RESULTS = "results.csv"
RUNS = "runs.json"                # each run of the sweep: the first, then the --resume runs that ran points
DONE = ("ok", "wrong", "unverified")      # statuses --resume does not run again
_FIRST = ["point", "version", "status", "verified", "e2e_us", "e2e_spread_pct", "e2e_ci95_lo_us", "e2e_ci95_hi_us",
          "e2e_host_out_us", "after_build_us", "floor_us", "host_pace_us", "host_pace_ci95_lo_us",
          "host_pace_ci95_hi_us", "launch_pace_us", "launch_pace_ci95_lo_us", "launch_pace_ci95_hi_us",
          "device", "runtime", "gpu_uuid", "worker", "host",
          "attempts", "worker_lost", "error", "seconds", "queued_seconds", "window_waited_seconds", "profile_waited_for_lock", "profile"]


def row_for(point: dict, trace: dict | None, result: dict, status: str, attempts: int, worker_lost: int,
            error: str, profile: str | None) -> dict:
    row = {"point": point["id"], "version": point["version"], **point["grid"], "status": status,
           "attempts": attempts, "worker_lost": worker_lost, "error": error, "profile": profile,
           "worker": result.get("worker"), "host": result.get("host"), "seconds": round(result.get("seconds", 0), 3),
           "queued_seconds": result.get("queued_seconds"),
           "profile_waited_for_lock": result.get("profile_waited_for_lock")}
    if trace is None:
        return row
    meta = trace.get("metadata", {})
    device = trace.get("device", {})
    timing = trace.get("timing", {})
    total = timing.get("total") or {}
    row |= {"verified": (meta.get("verification") or {}).get("matches"), "device": device.get("name"),
            "runtime": trace.get("selected_runtime"), "gpu_uuid": device.get("uuid")}
    row |= _spread("e2e", total, trace.get("total_elapsed_seconds"))
    if "window_waited_seconds" in timing:       # waiting for the host's measurement window (see runtime/lock.py)
        row["window_waited_seconds"] = timing["window_waited_seconds"]
    if timing.get("after_build"):
        row["after_build_us"] = _us(timing["after_build"].get("median"))
    if timing.get("end_to_end"):
        row["e2e_host_out_us"] = _us(timing["end_to_end"].get("median"))
    for key in ("host_pace", "launch_pace"):      # launch_pace: GPU points only (a CPU point's holds only "why")
        pace = timing.get(key) or {}
        if pace.get("median") is not None:
            lo, hi = pace.get("median_ci95") or [None, None]
            row |= {f"{key}_us": _us(pace["median"]), f"{key}_ci95_lo_us": _us(lo), f"{key}_ci95_hi_us": _us(hi)}
    roof = trace.get("roofline") or {}
    floors = []
    for s in trace.get("stages", []):
        name = s["name"]
        row |= {f"{name}_us": _us(s.get("elapsed_seconds")),
                f"{name}_spread_pct": _pct((s.get("spread") or {}).get("robust_rel_spread")),
                f"{name}_bytes": (s.get("cost") or {}).get("bytes")}
        point = (roof.get("stages") or {}).get(name) if roof.get("available") else None
        if point is not None:
            row[f"{name}_floor_us"] = point["bytes"] / (roof["peak_gbps"] * 1e9) * 1e6
            floors.append(row[f"{name}_floor_us"])
    if floors:
        row["floor_us"] = sum(floors)
    return row


def _spread(prefix: str, stats: dict, fallback_seconds) -> dict:
    median = stats.get("median", fallback_seconds)
    ci = stats.get("median_ci95") or [None, None]
    return {f"{prefix}_us": _us(median), f"{prefix}_spread_pct": _pct(stats.get("robust_rel_spread")),
            f"{prefix}_ci95_lo_us": _us(ci[0]), f"{prefix}_ci95_hi_us": _us(ci[1])}


def _us(seconds):
    return seconds * 1e6 if isinstance(seconds, (int, float)) and math.isfinite(seconds) else None


def _pct(frac):
    return 100 * frac if isinstance(frac, (int, float)) and math.isfinite(frac) else None


def to_frame(rows: list[dict], axes: list[str]) -> pd.DataFrame:
    cols = ["point", "version", *axes] + [c for c in _FIRST if c not in ("point", "version")]
    extra = sorted({k for r in rows for k in r} - set(cols))
    return pd.DataFrame(rows, columns=cols + extra)


def write_results(sweep_dir: Path, rows: list[dict], axes: list[str]) -> Path:
    """Rewrite results.csv atomically: a reader (or a Ctrl-C) never sees half a table."""
    data = to_frame(rows, axes).to_csv(index=False).encode()
    return write_atomic(Path(sweep_dir) / RESULTS, data)


def read_runs(sweep_dir: Path) -> list[dict]:
    """How the sweep was run so far: its first run, then every --resume that ran points (command, runner, wall
    time). None recorded (a folder from before runs.json): an empty list, and the report says so."""
    try:
        runs = json.loads((Path(sweep_dir) / RUNS).read_text())
    except (FileNotFoundError, ValueError):
        return []
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


def write_runs(sweep_dir: Path, runs: list[dict]) -> Path:
    return write_atomic(Path(sweep_dir) / RUNS, (json.dumps(runs, indent=2) + "\n").encode())


def read_rows(sweep_dir: Path) -> list[dict]:
    """The rows of an earlier run of this sweep (for --resume); none if it wrote no table yet."""
    path = Path(sweep_dir) / RESULTS
    if not path.exists():
        return []
    frame = pd.read_csv(path)
    return [{k: v for k, v in r.items() if not (isinstance(v, float) and math.isnan(v))}
            for r in frame.to_dict("records")]


def trace_of(files: dict) -> dict | None:
    raw = files.get("trace.json")
    return json.loads(raw) if raw else None
