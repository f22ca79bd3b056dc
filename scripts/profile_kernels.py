#!/usr/bin/env python3
"""The seed-000 profiling rail: one machine-readable JSON document of stage traces.

    python scripts/profile_kernels.py --kernel join|overlay|all [--rows N] [--join-rows N]
        [--overlay-rows N] [--tile-size N] [--repeat N] [--nvtx] [--device auto|cpu|gpu]

Each trace is event mode's trace.json for the kernel's default version, produced by
the same plans through the same code path as `python -m app.kernel` (EventMode);
nothing is written to disk. Rows: join gets N points and N/10 polygons, overlay
N polygons per layer. --tile-size sets the block size of every stage that has one.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from app.errors import AppError, BadParameter  # noqa: E402
from app.kernel.plan import get_plan_class  # noqa: E402
from app.runtime.profiling import ProfileOptions, get_mode  # noqa: E402

KERNELS = ("join", "overlay")


def params_for(kernel: str, rows: int) -> dict:
    if kernel == "join":
        return {"points": rows, "polygons": max(1, rows // 10)}
    return {"left": max(1, rows), "right": max(1, rows)}


def tiling_for(cls, tile_size: int | None) -> dict:
    if tile_size is None:
        return {}
    out = {}
    for spec in cls.stages:
        if "block" in spec.tunables:
            if tile_size not in spec.tunables["block"]:
                raise BadParameter(f"--tile-size {tile_size} is not allowed for {cls.kernel}.{spec.name}; "
                                   f"use one of {', '.join(map(str, spec.tunables['block']))}")
            out[spec.name] = {"block": tile_size}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=(*KERNELS, "all"), default="all")
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--join-rows", type=int)
    ap.add_argument("--overlay-rows", type=int)
    ap.add_argument("--tile-size", type=int)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nvtx", action="store_true")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    args = ap.parse_args(argv)
    try:
        if args.repeat < 1 or args.rows < 1:
            raise BadParameter("--repeat and --rows must be >= 1")
        kernels = KERNELS if args.kernel == "all" else (args.kernel,)
        rows = {"join": args.join_rows or args.rows, "overlay": args.overlay_rows or args.rows}
        mode = get_mode("event")
        traces = []
        for kernel in kernels:
            cls = get_plan_class(kernel)
            plan = cls(params_for(kernel, rows[kernel]), tiling=tiling_for(cls, args.tile_size))
            options = ProfileOptions(device=args.device, bench_runs=args.repeat, warmup=1, nvtx=args.nvtx,
                                     argv=["scripts/profile_kernels.py", *(argv or sys.argv[1:])])
            traces.append(mode.profile(plan, options).trace)
    except AppError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    doc = {"kernel": args.kernel, "rows": {k: rows[k] for k in kernels}, "repeat": args.repeat,
           "nvtx_requested": args.nvtx, "tile_size": args.tile_size, "traces": traces}
    json.dump(doc, sys.stdout, indent=2, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
