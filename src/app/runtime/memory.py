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
            names = _drivers(plan, lambda f: f.indices[what], raised_only=True)
            options = " or ".join(f"--{n}" for n in names)
            raise BadParameter(f"{what} = {count:,} exceeds the kernels' 32-bit index limit ({INDEX_LIMIT:,}); "
                               f"use a smaller {options}")
    # On the CPU the "device" buffers live in host memory too.
    host_need = fp.host_bytes + (fp.device_bytes if device != "gpu" else 0)
    checks = [("host", host_need, available_host_bytes() if host_bytes is None else host_bytes)]
    if device == "gpu":
        checks.append(("GPU", fp.device_bytes, free_device_bytes() if device_free is None else device_free))
    for where, need, have in checks:
        if have is not None and need > have:
            scale = _drivers(plan, lambda f: _need(f, where, device))[0]
            raise BadParameter(f"these sizes need about {_gb(need)} of {where} memory and {_gb(have)} is free; "
                               + _largest(plan, scale, where, have, device))


def _need(fp, where: str, device: str) -> int:
    return fp.device_bytes if where == "GPU" else fp.host_bytes + (fp.device_bytes if device != "gpu" else 0)


def _with(plan, name: str, value):
    return type(plan)({**plan.params, name: value})


def _drivers(plan, measure, raised_only: bool = False) -> list[str]:
    """The whole-number sizes that ``measure(footprint)`` grows with, the one raised furthest above its default
    first (a tie: the plan's own scale first): the options a refusal names. The plan's scale alone would name
    --polygons for --vertices 100000000. ``raised_only``: only those above their defaults, where any is."""
    fp = plan.footprint()
    now = measure(fp)
    found = []
    for order, p in enumerate(plan.params_spec):
        if p.type is not int or p.choices:
            continue
        value = plan.params[p.name]
        if measure(_with(plan, p.name, max(2 * value, value + 1)).footprint()) > now:
            ratio = value / max(p.default, 1)
            found.append((-ratio, p.name != fp.scale, order, p.name))
    found.sort()
    names = [name for *_, name in found] or [fp.scale]
    if raised_only:
        raised = [name for ratio, *_, name in found if -ratio > 1]
        return raised or names
    return names


def _largest(plan, scale: str, where: str, have: int, device: str) -> str:
    """The largest value of ``scale`` that fits, the other sizes unchanged (the need is linear in it)."""
    def need(value):
        return _need(_with(plan, scale, value).footprint(), where, device)

    spec = next(p for p in plan.params_spec if p.name == scale)
    least = max(spec.minimum or 1, 1)           # --vertices starts at 3
    current = plan.params[scale]
    at_least = need(least)
    if at_least > have or current <= least:
        return f"even --{scale} {least} does not fit: reduce the other sizes"
    per_unit = (need(current) - at_least) / (current - least)
    return (f"use at most about --{scale} {int(least + (have - at_least) / per_unit):,} "
            "(with the other sizes unchanged)")
