"""Sizes that cannot fit are refused before anything is allocated, with the limit named.

The plan's footprint (a conservative estimate, see each plan's ``footprint``) is
checked against 32-bit index limits of the kernels, the host memory available
now, and the free memory of the GPU that will run.
"""
from __future__ import annotations

from app.errors import BadParameter

INDEX_LIMIT = 2**31 - 1


def available_host_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable (kB in the file) in bytes; None where it cannot be read."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def free_device_bytes() -> int | None:
    try:
        import cupy

        return int(cupy.cuda.runtime.memGetInfo()[0])
    except Exception:  # noqa: BLE001  (no usable GPU: nothing to check against)
        return None


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def check_fits(plan, device: str, host_bytes: int | None = None, device_free: int | None = None) -> None:
    fp = plan.footprint()
    if fp is None:
        return
    for what, count in fp.indices.items():
        if count > INDEX_LIMIT:
            raise BadParameter(f"{what} = {count:,} exceeds the kernels' 32-bit index limit ({INDEX_LIMIT:,}); "
                               f"use a smaller --{fp.scale}")
    # On the CPU the "device" buffers live in host memory too.
    host_need = fp.host_bytes + (fp.device_bytes if device != "gpu" else 0)
    checks = [("host", host_need, available_host_bytes() if host_bytes is None else host_bytes)]
    if device == "gpu":
        checks.append(("GPU", fp.device_bytes, free_device_bytes() if device_free is None else device_free))
    for where, need, have in checks:
        if have is not None and need > have:
            raise BadParameter(f"these sizes need about {_gb(need)} of {where} memory and {_gb(have)} is free; "
                               + _largest(plan, fp.scale, where, have, device))


def _largest(plan, scale: str, where: str, have: int, device: str) -> str:
    """The largest value of ``scale`` that fits, the other sizes unchanged (the need is linear in it)."""
    def need(value):
        fp = type(plan)({**plan.params, scale: value}).footprint()
        return fp.device_bytes if where == "GPU" else fp.host_bytes + (fp.device_bytes if device != "gpu" else 0)

    current = plan.params[scale]
    at_one = need(1)
    if at_one > have or current <= 1:
        return f"even --{scale} 1 does not fit: reduce the other sizes"
    per_unit = (need(current) - at_one) / (current - 1)
    return f"use at most about --{scale} {int(1 + (have - at_one) / per_unit):,} (with the other sizes unchanged)"
