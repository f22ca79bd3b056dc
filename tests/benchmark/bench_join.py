"""GPU plan vs CPU plan vs shapely on the same data, side by side in one run.

    python -m tests.benchmark.bench_join [--sizes 100k:10k,1M:100k] [--runs 10] [--cpu-runs 3]

GPU: warm time of the stages after the owned-buffer build (inputs already on the
device), the host->device build on its own line, end to end (host clock: host
arrays in, result copied back to host arrays; bare runs, with no stage marks), and
the stages after the build replayed as one CUDA graph (where the plan reads no size before the result's length it
serves new data of the same counts, written into the buffers it was captured with,
while the device's counts fit its rooms; else these inputs' sizes only), and the host's pace while the GPU runs
were timed (event mode's fixed Python loop and an empty kernel's launch, before each round): at 100k x 10k the
stages after the build are bound by the host, and its pace moves from one process to the next. CPU: the numpy
plan, all stages. shapely: STRtree build + query with the predicate (one thread).
Every output is checked equal to shapely's before a ratio is printed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import numpy as np  # noqa: E402

from app.kernel.plan import get_plan_class, kernels  # noqa: E402
from app.runtime.device import select  # noqa: E402
from app.runtime.execute import backend_for, xp_for  # noqa: E402
from app.runtime.nvtx import Nvtx  # noqa: E402
from app.runtime.recorder import OneMarkRecorder, Recorder  # noqa: E402
from app.runtime.host_pace import loop_seconds  # noqa: E402
from app.runtime.launch_pace import LaunchPace  # noqa: E402
from app.runtime.stats import median_interval  # noqa: E402
from app.runtime.timing import copied_back, warm_up  # noqa: E402


def parse_size(s: str) -> int:
    s = s.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000}.get(s[-1], 1)
    return int(float(s.rstrip("km")) * mult)


def time_plan(plan, inputs, device: str, runs: int):
    """The plan's warm times: the build and the stages after it from runs with every stage marked, and end to
    end (host arrays in, the result back in host arrays, on the host clock) from bare runs (one pair of marks
    around the run, as event mode's end-to-end figure), the kinds in turns. Timed around a marked run, the
    end to end held the marks' cost too: on an H100 node join v4 at 1M x 100k read 2.032 ms that way in
    bench_all, where bench_ab's bare runs on the same node read 1.792 ms.

    On a GPU, end to end is timed a second way in the same rounds: with the inputs in pinned host memory, as a
    loader that reads into pinned buffers hands them over (their DMA needs no host copy, which bounds the first
    figure on the host's memory bandwidth). The two bare runs swap places every round. Timed after the other
    runs instead, the pinned figure of overlay v3 at 10k x 10k read 1.21 against 0.70 ms on an H100 node, where
    interleaved probes on another found it faster or level.

    After the build is timed a second way in the same rounds: from runs with one mark, at the build's end, and
    none between the later stages (OneMarkRecorder), so the stages after the build carry no instrumentation but
    the run's end mark. The stage-marked figure holds one event record a stage more: on an H200 node join v4 at
    100k x 10k read 0.190 ms that way at 4.7 us a mark."""
    sel = select(device)
    backend, _ = backend_for(plan, sel)
    xp = xp_for(device)
    rec = Recorder(device, xp, Nvtx(False, plan.kernel))
    bare_rec = Recorder(device, xp, Nvtx(False, plan.kernel), per_stage=False)
    rec.run(plan, inputs, backend)                   # cold run: JIT, pools
    # Warm-up as event mode's default: until the plan's time stops changing (on the lent hosts the staging of
    # the inputs got 20-40% faster over the first 10-20 runs after one warm-up run).
    warm_up(lambda: rec.run(plan, inputs, backend), "auto", lambda: None)
    arms = {"e2e": inputs}
    if device == "gpu" and runs:
        from app.kernel.staging import pin_inputs

        arms["e2e_pinned"] = pinned = pin_inputs(inputs)
        warm_up(lambda: bare_rec.run(plan, pinned, backend), "auto", lambda: None)     # the direct path's warm-up
    # Each arm's result is kept from its last run: the next run reuses the result's buffers on the device. The
    # copy back is part of end to end, so keeping it costs nothing more.
    results: dict = {}
    timed = {name: copied_back(lambda x=x: bare_rec.run(plan, x, backend),
                               lambda out, name=name: results.__setitem__(name, backend.outputs_to_host(out)))
             for name, x in arms.items()}
    one = OneMarkRecorder(device, xp, Nvtx(False, plan.kernel), boundary=1)
    one.run(plan, inputs, backend)
    for arm in timed.values():
        arm()                                        # the bare recorder's own events made before any timed run
    build, after, after_one, total, e2e_marks = [], [], [], [], set()
    times = {name: [] for name in timed}
    # The host's pace before each round, as event mode times it before each timed run: at the default sizes the GPU
    # plans are bound by their host, whose pace moves from one process to the next (on one H200 node six processes
    # ran join v4's stages after the build in 125.7 to 249.3 us as the loop took 44.9 to 79.9 us).
    pace = LaunchPace(xp) if device == "gpu" and runs else None
    loops, launches = [], []
    for i in range(runs):
        loops.append(loop_seconds())
        if pace:
            launches.append(pace.seconds())
        _, r = rec.run(plan, inputs, backend)
        build.append(r.stages[0]["seconds"])
        after.append(r.total_seconds - r.stages[0]["seconds"])
        total.append(r.total_seconds)
        _, o = one.run(plan, inputs, backend)
        after_one.append(o.total_seconds - o.to_boundary)
        for name in (list(timed) if i % 2 == 0 else list(timed)[::-1]):
            _, b = timed[name]()
            times[name].append(b.end_to_end_seconds)
            e2e_marks.add(b.marks)
    res = {"build": statistics.median(build), "after": statistics.median(after),
           "after_one_mark": statistics.median(after_one) if after_one else None,
           "total": statistics.median(total), "after_min": min(after), "e2e": statistics.median(times["e2e"]),
           "out": results["e2e"], "device_name": sel.device_name, "e2e_marks": sorted(e2e_marks),
           "host_loop": statistics.median(loops) if loops else None,
           "launch_pace": statistics.median(launches) if launches else None}
    if runs:     # the medians' ~95% intervals: where two versions' intervals overlap, the runs cannot tell them apart
        res |= {"after_ci": median_interval(after), "e2e_ci": median_interval(times["e2e"]),
                "after_one_mark_ci": median_interval(after_one)}
    if "e2e_pinned" in times:
        res |= {"e2e_pinned": statistics.median(times["e2e_pinned"]),
                "e2e_pinned_ci": median_interval(times["e2e_pinned"]), "out_pinned": results["e2e_pinned"]}
    if device == "gpu" and runs:
        res |= graph_after_build(plan, inputs, backend, r, runs)
    return res


def ms(value: float, ci=None) -> str:
    """A median in ms, with its ~95% interval in brackets when there is one."""
    # under six samples the interval is missing (NaN): none is printed
    return f"{value * 1e3:.3f} ms" + (f" [{ci[0] * 1e3:.3f}-{ci[1] * 1e3:.3f}]" if ci and ci[0] == ci[0] else "")


def one_mark_text(r) -> str:
    """The stages after the build with no mark between them, beside the stage-marked figure."""
    if r.get("gpu_after_one_mark") is None:
        return ""
    return f" (no stage marks {ms(r['gpu_after_one_mark'], r.get('gpu_after_one_mark_ci'))})"


def e2e_text(r) -> str:
    pinned = (f" (inputs in pinned memory {ms(r['gpu_e2e_pinned'], r.get('gpu_e2e_pinned_ci'))})"
              if r.get("gpu_e2e_pinned") else "")
    return f"end to end {ms(r['gpu_e2e'], r.get('gpu_e2e_ci'))}{pinned}"


def pace_text(r) -> str:
    """The host's pace while the GPU runs were timed: the fixed loop's median and an empty kernel's launch."""
    if r.get("host_loop") is None:
        return "host pace -"
    return f"host loop {r['host_loop'] * 1e6:.1f} us, a launch {r['launch_pace'] * 1e6:.2f} us"


def graph_after_build(plan, inputs, backend, record, runs: int) -> dict:
    """The stages after the build replayed as one CUDA graph (its output checked equal to an eager run's),
    and whether that graph serves new inputs: only where the plan reads no size before the result's length."""
    from app.runtime.graph import graph_replay
    from app.runtime.timing import graph_capturability

    g = graph_replay(plan, inputs, backend, lambda: None, runs)
    return {"graph_after": g["graph_after_build_seconds"] if g["replayed"] else None,
            "graph_new_inputs": graph_capturability(record, "gpu")["after_build"]}


def graph_text(r) -> str:
    if r.get("graph_after") is None:
        return "graph replay -"
    scope = "new data of these counts" if r["graph_new_inputs"] else "these sizes only"
    return f"graph replay {r['graph_after'] * 1e3:.3f} ms ({scope})"


def shapely_runner(inputs):
    """``run()`` -> (seconds, (points, polygons) sorted): one timed STRtree build and query. The shapely
    geometries are made once, here, outside every timing."""
    import shapely

    geoms = inputs.polygons.to_shapely()
    pts = shapely.points(inputs.points)

    def run():
        t0 = time.perf_counter()
        tree = shapely.STRtree(geoms)
        pt, poly = tree.query(pts, predicate=inputs.predicate)
        seconds = time.perf_counter() - t0
        order = np.lexsort((poly, pt))
        return seconds, (pt[order], poly[order])
    return run


def time_shapely(inputs, runs: int):
    run = shapely_runner(inputs)
    times, out = [], None
    for _ in range(runs):
        t, out = run()
        times.append(t)
    return statistics.median(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100k:10k,1M:100k", help="POINTS:POLYGONS,...")
    ap.add_argument("--vertices", type=int, default=16)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--cpu-runs", type=int, default=3)
    ap.add_argument("--shapely-runs", type=int, default=3)
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--versions", default=None, help="comma-separated; default: every version")
    args = ap.parse_args(argv)
    gpu = not args.no_gpu and select("auto").selected == "gpu"
    versions = args.versions.split(",") if args.versions else sorted(kernels()["join"])
    rows = []
    for size in args.sizes.split(","):
        n, g = (parse_size(x) for x in size.split(":"))
        inputs = get_plan_class("join", versions[0])({"points": n, "polygons": g,
                                                      "vertices": args.vertices}).make_inputs()
        t_shp, ref = time_shapely(inputs, args.shapely_runs)
        for v in versions:
            plan = get_plan_class("join", v)({"points": n, "polygons": g, "vertices": args.vertices})
            cpu = time_plan(plan, inputs, "cpu", args.cpu_runs)
            res = {"size": f"{v} {n:,} x {g:,}", "shapely": t_shp, "cpu": cpu["total"], "pairs": len(ref[0]),
                   "cpu_ok": all(np.array_equal(a, b) for a, b in zip(cpu["out"], ref))}
            if gpu:
                gp = time_plan(plan, inputs, "gpu", args.runs)
                res |= {"gpu_after": gp["after"], "gpu_after_min": gp["after_min"], "gpu_build": gp["build"],
                        "gpu_after_one_mark": gp["after_one_mark"], "gpu_after_one_mark_ci": gp.get("after_one_mark_ci"),
                        "gpu_after_ci": gp.get("after_ci"), "gpu_e2e_ci": gp.get("e2e_ci"),
                        "gpu_e2e": gp["e2e"], "gpu_e2e_pinned": gp.get("e2e_pinned"),
                        "gpu_e2e_pinned_ci": gp.get("e2e_pinned_ci"),
                        "graph_after": gp.get("graph_after"), "graph_new_inputs": gp.get("graph_new_inputs"),
                        "gpu_ok": all(np.array_equal(a, b) for out in (gp["out"], gp.get("out_pinned", gp["out"]))
                                      for a, b in zip(out, ref)),
                        "card": gp["device_name"], "host_loop": gp["host_loop"], "launch_pace": gp["launch_pace"]}
            rows.append(res)
            print(_row(res), flush=True)
    print("\njoin benchmark (medians, GPU ones with their ~95% intervals in brackets; GPU: stages after the "
          "owned-buffer build, inputs on device, from runs with every stage marked and, in brackets after, from "
          "runs with no mark between those stages)")
    for r in rows:
        print(_row(r))
    return 0 if all(r["cpu_ok"] and r.get("gpu_ok", True) for r in rows) else 1


def _row(r) -> str:
    s = (f"{r['size']:>22}  pairs {r['pairs']:>9,}  shapely {r['shapely'] * 1e3:9.2f} ms  "
         f"cpu {r['cpu'] * 1e3:9.2f} ms (shapely/cpu {r['shapely'] / r['cpu']:5.2f}x, ok={r['cpu_ok']})")
    if "gpu_after" in r:
        s += (f"  gpu {ms(r['gpu_after'], r.get('gpu_after_ci'))} (min {r['gpu_after_min'] * 1e3:.3f})"
              f"{one_mark_text(r)} + H2D "
              f"{r['gpu_build'] * 1e3:.3f} ms  {e2e_text(r)}  shapely/gpu "
              f"{r['shapely'] / r['gpu_after']:8.0f}x after build, {r['shapely'] / r['gpu_e2e']:6.0f}x end to end  "
              f"{graph_text(r)}  ok={r['gpu_ok']}  {pace_text(r)}  [{r['card']}]")
    return s


if __name__ == "__main__":
    sys.exit(main())
