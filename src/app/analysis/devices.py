"""conf/devices.json: peak specs per device model, matched on the CUDA device name."""
from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def devices_path() -> Path:
    return Path(os.environ.get("APP_DEVICES_JSON", REPO_ROOT / "conf" / "devices.json"))


@lru_cache(maxsize=4)
def load_devices(path: str | None = None) -> dict:
    with open(path or devices_path()) as f:
        return json.load(f)


def match_device(name: str, table: dict | None = None) -> tuple[str | None, dict | None]:
    """(model key, spec with defaults applied) of the first entry whose pattern is in ``name``."""
    table = table or load_devices()
    lowered = (name or "").lower()
    for key, spec in table.get("devices", {}).items():
        if any(p.lower() in lowered for p in spec.get("match", [])):
            merged = dict(spec)
            defaults = table.get("defaults", {})
            merged["sources"] = {"default": defaults.get("source", "")} | spec.get("sources", {})
            return key, merged
    return None, None


def ridge_points(spec: dict) -> dict[str, float]:
    """FLOP/byte where each precision's compute roof meets the memory roof."""
    gbps = spec["memory_gbps"]
    return {prec: tflops * 1e12 / (gbps * 1e9) for prec, tflops in spec.get("peak_tflops", {}).items()}
