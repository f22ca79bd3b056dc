"""What annotation and ncu mode share after their ncu session: the trace, the common files, the
report's evidence sections and headline, the option checks and the Python API entry point.

Both modes profile one warm iteration of the plan's worker under ncu; they differ only in the
metrics they ask for and the extra pages ncu mode exports.
"""
from __future__ import annotations

from dataclasses import fields

from app.analysis.kernel_metrics import kernel_time
from app.analysis.summary import counter_summary
from app.errors import BadParameter, VerificationFailed
from app.kernel.plan import get_plan_class
from app.report.sections import device_section, transfers_section, verification_section
from app.runtime.profiling.base import ProfileOptions
from app.runtime.profiling.session import profile_files


def check_options(options: ProfileOptions, mode: str) -> None:
    """One warm iteration is what ncu replays; an explicit other count is refused, not ignored."""
    options.refuse_event_only(mode)
    if options.bench_runs not in (None, 1):
        raise BadParameter(f"--bench_runs {options.bench_runs}: {mode} mode profiles one warm iteration (ncu replays "
                           "each kernel once per metric pass); leave --bench_runs out, or use --prof_type event or "
                           "nsys for the spread over several runs")


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
            # None, not NaN (which JSON cannot hold), when a kernel's time is missing: the report names it.
            "elapsed_seconds": _seconds(m["duration_us"]), "rows_in": w["rows_in"], "rows_out": w["rows_out"],
            "metadata": dict(w["meta"]) | w["counters"] | {"kernels": int(m["kernels"])},
            "ncu": {k: (None if v != v else float(v)) for k, v in m.items()
                    if k not in ("stage", "bottleneck", "unprofiled")}
                   | {"bottleneck": m["bottleneck"], "unprofiled": bool(m.get("unprofiled", False))},
            "tiling": plan.tiling[spec.name], "cost": worker.get("costs", {}).get(spec.name),
        })
    sel = worker["selection"]
    return {
        "schema": "app.trace/1", "kernel": plan.kernel, "version": plan.version, "mode": mode,
        "selected_runtime": sel["selected"], "requested_runtime": sel["requested"],
        "device": {"name": sel["device_name"]} | sel["info"],
        "total_elapsed_seconds": _seconds(kernel_time(stages)),
        "timing": {"clock": "ncu gpu__time_duration per kernel, one warm iteration", "timed_runs": 1},
        "metadata": {"planner_selected_runtime": sel["planner"], "selection_reason": sel["reason"],
                     "params": plan.params, "nvtx": worker["nvtx"],
                     "verification": worker.get("verification"),
                     "output_residency": "device" if sel["selected"] == "gpu" else "host",
                     "compile_options": worker.get("compile", {}).get("options"),
                     "kernels_outside_stages": int(kernels["stage"].isna().sum()),
                     "tool": {"ncu": run.ncu, "version": run.ncu_version, "command": run.command}},
        "stages": out_stages,
    }


def summary(stages, kernels, ops) -> dict:
    """trace.json's summary (counter_summary), with a stage that ran GPU work but has no kernel in the capture
    (stage_table's ``unprofiled``) leaving the time, every rate and every weighted average missing, named:
    counter_summary sums the kernels the capture has, which would be the other stages' time alone."""
    out = counter_summary(stages, kernels, ops)
    lost = stages.loc[stages["unprofiled"], "stage"].tolist() if "unprofiled" in stages else []
    if lost:
        why = f"no kernel profiled in {', '.join(lost)}, which ran on the GPU (gpu__time_duration.sum missing)"
        for key in ("duration_us", "achieved_tflops", "achieved_gbps", "occupancy_pct", "sm_pct"):
            out[key] = None
            out["missing"][key] = why
        out["bottleneck"] = "n/a"
    return out


def _seconds(us) -> float | None:
    return float(us) / 1e6 if us == us else None


def common_files(plan, run, trace, options, mode) -> dict:
    files = profile_files(plan, run.worker, run.selection, options, mode, {"ncu": run.ncu_version})
    files["params.json"]["clocks"]["ncu_clock_control"] = options.clock_control
    trace["metadata"]["clocks"] = files["params.json"]["clocks"]     # the report's Configuration shows them
    files["trace.json"] = trace
    return files


def device_spec(run) -> dict | None:
    """The peaks of the GPU the worker ran on: its calibrated ones when cached for its UUID, else the table's."""
    from app.analysis.calibration import spec_for

    sel = run.worker["selection"]
    return spec_for(sel["device_name"], (sel.get("info") or {}).get("uuid"))[1]


def model_dram_bytes(run) -> dict:
    """{stage: the cost model's DRAM bytes} from the worker's costs (host->device copies left out: they are
    not kernel DRAM traffic)."""
    return {name: c["bytes"] for name, c in (run.worker.get("costs") or {}).items()
            if c and c.get("kind", "dram") == "dram" and c.get("bytes") is not None}


def headline_prefix(trace: dict) -> str:
    """A CPU fallback or a planner override leads the headline: every figure below depends on it."""
    sel, meta = trace["selected_runtime"], trace["metadata"]
    if sel != "gpu":
        return f"**CPU FALLBACK: the plan ran on the CPU ({meta['selection_reason']}); no GPU counters.** "
    if meta["planner_selected_runtime"] != sel:
        return (f"**Planner override: the planner would run this on the {meta['planner_selected_runtime']} "
                f"({meta['selection_reason']}); the counter mode ran it on the GPU.** ")
    return ""


def verification_ok(trace: dict) -> bool:
    v = trace["metadata"].get("verification")
    return v is None or bool(v["matches"])


def evidence_sections(trace: dict, params_json: dict) -> list:
    """The sections event mode also has: transfers and syncs, verification, device."""
    return [transfers_section(trace), verification_section(trace), device_section(trace, params_json)]


def profile_api(mode, plan, out_dir, version, bench_runs, options):
    """The Python API of a counter mode: profile ``plan`` (or its kernel at ``version``)."""
    from app.report.writer import check_writable, profile_parent, write_profile

    if version is not None:
        plan = get_plan_class(plan.kernel, version)(plan.params)
    try:
        opts = ProfileOptions(bench_runs=bench_runs, **options)
    except TypeError:
        known = sorted(f.name for f in fields(ProfileOptions) if f.name != "argv")
        raise BadParameter(f"{mode.name}_profile_plan got an unknown option among {sorted(options)}; known: "
                           + ", ".join(known)) from None
    if out_dir is not None:            # checked before the run, as the CLI checks --out
        check_writable(profile_parent(out_dir, mode.name, plan.kernel, plan.slug()))
    profile = mode.profile(plan, opts)
    if out_dir is not None:
        profile.files_written_to = write_profile(profile_parent(out_dir, mode.name, plan.kernel, plan.slug()),
                                                 profile.files)
    if not profile.ok:                 # a wrong answer's timings are no measurement: raised, as the CLI exits 9
        from app.analysis.baseline import unverified_reason

        kept = (f"the profile is kept at {profile.files_written_to}" if out_dir is not None
                else "nothing was written (pass out_dir to keep it)")
        why = unverified_reason(profile.trace) or "the output was judged wrong"
        err = VerificationFailed(f"{mode.name}_profile_plan: {why}; {kept}; the Profile is on this exception's "
                                 ".profile")
        err.profile = profile
        raise err
    return profile


def pictures(kernels, spec, device_name: str, plan) -> tuple[dict, list]:
    """roofline.png and bandwidth.png with the sections that embed them (or say why one is missing)."""
    from app.report.pictures import picture_sections   # matplotlib: only when a picture is drawn

    return picture_sections(kernels, spec, f"{plan.kernel} {plan.version} on {device_name}", device_name)
