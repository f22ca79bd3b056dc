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
            "uuid": _uuid(props.get("uuid")),
            "pci_bus_id": _pci(props),
        }
        # A trivial kernel proves the context and JIT path work, not just enumeration.
        float((cupy.arange(4, dtype=cupy.float64) * 2).sum())
        return True, "CUDA device 0 is usable", info
    except Exception as exc:  # CUDARuntimeError, CompileException, driver mismatch...
        return False, f"no usable CUDA device: {str(exc).splitlines()[0]}", {}


def _uuid(raw) -> str | None:
    """GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx from the 16 bytes CUDA reports, as nvidia-smi prints it.

    Never raises: an identity the driver does not report must not make a usable GPU unusable."""
    try:
        h = bytes(raw).hex() if isinstance(raw, (bytes, bytearray, memoryview)) else bytes(list(raw)).hex()
    except (TypeError, ValueError):
        return None
    if len(h) != 32:
        return None
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


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
