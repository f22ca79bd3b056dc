"""Which device runs a plan, and what that device is.

``planner`` is what this machine would prefer (a usable GPU wins); ``selected``
is what actually ran. They differ only when the planner wanted the GPU and the
code fell back to the CPU -- and then ``reason`` says why (truth rule 1).
"""
from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from app.errors import BadParameter, DeviceUnavailable

DEVICES = ("auto", "cpu", "gpu")


@dataclass
class Selection:
    requested: str
    planner: str
    selected: str
    reason: str
    device_name: str
    info: dict = field(default_factory=dict)
    # The GPU's clocks when a subprocess mode's session began (runtime.clocks): parent-side only.
    clock_start: dict | None = field(default=None, repr=False, compare=False)

    def fall_back_to_cpu(self, why: str) -> None:
        self.selected, self.reason = "cpu", why
        self.device_name, self.info = cpu_name(), cpu_info()

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("clock_start")
        return d


@lru_cache(maxsize=1)
def probe_gpu() -> tuple[bool, str, dict]:
    """(usable, reason, info) for CUDA device 0, without raising."""
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (pip install -e '.[cuda13]' or '.[cuda12]')", {}
    try:
        rt = cupy.cuda.runtime
        count = rt.getDeviceCount()
        if count == 0:
            return False, "CUDA reports no devices", {}
        props = rt.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        info = {
            "name": name,
            "index": 0,
            "visible_devices": count,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "compute_capability": f"{props['major']}.{props['minor']}",
            "sm_count": props["multiProcessorCount"],
            "memory_bytes": props["totalGlobalMem"],
            "l2_bytes": props["l2CacheSize"],
            "driver_version": _cuda_version(rt.driverGetVersion()),
            "runtime_version": _cuda_version(rt.runtimeGetVersion()),
            "cupy_version": cupy.__version__,
            # The physical GPU, whatever CUDA_VISIBLE_DEVICES renumbers: what the device lock is keyed by.
            "uuid": _uuid(props.get("uuid"), _driver_uuid),
            "pci_bus_id": _pci(props),
        }
        # A trivial kernel proves the context and JIT path work, not just enumeration.
        float((cupy.arange(4, dtype=cupy.float64) * 2).sum())
        return True, "CUDA device 0 is usable", info
    except Exception as exc:  # CUDARuntimeError, CompileException, driver mismatch...
        return False, f"no usable CUDA device: {str(exc).splitlines()[0]}", {}


def _uuid(raw, fallback=None) -> str | None:
    """GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx from the 16 bytes CUDA reports, as nvidia-smi prints it.

    CuPy hands the 16 bytes over as a C string, cut at the first zero byte: a GPU whose UUID holds one
    (GPU-6ac39380-3100-... on a lent H200 node) came back short. ``fallback`` then reads all 16 from the
    driver. Never raises: an identity the driver does not report must not make a usable GPU unusable."""
    for source in (lambda: raw, fallback):
        try:
            got = source() if source is not None else None
            h = bytes(got).hex() if isinstance(got, (bytes, bytearray, memoryview)) else bytes(list(got)).hex()
        except Exception:  # TypeError, ValueError, a driver call that failed
            continue
        if len(h) == 32:
            return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return None


def _driver_uuid() -> bytes | None:
    """The 16 UUID bytes of CUDA device 0 from the driver API (cuDeviceGetUuid), zero bytes included."""
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    dev, buf = ctypes.c_int(), ctypes.create_string_buffer(16)
    if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        return None
    get = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
    return buf.raw if get(buf, dev) == 0 else None


def _pci(props: dict) -> str | None:
    try:
        return f"{int(props['pciDomainID']):04x}:{int(props['pciBusID']):02x}:{int(props['pciDeviceID']):02x}"
    except (KeyError, TypeError, ValueError):
        return None


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_info() -> dict:
    return {"name": cpu_name(), "logical_cpus": os.cpu_count(), "machine": platform.machine()}


def select(requested: str) -> Selection:
    if requested not in DEVICES:
        raise BadParameter(f"unknown device {requested!r}; use one of {', '.join(DEVICES)}")
    usable, why, info = probe_gpu()
    planner = "gpu" if usable else "cpu"
    if requested == "gpu" and not usable:
        raise DeviceUnavailable(f"--device gpu was asked for but {why}; use --device cpu or auto")
    if requested == "cpu":
        return Selection(requested, planner, "cpu", "--device cpu", cpu_name(), cpu_info())
    if usable:
        return Selection(requested, planner, "gpu", why, info["name"], info)
    return Selection(requested, planner, "cpu", f"no GPU: {why}", cpu_name(), cpu_info())
