"""What the GPU's clocks are: read-only snapshots and a sampler, through NVML or nvidia-smi.

``snapshot(uuid)`` reads the current, applications and maximum SM and memory clocks
and the clock-event ("throttle") reasons of one GPU, named by its UUID (CUDA's
device 0 when the caller knows it; without a UUID nothing is read, since an index
may name another GPU). NVML (``pynvml``, the ``nvidia-ml-py``
package) is tried first, ``nvidia-smi`` second (``NVIDIA_SMI`` names it, else
PATH; every call has a timeout). ``APP_GPU_CLOCKS=nvml|nvidia-smi`` forces one
source. A value that could not be read is ``None``, never a made-up zero.

``ClockSampler`` samples the SM/memory clocks and reasons between timed runs,
at most every ~20 ms (NVML only: a subprocess per sample would cost more than
the samples are worth), keeping a bounded number of samples.

Nothing here ever changes a clock: no NVML setter is called.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import statistics
import subprocess
import time
from datetime import datetime, timezone

SMI_TIMEOUT_S = 10
FIELDS = ("sm_mhz", "mem_mhz", "app_sm_mhz", "app_mem_mhz", "max_sm_mhz", "max_mem_mhz")
UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")

# NVML's clock-event reason bits (nvml.h: nvmlClocksEventReason*; nvidia-smi prints the same mask).
# UserDefinedClocks is an alias of ApplicationsClocksSetting (bit 0x2): locked clocks show up there.
REASON_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
# Reasons that hold the clocks below what was asked for. Idle, the applications-clock
# setting, sync boost and the display clock are reported, but are not throttling.
THROTTLING = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                        "hw_power_brake_slowdown"})

SMI_QUERY = ("uuid", "clocks.sm", "clocks.mem", "clocks.applications.graphics", "clocks.applications.memory",
             "clocks.max.sm", "clocks.max.mem", "{reasons}", "name")       # name last: it may hold a comma
SMI_REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")   # new, older drivers


def decode_reasons(mask: int | None) -> tuple[list[str] | None, bool | None]:
    """(reason names, throttled) for a clock-event reason bitmask; (None, None) when unread, negative or
    not an integer (no real mask is: decoding one would name every reason)."""
    if mask is None or isinstance(mask, bool) or not isinstance(mask, int) or mask < 0:
        return None, None
    names = [name for bit, name in REASON_BITS if mask & bit]
    known = 0
    for bit, _ in REASON_BITS:
        known |= bit
    if mask & ~known:
        names.append(f"unknown_0x{mask & ~known:x}")
    return names, any(n in THROTTLING for n in names)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _snapshot_doc(source: str, uuid, name, values: dict, mask) -> dict:
    reasons, throttled = decode_reasons(mask)
    if reasons is None:
        mask = None                             # negative or not an integer: unreadable, not decoded
    doc = {"available": True, "source": source, "at": _now(), "uuid": uuid, "name": name}
    doc |= {f: values.get(f) for f in FIELDS}
    doc |= {"reasons": reasons, "reasons_mask": None if mask is None else f"0x{mask:x}", "throttled": throttled}
    unread = [f for f in ("uuid",) + FIELDS if doc[f] is None] + (["reasons"] if mask is None else [])
    if unread:
        doc["unreadable"] = unread
    return doc


def unavailable(why: str) -> dict:
    return {"available": False, "why": why}


def snapshot(uuid: str | None = None, sources: tuple[str, ...] | None = None) -> dict:
    """The GPU's clocks now (see the module doc), or ``{"available": False, "why": ...}``."""
    sources = sources or _sources()
    whys = []
    for source in sources:
        reader = _read_nvml if source == "nvml" else _read_smi
        doc, why = reader(uuid)
        if doc is not None:
            return doc
        whys.append(f"{source}: {why}")
    return unavailable("; ".join(whys) or "no clock source")


def _sources() -> tuple[str, ...]:
    forced = os.environ.get("APP_GPU_CLOCKS", "").strip().lower()
    if forced in ("nvml", "nvidia-smi"):
        return (forced,)
    return ("nvml", "nvidia-smi")


# ---------------------------------------------------------------- NVML

def _pynvml():
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed (pip install nvidia-ml-py, or the [nvml] extra)"
    return pynvml, None


class _Nvml:
    """One nvmlInit .. nvmlShutdown, and the handle of the GPU named by ``uuid`` (none without one)."""

    def __init__(self, uuid: str | None):
        self.uuid = uuid
        self.nv, self.why = _pynvml()
        self.handle = None
        if not uuid:
            self.nv, self.why = None, NO_UUID
            return
        if self.nv is None:
            return
        try:
            self.nv.nvmlInit()
        except Exception as exc:  # noqa: BLE001 (NVMLError, a missing libnvidia-ml, ...)
            self.nv, self.why = None, f"nvmlInit failed ({_err(exc)})"
            return
        try:
            self.handle = self._handle(uuid)
        except Exception as exc:  # noqa: BLE001
            self.close()
            self.why = f"no NVML device {uuid} ({_err(exc)})"

    def _handle(self, uuid):
        try:
            return self.nv.nvmlDeviceGetHandleByUUID(uuid)
        except TypeError:                      # older pynvml wants bytes
            return self.nv.nvmlDeviceGetHandleByUUID(uuid.encode())

    def close(self):
        if self.nv is not None:
            try:
                self.nv.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self.nv = None

    def read(self, fn: str, *args):
        """fn(handle, *args), or None when it fails or this pynvml lacks it."""
        f = getattr(self.nv, fn, None)
        if f is None or self.handle is None:
            return None
        try:
            v = f(self.handle, *args)
        except Exception:  # noqa: BLE001 (NVML_ERROR_NOT_SUPPORTED and friends: unread, not zero)
            return None
        return v.decode() if isinstance(v, bytes) else v

    def reasons(self):
        for fn in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            v = self.read(fn)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                return v
            if v is not None:
                return None                    # negative or not an integer: unreadable
        return None

    def clock(self, fn: str, which: str):
        kind = getattr(self.nv, which, None)
        v = self.read(fn, kind) if kind is not None else None
        return int(v) if isinstance(v, int) and v > 0 else None


def _read_nvml(uuid):
    n = _Nvml(uuid)
    if n.handle is None:
        return None, n.why
    try:
        values = {
            "sm_mhz": n.clock("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"),
            "mem_mhz": n.clock("nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM"),
            "app_sm_mhz": n.clock("nvmlDeviceGetApplicationsClock", "NVML_CLOCK_SM"),
            "app_mem_mhz": n.clock("nvmlDeviceGetApplicationsClock", "NVML_CLOCK_MEM"),
            "max_sm_mhz": n.clock("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM"),
            "max_mem_mhz": n.clock("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_MEM"),
        }
        return _snapshot_doc("nvml", n.read("nvmlDeviceGetUUID"), n.read("nvmlDeviceGetName"), values,
                             n.reasons()), None
    finally:
        n.close()


def _err(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


# ---------------------------------------------------------------- nvidia-smi

def smi_path() -> str | None:
    """NVIDIA_SMI (a path or a name on PATH), else nvidia-smi on PATH; None when not runnable."""
    return shutil.which(os.environ.get("NVIDIA_SMI") or "nvidia-smi")


def _uint(text: str):
    """A CSV field as MHz, or None for [N/A], [Not Supported], empty, inf, nan, 1e999, ..."""
    v = text.strip()
    try:
        f = float(v)
    except ValueError:
        return None
    return int(f) if math.isfinite(f) and f > 0 else None


def _mask(text: str):
    """A reason bitmask, or None when unreadable: not an integer, or negative."""
    v = text.strip()
    try:
        mask = int(v, 16) if v.lower().startswith("0x") else int(v)
    except ValueError:
        return None
    return mask if mask >= 0 else None


def parse_smi_line(line: str) -> tuple[str | None, dict, int | None, str | None]:
    """(uuid, clocks, reason mask, name) from one line of the SMI_QUERY answer."""
    parts = [p.strip() for p in line.split(",", len(SMI_QUERY) - 1)]
    if len(parts) < len(SMI_QUERY):
        raise ValueError(f"expected {len(SMI_QUERY)} fields, got {len(parts)}: {line!r}")
    uuid = parts[0] if UUID_RE.match(parts[0]) else None
    values = dict(zip(FIELDS, (_uint(p) for p in parts[1:7])))
    name = parts[8] if parts[8] and not parts[8].startswith("[") else None
    return uuid, values, _mask(parts[7]), name


NO_UUID = ("this GPU's UUID is unknown, and without it no GPU is read: an nvidia-smi/NVML index may name another "
           "GPU than CUDA's device (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER)")


def _read_smi(uuid):
    if not uuid:
        return None, NO_UUID
    smi = smi_path()
    if not smi:
        return None, "nvidia-smi not found (set NVIDIA_SMI or put it on PATH)"
    why = None
    for reason_field in SMI_REASON_FIELDS:
        query = ",".join(SMI_QUERY).replace("{reasons}", reason_field)
        try:
            out = subprocess.run([smi, "-i", uuid, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, f"nvidia-smi did not answer within {SMI_TIMEOUT_S} s"
        except OSError as exc:
            return None, f"nvidia-smi could not run ({exc.strerror or exc})"
        text = (out.stdout or "").strip()
        if out.returncode == 0 and text:
            try:
                got_uuid, values, mask, name = parse_smi_line(text.splitlines()[0])
            except ValueError as exc:
                return None, f"unexpected nvidia-smi answer ({exc})"
            return _snapshot_doc("nvidia-smi", got_uuid, name, values, mask), None
        why = (text or (out.stderr or "").strip() or f"exit {out.returncode}").splitlines()[0]
        if "field" not in why.lower():         # only an unknown field is worth the older name
            break
    return None, f"nvidia-smi failed ({why})"


# ---------------------------------------------------------------- sampler

class ClockSampler:
    """Samples SM/memory clocks and reasons between timed runs, never during one (NVML only).

    The caller calls ``poll()`` before each run, outside its timed region; a sample is taken when
    ``interval_s`` has passed since the last one, and one more at ``stop()``. At most ``max_samples``
    are kept: when full, every other sample is dropped and the interval doubles, so a long run is still
    covered end to end. Use as a context manager around the timed runs; ``summary()`` afterwards.

    Why not a thread sampling beside the runs, as this once did: a thread reading NVML every 20 ms made
    event mode's default join 16.4 us slower (95% interval 11.5 to 22.4 us, 2.9%) on one H100 host and
    18.8 us (11.9 to 24.9) on another, in interleaved blocks of 30 runs with and without it; the default
    overlay 28.7 us (14.7 to 50.0) on the first, within the noise on the second. Reads between runs cost
    the join 6.6 us (0.6 to 12.9) and 3.9 us (-6.2 to 11.2), the overlay nothing the blocks resolved. A
    plan bound by its host's launches pays for every NVML call and every hand-over of Python's
    interpreter lock made during it. Between runs the GPU has just finished a run, so its clocks and clock-event
    reasons still show the state the run saw."""

    def __init__(self, uuid: str | None, interval_s: float = 0.02, max_samples: int = 4096):
        self.uuid, self.interval_s, self.max_samples = uuid, interval_s, max(2, max_samples)
        self.samples: list[tuple[int | None, int | None, int | None]] = []
        self.why: str | None = None
        self.seconds = 0.0
        self._nvml: _Nvml | None = None
        self._t0 = self._last = 0.0

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self) -> None:
        if "nvml" not in _sources():
            self.why = "sampling needs NVML; APP_GPU_CLOCKS selects nvidia-smi"
            return
        self._nvml = _Nvml(self.uuid)
        if self._nvml.handle is None:
            self.why, self._nvml = f"no samples: NVML unavailable ({self._nvml.why})", None
            return
        self._t0 = time.monotonic()
        self._sample()

    def poll(self) -> None:
        """Between runs: a sample if ``interval_s`` has passed since the last one."""
        if self._nvml is not None and time.monotonic() - self._last >= self.interval_s:
            self._sample()

    def _sample(self) -> None:
        n = self._nvml
        sm = n.clock("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM")
        mem = n.clock("nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM")
        self.samples.append((sm, mem, n.reasons()))
        self._last = time.monotonic()
        if len(self.samples) >= self.max_samples:
            self.samples = self.samples[::2]
            self.interval_s *= 2

    def stop(self) -> None:
        if self._nvml is not None:
            self._sample()          # the last one: a short run still gets its start and its end
            self.seconds = time.monotonic() - self._t0
            self._nvml.close()
            self._nvml = None

    def summary(self) -> dict:
        return summarise_samples(self.samples, self.interval_s, self.seconds, self.why)


def summarise_samples(samples, interval_s: float, seconds: float, why: str | None = None) -> dict:
    """n, min/median/max SM and memory MHz, the reasons seen and how many samples were throttled."""
    if not samples:
        return {"n": 0, "why": why or "no samples were taken"}

    def stats(values):
        vals = [v for v in values if v is not None]
        if not vals:
            return None
        return {"min": min(vals), "median": statistics.median(vals), "max": max(vals), "unread": len(values) - len(vals)}

    seen, throttled = [], 0
    for _, _, mask in samples:
        names, thr = decode_reasons(mask)
        seen += [r for r in names or () if r not in seen]
        throttled += bool(thr)
    return {"n": len(samples), "source": "nvml", "interval_ms": round(interval_s * 1e3, 3),
            "when": "between timed runs (at most one sample per interval), never during one",
            "seconds": round(seconds, 4),
            "sm_mhz": stats([s[0] for s in samples]), "mem_mhz": stats([s[1] for s in samples]),
            "reasons_seen": seen, "throttled_samples": throttled,
            "reasons_unread": sum(1 for s in samples if s[2] is None)}
