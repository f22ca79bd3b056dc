"""Overlay: GPU plan, CPU plan and shapely on the same layers, side by side in one run.

    python -m tests.benchmark.bench_overlay [--sizes 10k:10k,100k:100k] [--versions v1,v2] [--runs 10]

GPU: warm time of the stages after the owned-buffer build (layers already on the
device), the host->device build on its own line, end to end (host arrays in and
out, host clock). shapely: STRtree query +
intersection(...).area, one thread. Every output is checked against shapely
(the verification's rule: within 1e-9 of the smaller polygon's area, with rounding's floor) before a ratio is
printed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


from app.kernel.overlay.oracle import compare, shapely_overlay  # noqa: E402
from app.kernel.plan import get_plan_class  # noqa: E402
from app.runtime.device import select  # noqa: E402
from tests.benchmark.bench_join import e2e_text, ms, one_mark_text, pace_text, parse_size, time_plan  # noqa: E402


def time_shapely(inputs, runs: int):
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = shapely_overlay(inputs.left, inputs.right)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10k:10k,100k:100k", help="LEFT:RIGHT,...")
    ap.add_argument("--versions", default=None, help="comma-separated; default: every version")
    ap.add_argument("--vertices", type=int, default=16)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--cpu-runs", type=int, default=2)
    ap.add_argument("--shapely-runs", type=int, default=2)
    ap.add_argument("--no-gpu", action="store_true")
    args = ap.parse_args(argv)
    import shapely

    from app.kernel.plan import kernels

    versions = args.versions.split(",") if args.versions else sorted(kernels()["overlay"])
    gpu = not args.no_gpu and select("auto").selected == "gpu"
    lines, ok = [], True
    for size in args.sizes.split(","):
        nl, nr = (parse_size(x) for x in size.split(":"))
        base = get_plan_class("overlay", versions[-1])({"left": nl, "right": nr, "vertices": args.vertices})
        inputs = base.make_inputs()
        la, rb = shapely.area(inputs.left.to_shapely()), shapely.area(inputs.right.to_shapely())
        t_shp, ref = time_shapely(inputs, args.shapely_runs)
        lines.append(f"{nl:,} x {nr:,}: shapely {t_shp * 1e3:10.2f} ms, {len(ref[0]):,} pairs")
        for v in versions:
            plan = get_plan_class("overlay", v)({"left": nl, "right": nr, "vertices": args.vertices})
            cpu = time_plan(plan, inputs, "cpu", args.cpu_runs)
            c_ok = compare(cpu["out"], ref, la, rb)["matches"]
            line = f"  {v} cpu {cpu['total'] * 1e3:10.2f} ms (shapely/cpu {t_shp / cpu['total']:5.2f}x, ok={c_ok})"
            ok &= c_ok
            if gpu:
                gp = time_plan(plan, inputs, "gpu", args.runs)
                g_ok = all(compare(out, ref, la, rb)["matches"] for out in (gp["out"], gp.get("out_pinned", gp["out"])))
                ok &= g_ok
                e2e = {"gpu_e2e": gp["e2e"], "gpu_e2e_ci": gp.get("e2e_ci"), "gpu_e2e_pinned": gp.get("e2e_pinned"),
                       "gpu_e2e_pinned_ci": gp.get("e2e_pinned_ci"), "gpu_after_one_mark": gp["after_one_mark"],
                       "gpu_after_one_mark_ci": gp.get("after_one_mark_ci")}
                line += (f"  gpu {ms(gp['after'], gp.get('after_ci'))} (min {gp['after_min'] * 1e3:.3f})"
                         f"{one_mark_text(e2e)} + H2D "
                         f"{gp['build'] * 1e3:.3f} ms  {e2e_text(e2e)}  shapely/gpu "
                         f"{t_shp / gp['after']:8.0f}x after build, {t_shp / gp['e2e']:6.0f}x end to end  ok={g_ok}  "
                         f"{pace_text(gp)}  [{gp['device_name']}]")
            lines.append(line)
            print(line, flush=True)
    print("\noverlay benchmark (medians, GPU ones with their ~95% intervals in brackets; GPU: stages after the "
          "owned-buffer build, layers on device, from runs with every stage marked and, in brackets after, from "
          "runs with no mark between those stages)")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
