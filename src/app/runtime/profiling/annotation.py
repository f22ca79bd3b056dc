"""annotation mode: the plan's worker under ncu with a compact metric set, one warm iteration.

Per kernel and per stage: GPU time, DRAM bytes, fp64/fp32 FLOPs, SM%/DRAM%,
achieved occupancy, L2 hit rate, local-memory traffic, waves per SM, registers, block
and grid; achieved GB/s and TFLOP/s against the devices table; the bottleneck
classes. Writes report.md, roofline.png and the tables as CSV.
"""
from __future__ import annotations

from app.analysis.kernel_metrics import (flop_rates, kernel_table, kernel_time, kernel_time_text, opportunities,
                                        stage_table, stages_with_gpu_work)
from app.report.markdown import fmt
from app.report.ncu_report import render_report, stage_sections
from app.runtime.profiling import counters
from app.runtime.profiling.base import Mode, Profile, ProfileOptions, register_mode
from app.runtime.profiling.ncu_session import run_under_ncu
from app.runtime.profiling.parsers.columns import ANNOTATION_METRICS
from app.runtime.profiling.parsers.ncu_csv import parse_raw


@register_mode
class AnnotationMode(Mode):
    name = "annotation"

    def profile(self, plan, options: ProfileOptions) -> Profile:
        counters.check_options(options, self.name)
        ncu_args = ["--csv", "--page", "raw", "--print-units", "base", "--metrics", ",".join(ANNOTATION_METRICS)]
        with run_under_ncu(plan, options, ncu_args, "ncu annotation") as run:
            raw, units = parse_raw(run.stdout, run.ncu_version, source="ncu's raw CSV (ncu annotation's stdout)")
            names = [s.name for s in plan.stages]
            device_name = run.worker["selection"]["device_name"]
            spec = counters.device_spec(run)
            kernels = kernel_table(raw, plan.kernel, names, device_name, spec, units=units,
                                   model_bytes=counters.model_dram_bytes(run))
            stages = stage_table(kernels, names, stages_with_gpu_work(run.worker))
            ops = opportunities(stages, kernel_time(stages))
            trace = counters.measured_trace(plan, run, kernels, stages, self.name)
            trace["summary"] = flop_rates(counters.summary(stages, kernels, ops), kernels)
            files = counters.common_files(plan, run, trace, options, self.name)
            clock = f"ncu {run.ncu_version or '(version unread)'} --clock-control {options.clock_control}"
            headline = counters.headline_prefix(trace) + (
                f"One warm iteration under ncu on {device_name}: {kernel_time_text(stages)} in "
                f"{len(kernels) - trace['metadata']['kernels_outside_stages']} stage kernels.")
            sections = stage_sections(trace, stages, kernels, ops, spec, clock)
            pictures, picture_sections = counters.pictures(kernels, spec, device_name, plan)
            files |= pictures
            sections += picture_sections + counters.evidence_sections(trace, files["params.json"])
            files["report.md"] = render_report(trace, sections, headline)
            files["ncu_raw.csv"] = raw.drop(columns=["nvtx_stack"]).to_csv(index=False)
            files["kernels.csv"] = kernels.to_csv(index=False)
            files["stages.csv"] = stages.to_csv(index=False)
            summary = "\n".join([f"{plan.kernel} {plan.version} under ncu (annotation) on {device_name}:"] +
                                [f"  {r.stage:<28} {fmt(r.duration_us):>10} us  SM {fmt(r.sm_pct):>5}%  "
                                 f"DRAM {fmt(r.dram_pct):>5}%  {r.bottleneck}" if r.kernels or r.unprofiled else
                                 f"  {r.stage:<28} {'-':>10}     no kernels (ncu times kernels only)"
                                 for r in stages.itertuples()])
            return Profile(trace=trace, files=files, summary=summary, ok=counters.verification_ok(trace))


def annotation_profile_plan(plan, out_dir=None, version=None, bench_runs=None, **options):
    """Profile ``plan`` (or its kernel at ``version``) in annotation mode; ``bench_runs`` may only be 1."""
    return counters.profile_api(AnnotationMode(), plan, out_dir, version, bench_runs, options)
