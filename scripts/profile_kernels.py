#!/usr/bin/env python3
"""Profile the join and overlay kernels and print their stage traces as one JSON document.

    python scripts/profile_kernels.py [--kernel join|overlay|all] [--rows N] [--join-rows N]
        [--overlay-rows N] [--tile-size N] [--repeat N] [--nvtx] [--device auto|cpu|gpu]

For scripts and dashboards that want machine-readable numbers without report folders:
each trace is what `python -m app.kernel <kernel> --prof_type event` would write as
trace.json for the kernel's default version, made by the same code; nothing is written
to disk, the document goes to stdout. Rows: join gets N points and N/10 polygons,
overlay N polygons per layer. --tile-size sets the block size of every stage that has
one. A profile takes the same device lock as the CLI (one at a time per device).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from app.errors import AppError, BadParameter, OneLineParser  # noqa: E402
from app.kernel.plan import get_plan_class  # noqa: E402
from app.runtime.profiling import ProfileOptions, get_mode  # noqa: E402
from app.runtime.stats import MIN_CI_SAMPLES  # noqa: E402

KERNELS = ("join", "overlay")


def params_for(kernel: str, rows: int) -> dict:
    if kernel == "join":
        return {"points": rows, "polygons": max(1, rows // 10)}
    return {"left": rows, "right": rows}


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


def parser() -> OneLineParser:
    ap = OneLineParser(prog="scripts/profile_kernels.py", description=__doc__.split("\n\n")[0],
                       epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", choices=(*KERNELS, "all"), default="all",
                    help="which kernel to profile (default: all)")
    ap.add_argument("--rows", type=int, default=10_000, metavar="N",
                    help="input size: join's points (and a tenth as many polygons), overlay's polygons per layer "
                         "(default: 10000)")
    ap.add_argument("--join-rows", type=int, metavar="N", help="join's input size (default: --rows)")
    ap.add_argument("--overlay-rows", type=int, metavar="N", help="overlay's input size (default: --rows)")
    ap.add_argument("--tile-size", type=int, metavar="N",
                    help="block size of every stage that has one (default: each stage's own)")
    ap.add_argument("--repeat", type=int, default=3, metavar="N",
                    help=f"timed runs per stage (default: 3); under {MIN_CI_SAMPLES} a stage's median gets no 95%% "
                         "interval (it is shown as missing)")
    ap.add_argument("--nvtx", action="store_true", help="emit NVTX ranges, for Nsight Systems (default: off)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"),
                    help="where to run (default: auto, the GPU where one is usable); gpu fails without one")
    return ap


def main(argv=None) -> int:
    try:
        args = parser().parse_args(argv)
        for name in ("rows", "join_rows", "overlay_rows", "repeat"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise BadParameter(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        kernels = KERNELS if args.kernel == "all" else (args.kernel,)
        rows = {"join": args.join_rows if args.join_rows is not None else args.rows,
                "overlay": args.overlay_rows if args.overlay_rows is not None else args.rows}
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
