"""event mode: the plan in process, CUDA events (or a monotonic clock) around every stage.

Order: inputs are generated (untimed); kernels are compiled and timed apart;
the first run is the cold run (module load, library JIT, pool growth); then
discarded warm-up runs (``warmup``: a count, or "auto": until the plan's time is
steady); then ``bench_runs`` timed runs give median and spread per stage and for
the whole plan, and a check that they were not still drifting.
"""
from __future__ import annotations

import time

from app.analysis import advice
from app.analysis.roofline import plan_roofline
from app.analysis.summary import event_summary
from app.analysis.trace import build_trace
from app.kernel.plan import stages_tile_run
from app.report.event_report import build_report
from app.report.sections import with_verification_summary
from app.runtime import device as devmod
from app.runtime import launch_pace
from app.runtime.autotune import tiling_files
from app.runtime.clocks import clock_report, clock_snapshot, gpu_uuid, sampler_for
from app.runtime.execute import backend_for, xp_for
from app.runtime.lock import device_key, device_lock, measurement_window
from app.runtime.memory import check_fits
from app.runtime.nvtx import Nvtx
from app.runtime.profiling.base import Mode, Profile, ProfileOptions, register_mode
from app.runtime.profiling.worker import verify_output
from app.runtime.provenance import params_json
from app.runtime.one_mark import from_rounds
from app.runtime.recorder import OneMarkRecorder, Recorder
from app.runtime.stats import drift, outlier_runs, repeated_later
from app.runtime.timing import (OVERHEAD_PAIRS, OVERHEAD_PAIRS_CPU, OVERHEAD_SHARE, OVERHEAD_TARGET_CI, L2Flush,
                                Progress, copied_back, graph_capturability, instrumentation_overhead, timed_runs,
                                warm_up)


@register_mode
class EventMode(Mode):
    name = "event"

    def profile(self, plan, options: ProfileOptions) -> Profile:
        selection = devmod.select(options.device)
        check_fits(plan, selection.selected)
        progress = Progress(f"{plan.kernel} {plan.version} event")
        with device_lock(device_key(selection)):
            clocks_start = clock_snapshot(selection)
            progress.update("generating inputs")
            inputs = plan.make_inputs()
            t0 = time.perf_counter()
            progress.update("compiling")
            backend, compile_info = backend_for(plan, selection)
            compile_info.setdefault("total_seconds", time.perf_counter() - t0)
            nvtx = Nvtx(options.nvtx, plan.kernel)
            xp = xp_for(selection.selected)
            rec = Recorder(selection.selected, xp, nvtx)
            with measurement_window() as window:     # host-wide: no other profile times beside these runs
                progress.update("cold run")
                _, cold = rec.run(plan, inputs, backend)
                # Which kernels the plan launches (an untimed run, before the warm-up): a stage's Occ% is theirs,
                # not that of kernels its stage registers for other versions or sizes.
                occupancy = (backend.launched_occupancy(lambda: rec.run(plan, inputs, backend))
                             if hasattr(backend, "launched_occupancy") else None)
                flush = L2Flush(selection.selected, options.l2, selection.info.get("l2_bytes"))
                # the host CPU's pace and, on a GPU, what a launch costs the host, before each timed run. Made, and
                # the clock sampler started, before the warm-up, so that it runs straight into the timed runs: on
                # an H200 host, making them after it (a gap of milliseconds) left the first timed run of the
                # default join 1.6-2.1x the median, the slowest of 30, in three processes of three, and so did
                # 20 ms of idle host; made before, 1.02-1.07x.
                paces = launch_pace.Paces(selection.selected, xp)
                with sampler_for(selection) as sampler:     # GPU clocks between timed runs, at most every 20 ms
                    warmed = warm_up(lambda: rec.run(plan, inputs, backend), options.warmup, flush, progress)

                    def between() -> None:      # before each timed run's L2 step: nothing here is timed
                        sampler.poll()
                        paces.sample()

                    runs, stopped, output = timed_runs(lambda: rec.run(plan, inputs, backend), options.timed_runs(),
                                                       flush, progress, between=between)
                bare = Recorder(selection.selected, xp, Nvtx(False, plan.kernel), per_stage=False)
                budget = max(1.0, OVERHEAD_SHARE * sum(r.wall_seconds for r in runs))
                on_gpu = selection.selected == "gpu"
                names = [s["name"] for s in runs[-1].stages]
                one_marks, why_not = _one_mark_runs(plan, inputs, backend, selection, xp, len(names))
                # On a GPU each bare run also copies its result back: the end-to-end figure, from the same runs.
                bare_side = (copied_back(lambda: bare.run(plan, inputs, backend), backend.outputs_to_host) if on_gpu
                             else lambda: bare.run(plan, inputs, backend))
                overhead = instrumentation_overhead(lambda: rec.run(plan, inputs, backend), bare_side, flush,
                                                    progress=progress, budget_s=budget,
                                                    pairs=OVERHEAD_PAIRS if on_gpu else OVERHEAD_PAIRS_CPU,
                                                    target_ci=OVERHEAD_TARGET_CI
                                                    if on_gpu and options.overhead == "precise" else None,
                                                    others=one_marks, settle_rounds=1)
                stage_marks = (from_rounds(names, overhead.pop("rounds"), overhead["stopped"]) if one_marks
                               else {"why": why_not})
                if on_gpu:
                    e2e = overhead.pop("end_to_end")
                    staging_dma = backend.staging_dma()   # after the pairs: every run's build staged the inputs
                else:   # the CPU plan's result is already host arrays: end to end is the bare plan, measured above
                    e2e = {"median": overhead["bare_median_seconds"], "runs": overhead["pairs"],
                           "samples": overhead["samples"]["bare"],
                           "how": "CPU: the result is already in host arrays, so this is the bare plan of the "
                                  "overhead pairs"}
                    staging_dma = None
                replay = _graph_replay(plan, inputs, backend, flush, len(runs), progress, options.warmup) \
                    if options.graph and selection.selected == "gpu" else None
                clocks = clock_report(selection.selected, gpu_uuid(selection), start=clocks_start,
                                      end=clock_snapshot(selection), samples=sampler.summary())
                host_output = backend.outputs_to_host(output)
        if options.verify:
            progress.update("verifying against the oracle")
        # an oracle that cannot run is recorded ({"error": ...}), not raised: the finished profile is kept
        verification = verify_output(plan, inputs, host_output) if options.verify else None
        progress.done()
        trace = build_trace(plan, inputs, selection, cold, runs, mode=self.name, nvtx=nvtx.report(),
                            compile_info=compile_info, warmup=warmed["runs"], verification=verification)
        totals = [r.total_seconds for r in runs]
        trace["timing"] |= {"warmup": warmed, "drift": drift(totals),
                            **launch_pace.timing(paces.loop, paces.launches, totals),
                            "stopped_by": stopped,
                            "repeated_later": repeated_later(trace["timing"]["total"],
                                                             overhead["instrumented_median_seconds"],
                                                             overhead["instrumented_ci95"]),
                            "l2": flush.describe(), "instrumentation": overhead,
                            "one_mark": stage_marks,
                            "end_to_end": e2e, "staging_dma": staging_dma,
                            "window_waited_seconds": window["waited_seconds"]}
        if options.graph:
            trace["timing"]["graph"] = graph_capturability(runs[-1], selection.selected)
            if replay is not None:
                trace["timing"]["graph"]["replay"] = replay
        _add_occupancy(trace, occupancy)
        params = params_json(plan, selection, mode=self.name, options=options.as_dict(), argv=options.argv,
                             clocks=clocks)
        after = trace["timing"].get("after_build") or {}
        roof = plan_roofline(selection.device_name, selection.selected, trace["stages"],
                             uuid=selection.info.get("uuid"), after_build_seconds=after.get("median"))
        trace["roofline"] = roof
        findings = advice.stage_findings(trace, roof)
        trace["summary"] = event_summary(trace, roof, findings, advice.opportunities(trace, roof, findings),
                                         advice.overall(trace, findings, roof)[0])
        from app.report.plots import stage_chart_png   # matplotlib: only when a plot is drawn

        chart = stage_chart_png(trace, roof, f"{plan.kernel} {plan.version} on {trace['selected_runtime']} "
                                             f"({trace['device']['name']})")
        files = {"params.json": params, "trace.json": trace,
                 "report.md": build_report(trace, params, roof, options.baseline, stage_chart=chart is not None)}
        if chart is not None:
            files["stage_chart.png"] = chart
        files |= tiling_files(plan)
        for stage, artifacts in backend.artifacts().items():
            for fname, content in artifacts.items():
                files[f"compiled/{stage}/{fname}"] = content
        ok = verification is None or verification.get("matches") is True
        return Profile(trace=trace, files=files, summary=_summary(trace), ok=ok)


def _one_mark_runs(plan, inputs, backend, selection, xp, n: int) -> tuple[dict | None, str | None]:
    """On a GPU, the runs with one stage mark each that every round of the overhead pairs also runs
    (app.runtime.one_mark), by the stage whose end they mark; elsewhere None, and why."""
    if selection.selected != "gpu":
        return None, ("CPU run: a stage mark is a clock read, a fraction of a microsecond, so the timed runs' stage "
                      "times need no such check")
    if not stages_tile_run(plan):
        return None, "the plan runs its stages its own way, so a stage's end need not be the next one's start"
    if n < 2:
        return None, "a plan of one stage: its time is the bare plan's"
    nvtx = Nvtx(False, plan.kernel)
    recorders = {k: OneMarkRecorder(selection.selected, xp, nvtx, k) for k in range(1, n)}
    return {k: (lambda r=r: r.run(plan, inputs, backend)) for k, r in recorders.items()}, None


def _add_occupancy(trace: dict, occupancy: dict | None) -> None:
    """Each stage's lowest theoretical occupancy among the kernels it launched, and their names."""
    for s in trace["stages"]:
        occ, ran = (occupancy or {}).get(s["name"], (None, []))
        if ran:
            s["metadata"]["kernels_launched"] = ran
        if occ is not None:
            s["metadata"]["theoretical_occupancy_pct"] = occ


def _spread_summary(sp: dict) -> str:
    """The total's spread for the summary line: nothing where one run has none, no outlier count under four."""
    if sp["runs"] < 2:
        return ""
    out = f", ±{100 * sp['robust_rel_spread']:.1f}% robust spread"
    return out + (f", {outlier_runs(sp['outliers'])}" if sp.get("outliers") is not None else "")


def _summary(trace: dict) -> str:
    lines = [f"{trace['kernel']} {trace['version']} on {trace['selected_runtime']} ({trace['device']['name']}): "
             f"total {trace['total_elapsed_seconds'] * 1e6:,.1f} us (median of {trace['timing']['timed_runs']}"
             f"{_spread_summary(trace['timing']['total'])})"]
    for s in trace["stages"]:
        lines.append(f"  {s['name']:<20} {s['elapsed_seconds'] * 1e6:>12,.1f} us  "
                     f"rows {s['rows_in']:>10,} -> {s['rows_out']:<10,}")
    unc = trace["timing"]
    lines.append(f"  {'(uncovered)':<20} {unc['uncovered_seconds'] * 1e6:>12,.1f} us  "
                 f"{100 * unc['uncovered_fraction']:.2f}% of total")
    # the check's line last and, where the output is wrong or unverified, its banner first
    return with_verification_summary(trace, "\n".join(lines))


def _graph_replay(plan, inputs, backend, flush, runs: int, progress, warmup) -> dict:
    """--graph on a GPU: graph replay of the stages after the build next to eager runs (runtime/graph.py)."""
    from app.runtime.graph import graph_replay

    try:
        return graph_replay(plan, inputs, backend, flush, runs, progress, warmup)
    except Exception as exc:  # a capture the driver refused is a finding of the profile, not a crash
        return {"replayed": False, "why": f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"}
