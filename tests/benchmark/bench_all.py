"""Every kernel and version against shapely, measured side by side in one run, one table of ratios.

    python -m tests.benchmark.bench_all [--sizes join=100k:10k,1M:100k;overlay=10k:10k] [--runs 10]

Per kernel, version and size: shapely (one thread), the CPU plan, and on a GPU the
plan after the host->device build, the build itself, and end to end (build + the
rest: host arrays in), and end to end on the host clock with the result copied back
(host arrays in, host arrays out). Every output is checked against shapely before its ratio is
printed; a mismatch makes the exit status 1. Holds the device lock for the whole run,
so no profile shares the GPU with it.

Each row also gives the host CPU's pace while that version ran: the median time of the fixed
Python loop event mode times before its runs (app.runtime.host_pace), taken just before and just
after the version's timings. The versions run one after another, and on a shared host the CPU can
slow between them; where two rows' loops differ, so did the host. In one run on an H100 host, join
v1 and v2 at 100k x 10k ran while the loop took 85.3 and 80.4 us, v3 and v4 while it took 49.4 and
47.8 us: their 0.35-0.53 against 0.19-0.25 ms after the build was partly the host's.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import numpy as np  # noqa: E402

from app.kernel.plan import get_plan_class, kernels  # noqa: E402
from app.runtime.host_pace import loop_seconds  # noqa: E402
from app.runtime.device import select  # noqa: E402
from app.runtime.lock import device_key, device_lock  # noqa: E402
from tests.benchmark import bench_join, bench_overlay  # noqa: E402

DEFAULT_SIZES = "join=100k:10k,1M:100k;overlay=10k:10k,100k:100k"


def parse_sizes(text: str) -> dict[str, list[tuple[int, int]]]:
    out = {}
    for part in filter(None, text.split(";")):
        kernel, _, sizes = part.partition("=")
        if kernel not in kernels() or not sizes:
            raise SystemExit(f"--sizes {part!r}: expected KERNEL=A:B[,A:B...] with KERNEL one of "
                             f"{', '.join(kernels())}")
        out[kernel] = [tuple(bench_join.parse_size(x) for x in s.split(":")) for s in sizes.split(",")]
    return out


def _inputs_and_reference(kernel: str, version: str, a: int, b: int, vertices: int, shapely_runs: int):
    params = {"points": a, "polygons": b} if kernel == "join" else {"left": a, "right": b}
    inputs = get_plan_class(kernel, version)(params | {"vertices": vertices}).make_inputs()
    if kernel == "join":
        t, ref = bench_join.time_shapely(inputs, shapely_runs)

        def ok(out):
            return all(np.array_equal(x, y) for x, y in zip(out, ref))
    else:
        import shapely

        t, ref = bench_overlay.time_shapely(inputs, shapely_runs)
        la, rb = shapely.area(inputs.left.to_shapely()), shapely.area(inputs.right.to_shapely())

        def ok(out):
            return bool(bench_overlay.compare(out, ref, la, rb)["matches"])
    return params, inputs, t, ok


PACE_LOOPS = 20     # loop timings before and after each version's runs: about 1-2 ms in all


def measure(sizes: dict, runs: int, cpu_runs: int, shapely_runs: int, vertices: int, gpu: bool) -> list[dict]:
    rows = []
    for kernel, pairs in sizes.items():
        versions = sorted(kernels()[kernel])
        for a, b in pairs:
            params, inputs, t_shp, ok = _inputs_and_reference(kernel, versions[-1], a, b, vertices, shapely_runs)
            for v in versions:
                plan = get_plan_class(kernel, v)(params | {"vertices": vertices})
                pace = [loop_seconds() for _ in range(PACE_LOOPS)]
                cpu = bench_join.time_plan(plan, inputs, "cpu", cpu_runs)
                row = {"kernel": kernel, "version": v, "size": f"{a:,} x {b:,}", "shapely": t_shp,
                       "cpu": cpu["total"], "cpu_ok": ok(cpu["out"])}
                if gpu:
                    g = bench_join.time_plan(plan, inputs, "gpu", runs)
                    row |= {"gpu_after": g["after"], "gpu_build": g["build"], "gpu_total": g["total"],
                            "gpu_after_ci": g.get("after_ci"), "gpu_e2e_ci": g.get("e2e_ci"),
                            "gpu_e2e_pinned_ci": g.get("e2e_pinned_ci"),
                            "gpu_e2e": g["e2e"], "gpu_e2e_pinned": g.get("e2e_pinned"),
                            "gpu_ok": ok(g["out"]) and ok(g.get("out_pinned", g["out"])), "card": g["device_name"],
                            "graph_after": g.get("graph_after"), "graph_new_inputs": g.get("graph_new_inputs")}
                pace += [loop_seconds() for _ in range(PACE_LOOPS)]
                row["host_loop"] = statistics.median(pace)
                rows.append(row)
                print(_line(row), file=sys.stderr, flush=True)
    return rows


def _line(r: dict) -> str:
    s = (f"{r['kernel']:<8} {r['version']:<3} {r['size']:>20}  shapely {r['shapely'] * 1e3:10.2f} ms  cpu "
         f"{r['cpu'] * 1e3:10.2f} ms  shapely/cpu {r['shapely'] / r['cpu']:6.2f}x  ok={r['cpu_ok']}")
    if "gpu_after" in r:
        s += (f"  |  gpu after build {bench_join.ms(r['gpu_after'], r.get('gpu_after_ci'))}  build "
              f"{r['gpu_build'] * 1e3:7.3f} ms  plan "
              f"{r['gpu_total'] * 1e3:8.3f} ms  {bench_join.e2e_text(r)}  shapely/gpu "
              f"{r['shapely'] / r['gpu_after']:7.0f}x after build, {r['shapely'] / r['gpu_e2e']:6.0f}x end to end  "
              f"{bench_join.graph_text(r)}  ok={r['gpu_ok']}")
    if "host_loop" in r:
        s += f"  host loop {r['host_loop'] * 1e6:.1f} us"
    return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"KERNEL=A:B,...;KERNEL=... (default {DEFAULT_SIZES})")
    ap.add_argument("--runs", type=int, default=10, help="GPU timed runs per plan")
    ap.add_argument("--cpu-runs", type=int, default=2)
    ap.add_argument("--shapely-runs", type=int, default=2)
    ap.add_argument("--vertices", type=int, default=16)
    ap.add_argument("--no-gpu", action="store_true")
    args = ap.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    sel = select("cpu" if args.no_gpu else "auto")
    with device_lock(device_key(sel)):
        rows = measure(sizes, args.runs, args.cpu_runs, args.shapely_runs, args.vertices, sel.selected == "gpu")
    card = rows[0].get("card", "no GPU") if rows else "no GPU"
    print(f"\nAll kernels and versions, one run, medians ({card}; shapely and the CPU plan on this host's CPU, "
          "one thread). GPU after build and end to end come with the ~95% interval of their median in brackets "
          "(order statistics of the timed runs). The versions run one after another, so a slowdown of the host "
          "between them is in no interval: where two versions' intervals overlap or lie close, time them "
          "interleaved (python -m tests.benchmark.bench_ab KERNEL) before calling one faster. "
          "GPU after build: inputs already on the device; plan: host arrays in, result on the device "
          "(CUDA events); end to end: host arrays in, host arrays out (host clock), and again with the inputs in "
          "pinned host memory (no host copy before their DMA); graph replay: the stages after "
          "the build as one CUDA graph, for any input that fits or for these sizes only; host loop: the "
          "median time of a fixed Python loop just before and after the row's runs, the host CPU's pace then "
          "(a row whose loop is slower ran on a slower host).")
    for r in rows:
        print(_line(r))
    return 0 if all(r["cpu_ok"] and r.get("gpu_ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
