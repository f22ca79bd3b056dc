"""Calibrated peaks: what this very GPU sustains, measured by ``python -m app.kernel calibrate``.

Datasheet peaks are what a model promises; a card sustains less (DRAM refresh and protocol
overhead, its power limit, its clocks). A roofline against calibrated peaks says how far a
kernel is from what is reachable here. Calibrations are cached per GPU UUID -- two cards of
one model differ -- under ``$APP_CACHE_DIR/calibration/`` (default ``~/.cache/app-kernel``),
and every roofline says which peaks it used.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from app.analysis.devices import match_device
from app.runtime import cache

FIELDS = {"uuid": str, "name": str, "measured_at": str, "memory_gbps": float, "fp64_tflops": float,
          "fp32_tflops": float}


def cache_dir() -> Path:
    return cache.cache_dir("calibration")


def _path(uuid: str) -> Path:
    return cache_dir() / (re.sub(r"[^A-Za-z0-9-]", "_", uuid) + ".json")


def save(calibration: dict) -> Path:
    return cache.write_json(_path(calibration["uuid"]), calibration)


def load(uuid: str | None) -> tuple[dict | None, str | None]:
    """(calibration, None), or (None, why) when there is none usable for this GPU (None when there is none)."""
    if not uuid:
        return None, None
    path = _path(uuid)
    doc, why = cache.read_json(path)
    if doc is None:
        return None, (f"{why}; run calibrate again" if why else None)
    for key, kind in FIELDS.items():
        value = doc.get(key) if isinstance(doc, dict) else None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is float and not (math.isfinite(value) and value > 0)):
            return None, f"{path} has no valid {key!r}; run calibrate again"
    if doc["uuid"] != uuid:
        return None, f"{path} records {doc['uuid']}, not {uuid}"
    _, sheet = match_device(doc["name"])
    why = _implausible(doc, {"memory_gbps": sheet["memory_gbps"], "fp64_tflops": sheet["peak_tflops"].get("fp64"),
                             "fp32_tflops": sheet["peak_tflops"].get("fp32")}) if sheet else None
    if why:
        return None, f"{path}: {why}"
    return doc, None


def spec_for(device_name: str, uuid: str | None = None) -> tuple[str | None, dict | None]:
    """match_device's (model, spec), with this GPU's calibrated peaks in place of the datasheet's when a
    calibration of this UUID is cached. ``spec["peaks_source"]`` says which, and keeps the datasheet's."""
    key, spec = match_device(device_name)
    if spec is None:
        return key, None
    spec = dict(spec, peak_tflops=dict(spec["peak_tflops"]))
    cal, why = load(uuid)
    spec["datasheet"] = {"memory_gbps": spec["memory_gbps"], "fp64_tflops": spec["peak_tflops"].get("fp64"),
                         "fp32_tflops": spec["peak_tflops"].get("fp32")}
    if cal is not None and match_device(cal["name"])[0] != key:
        cal, why = None, f"it was measured on a {cal['name']}, not a {device_name}; run calibrate again"
    if cal is None:
        spec["peaks_source"] = "datasheet" + (f" (calibration ignored: {why})" if why else "")
        return key, spec
    spec["memory_gbps"] = cal["memory_gbps"]
    spec["peak_tflops"]["fp64"], spec["peak_tflops"]["fp32"] = cal["fp64_tflops"], cal["fp32_tflops"]
    spec["peaks_source"] = f"calibrated on this GPU, {cal['uuid'][:12]}…, at {cal['measured_at']}"
    spec["calibration"] = cal
    return key, spec


# A measured peak above the datasheet's cannot be (the datasheet's is the hardware's own bound; a few percent of
# clock rounding aside), and one under a fifth of it measured something else (a throttled or shared card, a
# broken run): neither is used as a roof, and the roofline says why.
PLAUSIBLE = (0.2, 1.05)


def _implausible(cal: dict, sheet: dict) -> str | None:
    """Why a calibration's peaks cannot be this model's, or None."""
    lo, hi = PLAUSIBLE
    for key in ("memory_gbps", "fp64_tflops", "fp32_tflops"):
        ref = sheet.get(key)
        if ref and not lo * ref <= cal[key] <= hi * ref:
            return (f"its {key} {cal[key]:,.1f} is {cal[key] / ref:.2f}x the datasheet's {ref:,.1f}, outside "
                    f"{lo:g}-{hi:g}x: not a peak of this card; run calibrate again")
    return None


def cached() -> list[dict]:
    """Every valid calibration in the cache (for the devices listing)."""
    out = []
    for p in sorted(cache_dir().glob("*.json")) if cache_dir().is_dir() else []:
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        cal, _ = load(doc.get("uuid") if isinstance(doc, dict) else None)
        if cal:
            out.append(cal)
    return out
