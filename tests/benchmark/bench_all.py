"""Every kernel and version against shapely, measured side by side in one run, one table of ratios.

    python -m tests.benchmark.bench_all [--sizes join=100k:10k,1M:100k;overlay=10k:10k] [--runs 10]

Per kernel, version and size: shapely (one thread) and the CPU plan in turns, each plan run paired with
a shapely run (shapely/cpu is the median of the pairs' ratios, with its interval), and on a GPU the
plan after the host->device build, the build itself, and end to end (build + the
rest: host arrays in), and end to end on the host clock with the result copied back
(host arrays in, host arrays out; bare runs, no stage marks, in turns with the marked ones).
Every output is checked against shapely before its ratio is printed; a mismatch makes the
exit status 1. Holds the device lock for the whole run,
so no profile shares the GPU with it.

Each row also gives the host CPU's pace while that version ran: the median time of the fixed Python loop event
mode times before its runs (app.runtime.host_pace), taken before each round of the GPU runs on a GPU
(bench_join.time_plan), else just before and just after the version's timings. The versions run one after
another, and on a shared host the CPU can slow between them; where two rows' loops differ, so did the host. In
one run on an H100 host, join v1 and v2 at 100k x 10k ran while the loop took 85.3 and 80.4 us, v3 and v4 while
it took 49.4 and 47.8 us: their 0.35-0.53 against 0.19-0.25 ms after the build was partly the host's. On a GPU
each row also gives the host's launch pace then (app.runtime.launch_pace: an empty kernel's launch, timed the
same way): at these sizes the plans are bound by their launches, and on the lent hosts a launch's cost moves
where the loop's does not (on one H200 host two profiles 25% apart had loops within 1% and launches 10% apart).
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
from app.runtime.launch_pace import LAUNCHES  # noqa: E402
from app.runtime.device import select  # noqa: E402
from app.runtime.execute import backend_for, xp_for  # noqa: E402
from app.runtime.lock import device_key, device_lock  # noqa: E402
from app.runtime.nvtx import Nvtx  # noqa: E402
from app.runtime.recorder import Recorder  # noqa: E402
from app.runtime.stats import median_interval  # noqa: E402
from app.runtime.timing import warm_up  # noqa: E402
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


PACE_LOOPS = 20     # loop timings before and after each version's CPU runs: about 1-2 ms in all


def _shapely_once(kernel: str, inputs):
    """One timed shapely run of the kernel's work (its own benchmark's timing), as a function of nothing; the
    join's shapely geometries are made once, not before every run."""
    if kernel == "join":
        run = bench_join.shapely_runner(inputs)
        return lambda: run()[0]
    return lambda: bench_overlay.time_shapely(inputs, 1)[0]


def cpu_beside_shapely(plan, inputs, runs: int, shapely_once) -> dict:
    """The CPU plan and shapely in turns: ``runs`` pairs (at least one), the order flipped every pair, after the
    plan's cold run and warm-up (as bench_join.time_plan's). The ratio is the median of the pairs' shapely / plan,
    with its ~95% interval: a host that slows down slows both sides of a pair alike, where one shapely time taken
    before every version's runs would set each version against the host as it was then. On an H100 host the
    overlay's v2 at 100k x 100k read 1.01x that way (shapely 8,233 ms, timed before any version ran; the plan
    8,153 ms, timed after v1's CPU and GPU runs), where an earlier run on an H100 host had read 1.48x."""
    sel = select("cpu")
    backend, _ = backend_for(plan, sel)
    rec = Recorder("cpu", xp_for("cpu"), Nvtx(False, plan.kernel))
    out, _ = rec.run(plan, inputs, backend)      # cold run
    warm_up(lambda: rec.run(plan, inputs, backend), "auto", lambda: None)
    cpu, shp = [], []
    for i in range(max(runs, 1)):
        if i % 2 == 0:
            shp.append(shapely_once())
        out, r = rec.run(plan, inputs, backend)
        cpu.append(r.total_seconds)
        if i % 2 == 1:
            shp.append(shapely_once())
    ratios = [s / c for s, c in zip(shp, cpu)]
    return {"cpu": statistics.median(cpu), "shapely": statistics.median(shp), "ratio": statistics.median(ratios),
            "ratio_ci": median_interval(ratios), "out": out}


def measure(sizes: dict, runs: int, cpu_runs: int, vertices: int, gpu: bool) -> list[dict]:
    rows = []

    def host_loops() -> list[float]:
        """The loop's timings, taken before and after a version's CPU runs where no GPU runs time their own."""
        return [loop_seconds() for _ in range(PACE_LOOPS)]

    for kernel, pairs in sizes.items():
        versions = sorted(kernels()[kernel])
        for a, b in pairs:
            params, inputs, _, ok = _inputs_and_reference(kernel, versions[-1], a, b, vertices, 1)   # the reference
            shapely_once = _shapely_once(kernel, inputs)
            for v in versions:
                plan = get_plan_class(kernel, v)(params | {"vertices": vertices})
                pace = [] if gpu else host_loops()
                cpu = cpu_beside_shapely(plan, inputs, cpu_runs, shapely_once)
                row = {"kernel": kernel, "version": v, "size": f"{a:,} x {b:,}", "shapely": cpu["shapely"],
                       "cpu": cpu["cpu"], "cpu_ratio": cpu["ratio"], "cpu_ratio_ci": cpu["ratio_ci"],
                       "cpu_ok": ok(cpu["out"])}
                if gpu:
                    g = bench_join.time_plan(plan, inputs, "gpu", runs)
                    row |= {"gpu_after": g["after"], "gpu_build": g["build"], "gpu_total": g["total"],
                            "gpu_after_one_mark": g["after_one_mark"], "gpu_after_one_mark_ci": g.get("after_one_mark_ci"),
                            "gpu_after_ci": g.get("after_ci"), "gpu_e2e_ci": g.get("e2e_ci"),
                            "gpu_e2e_pinned_ci": g.get("e2e_pinned_ci"),
                            "gpu_e2e": g["e2e"], "gpu_e2e_pinned": g.get("e2e_pinned"),
                            "gpu_ok": ok(g["out"]) and ok(g.get("out_pinned", g["out"])), "card": g["device_name"],
                            "graph_after": g.get("graph_after"), "graph_new_inputs": g.get("graph_new_inputs"),
                            # the pace while the GPU runs were timed (before each round), which their figures
                            # depend on
                            "host_loop": g["host_loop"], "launch_pace": g["launch_pace"]}
                else:
                    row["host_loop"] = statistics.median(pace + host_loops())
                rows.append(row)
                print(_line(row), file=sys.stderr, flush=True)
    return rows


def _line(r: dict) -> str:
    s = (f"{r['kernel']:<8} {r['version']:<3} {r['size']:>20}  shapely {r['shapely'] * 1e3:10.2f} ms  cpu "
         f"{r['cpu'] * 1e3:10.2f} ms  shapely/cpu {_ratio(r)}  ok={r['cpu_ok']}")
    if "gpu_after" in r:
        s += (f"  |  gpu after build {bench_join.ms(r['gpu_after'], r.get('gpu_after_ci'))}"
              f"{bench_join.one_mark_text(r)}  build "
              f"{r['gpu_build'] * 1e3:7.3f} ms  plan "
              f"{r['gpu_total'] * 1e3:8.3f} ms  {bench_join.e2e_text(r)}  shapely/gpu "
              f"{r['shapely'] / r['gpu_after']:7.0f}x after build, {r['shapely'] / r['gpu_e2e']:6.0f}x end to end  "
              f"{bench_join.graph_text(r)}  ok={r['gpu_ok']}")
    if r.get("host_loop") is not None:          # none where no GPU run was timed (--runs 0)
        s += f"  host loop {r['host_loop'] * 1e6:.1f} us"
    if r.get("launch_pace") is not None:
        s += f", a launch {r['launch_pace'] * 1e6:.2f} us"
    return s


def _ratio(r: dict) -> str:
    """shapely / CPU plan: the median of the paired ratios, with its interval."""
    lo, hi = r["cpu_ratio_ci"]
    if lo != lo:            # NaN: under six pairs no interval holds the median 95% of the time
        return f"{r['cpu_ratio']:6.2f}x [no 95% interval: under 6 pairs]"
    return f"{r['cpu_ratio']:6.2f}x [{lo:.2f}-{hi:.2f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"KERNEL=A:B,...;KERNEL=... (default {DEFAULT_SIZES})")
    ap.add_argument("--runs", type=int, default=10, help="GPU timed runs per plan")
    ap.add_argument("--cpu-runs", type=int, default=2, help="CPU plan runs per version, each paired with a shapely run")
    ap.add_argument("--vertices", type=int, default=16)
    ap.add_argument("--no-gpu", action="store_true")
    args = ap.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    sel = select("cpu" if args.no_gpu else "auto")
    with device_lock(device_key(sel)):
        rows = measure(sizes, args.runs, args.cpu_runs, args.vertices, sel.selected == "gpu")
    card = rows[0].get("card", "no GPU") if rows else "no GPU"
    print(f"\nAll kernels and versions, one run, medians ({card}; shapely and the CPU plan on this host's CPU, "
          "one thread, in turns: shapely/cpu is the median of the ratios of pairs of runs side by side, the "
          "order flipped every pair, with its ~95% interval). GPU after build and end to end come with the ~95% "
          "interval of their median in brackets "
          "(order statistics of the timed runs). The versions run one after another, so a slowdown of the host "
          "between them is in no interval: where two versions' intervals overlap or lie close, time them "
          "interleaved (python -m tests.benchmark.bench_ab KERNEL) before calling one faster. "
          "GPU after build: inputs already on the device, from runs with every stage marked and, in brackets after "
          "it, from runs with one mark at the build's end and none between the stages after it (what the stage marks "
          "add is instrumentation); plan: host arrays in, result on the device "
          "(CUDA events, every stage marked); end to end: host arrays in, host arrays out (host clock, the bare plan: "
          "no stage marks), and again with the inputs in "
          "pinned host memory (no host copy before their DMA); graph replay: the stages after "
          "the build as one CUDA graph, for new data of these counts (written into the buffers it was captured "
          "with, while the counts the device finds fit its rooms) or for these sizes only; host loop: the "
          "median time of a fixed Python loop before each round of the row's GPU runs (on the CPU, just before "
          "and after its runs), the host CPU's pace then "
          "(a row whose loop is slower ran on a slower host); a launch: on a GPU, the host time of one launch of an "
          f"empty kernel, timed in {LAUNCHES}s at the same moments, the host's launch pace "
          "then (at these sizes the plans are bound by their launches, so a row whose launches are slower ran on a "
          "slower host, whatever its loop says)." + _same_cpu_code(rows))
    for r in rows:
        print(_line(r))
    return 0 if all(r["cpu_ok"] and r.get("gpu_ok", True) for r in rows) else 1


def _same_cpu_code(rows: list[dict]) -> str:
    """The versions whose CPU plan runs another version's stages (their difference is in their GPU kernels only)."""
    seen = list(dict.fromkeys((r["kernel"], r["version"]) for r in rows))
    same = [(k, v, get_plan_class(k, v).cpu_stages_of) for k, v in seen if get_plan_class(k, v).cpu_stages_of]
    return "".join(f" On the CPU, {k} {v} runs {of}'s stages (the versions differ in their GPU kernels only): its "
                   f"cpu column times {of}'s code again." for k, v, of in same)


if __name__ == "__main__":
    sys.exit(main())
