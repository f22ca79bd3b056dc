"""annotation mode: the plan's worker under ncu with a compact metric set, one warm iteration.

Per kernel and per stage: GPU time, DRAM bytes, fp64/fp32 FLOPs, SM%/DRAM%,
achieved occupancy, L2 hit rate, local spills, waves per SM, registers, block
and grid; achieved GB/s and TFLOP/s against conf/devices.json; seed 004's
bottleneck classes. Writes report.md, roofline.png and the tables as CSV.
"""
from __future__ import annotations

from app.analysis.devices import match_device
from app.analysis.kernel_metrics import kernel_table, opportunities, stage_table
from app.analysis.summary import counter_summary
from app.kernel.plan import get_plan_class
from app.report.ncu_report import render_report, stage_sections
from app.runtime.profiling.base import Mode, Profile, ProfileOptions, register_mode
from app.runtime.profiling.ncu_session import run_under_ncu
from app.runtime.profiling.session import profile_files
from app.runtime.profiling.parsers.columns import ANNOTATION_METRICS
from app.runtime.profiling.parsers.ncu_csv import parse_raw


def measured_trace(plan, run, kernels, stages, mode: str) -> dict:
    """trace.json for a profiler mode: seed-000 fields, stage time from the profiler."""
    worker = run.worker
    by_name = {s["name"]: s for s in worker["stages"]}
    out_stages = []
    for spec in plan.stages:
        w = by_name[spec.name]
        m = stages[stages["stage"] == spec.name].iloc[0]
        out_stages.append({
            "name": spec.name, "category": spec.category, "device": w["device"],
            "elapsed_seconds": float(m["duration_us"]) / 1e6, "rows_in": w["rows_in"], "rows_out": w["rows_out"],
            "metadata": dict(w["meta"]) | w["counters"] | {"kernels": int(m["kernels"])},
            "ncu": {k: (None if v != v else float(v)) for k, v in m.items() if k not in ("stage", "bottleneck")}
                   | {"bottleneck": m["bottleneck"]},
            "tiling": plan.tiling[spec.name], "cost": worker.get("costs", {}).get(spec.name),
        })
    sel = worker["selection"]
    return {
        "schema": "app.trace/1", "kernel": plan.kernel, "version": plan.version, "mode": mode,
        "selected_runtime": sel["selected"], "requested_runtime": sel["requested"],
        "device": {"name": sel["device_name"]} | sel["info"],
        "total_elapsed_seconds": float(stages["duration_us"].sum()) / 1e6,
        "timing": {"clock": "ncu gpu__time_duration per kernel, one warm iteration", "timed_runs": 1},
        "metadata": {"planner_selected_runtime": sel["planner"], "selection_reason": sel["reason"],
                     "params": plan.params, "nvtx": worker["nvtx"],
                     "kernels_outside_stages": int(kernels["stage"].isna().sum()),
                     "tool": {"ncu": run.ncu, "version": run.ncu_version, "command": run.command}},
        "stages": out_stages,
    }


def common_files(plan, run, trace, options, mode) -> dict:
    files = profile_files(plan, run.worker, run.selection, options, mode, {"ncu": run.ncu_version})
    files["params.json"]["clocks"]["ncu_clock_control"] = options.clock_control
    files["trace.json"] = trace
    return files


@register_mode
class AnnotationMode(Mode):
    name = "annotation"

    def profile(self, plan, options: ProfileOptions) -> Profile:
        ncu_args = ["--csv", "--page", "raw", "--print-units", "base", "--metrics", ",".join(ANNOTATION_METRICS)]
        with run_under_ncu(plan, options, ncu_args, "ncu annotation") as run:
            raw, _ = parse_raw(run.stdout, run.ncu_version)
            names = [s.name for s in plan.stages]
            device_name = run.worker["selection"]["device_name"]
            kernels = kernel_table(raw, plan.kernel, names, device_name)
            stages = stage_table(kernels, names)
            ops = opportunities(stages, stages["duration_us"].sum())
            trace = measured_trace(plan, run, kernels, stages, self.name)
            trace["summary"] = counter_summary(stages, kernels, ops)
            files = common_files(plan, run, trace, options, self.name)
            _, spec = match_device(device_name)
            clock = f"ncu --clock-control {options.clock_control}"
            headline = (f"One warm iteration under ncu on {device_name}: {stages['duration_us'].sum():,.1f} us of "
                        f"kernel time in {len(kernels) - trace['metadata']['kernels_outside_stages']} stage kernels.")
            files["report.md"] = render_report(trace, stage_sections(trace, stages, kernels, ops, spec, clock), headline)
            from app.report.plots import roofline_png   # matplotlib: only when a plot is drawn

            png = roofline_png(kernels, spec, f"{plan.kernel} {plan.version} on {device_name}")
            if png:
                files["roofline.png"] = png
            files["ncu_raw.csv"] = raw.drop(columns=["nvtx_stack"]).to_csv(index=False)
            files["kernels.csv"] = kernels.to_csv(index=False)
            files["stages.csv"] = stages.to_csv(index=False)
            summary = "\n".join([f"{plan.kernel} {plan.version} under ncu (annotation) on {device_name}:"] +
                                [f"  {r.stage:<28} {r.duration_us:>10,.1f} us  SM {r.sm_pct:5.1f}%  DRAM {r.dram_pct:5.1f}%"
                                 f"  {r.bottleneck}" for r in stages.itertuples()])
            return Profile(trace=trace, files=files, summary=summary)


def annotation_profile_plan(plan, out_dir=None, version=None, bench_runs=1, **options):
    """Seed 004's Python API: profile ``plan`` (or its kernel at ``version``) in annotation mode."""
    return _profile_api(AnnotationMode(), plan, out_dir, version, options)


def _profile_api(mode, plan, out_dir, version, options):
    from app.report.writer import profile_parent, write_profile

    if version is not None:
        plan = get_plan_class(plan.kernel, version)(plan.params)
    profile = mode.profile(plan, ProfileOptions(**options))
    if out_dir is not None:
        profile.files_written_to = write_profile(profile_parent(out_dir, mode.name, plan.kernel, plan.slug()),
                                                 profile.files)
    return profile
