"""conf/devices.json: peak specs per device model, matched on the CUDA device name."""
from __future__ import annotations

import json
import os
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

from app.errors import AppError

REPO_ROOT = Path(__file__).resolve().parents[3]
# A non-editable install carries conf/devices.json as a data file (pyproject: [tool.setuptools.data-files]).
INSTALLED = ("share", "app-kernel-rails", "devices.json")


def candidate_paths() -> list[Path]:
    """Where conf/devices.json is looked for: $APP_DEVICES_JSON, the checkout, then the installed copy."""
    if os.environ.get("APP_DEVICES_JSON"):
        return [Path(os.environ["APP_DEVICES_JSON"])]
    prefixes = dict.fromkeys([sysconfig.get_path("data"), sys.prefix, sys.base_prefix])
    return [REPO_ROOT / "conf" / "devices.json"] + [Path(p, *INSTALLED) for p in prefixes if p]


def devices_path() -> Path:
    for p in candidate_paths():
        if p.is_file():
            return p
    raise AppError("conf/devices.json was not found (looked in " + ", ".join(map(str, candidate_paths()))
                   + "); reinstall the package or set APP_DEVICES_JSON to the file")


@lru_cache(maxsize=4)
def load_devices(path: str | None = None) -> dict:
    p = path or devices_path()
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise AppError(f"{p} is not a readable devices table ({exc}); set APP_DEVICES_JSON to a valid one") from None


def match_device(name: str, table: dict | None = None) -> tuple[str | None, dict | None]:
    """(model key, spec with defaults applied) of the entry whose pattern is in ``name``; the longest pattern
    wins: "NVIDIA H200 NVL" is the NVL card, not the H200 SXM whose CUDA name, "NVIDIA H200", is a prefix."""
    table = table or load_devices()
    lowered = (name or "").lower()
    hits = [(len(p), key, spec) for key, spec in table.get("devices", {}).items()
            for p in spec.get("match", []) if p.lower() in lowered]
    if not hits:
        return None, None
    _, key, spec = max(hits, key=lambda h: h[0])
    merged = dict(spec)
    defaults = table.get("defaults", {})
    merged["sources"] = {"default": defaults.get("source", "")} | spec.get("sources", {})
    return key, merged


def ridge_points(spec: dict) -> dict[str, float]:
    """FLOP/byte where each precision's compute roof meets the memory roof."""
    gbps = spec["memory_gbps"]
    return {prec: tflops * 1e12 / (gbps * 1e9) for prec, tflops in spec.get("peak_tflops", {}).items()}


def describe(present_name: str | None) -> tuple[list[dict], str]:
    """One row per model of the table, the present GPU marked; and a line about the present GPU."""
    table = load_devices()
    key, _ = match_device(present_name) if present_name else (None, None)
    rows = []
    for model, spec in table.get("devices", {}).items():
        peaks = spec.get("peak_tflops", {})
        rows.append({"present": model == key, "model": model, "match": spec.get("match", []),
                     "fp64_tflops": peaks.get("fp64"), "fp32_tflops": peaks.get("fp32"),
                     "memory_gbps": spec.get("memory_gbps"), "sm_count": spec.get("sm_count"),
                     "l2_mib": spec.get("l2_bytes", 0) / 2**20 if spec.get("l2_bytes") else None,
                     "boost_clock_mhz": spec.get("boost_clock_mhz"), "peaks": "datasheet"})
    if present_name is None:
        line = "No usable GPU here: every model is listed, none is marked."
    elif key is None:
        line = (f"The GPU here, {present_name!r}, matches no entry: it still profiles, and its reports say there is "
                f"no roofline. Add its datasheet peaks to {devices_path()}.")
    else:
        line = f"The GPU here, {present_name!r}, matches {key!r} (marked *)."
    return rows, line
