"""trace.json from run records: stage medians with spread, cold apart from warm.

The field names follow seed 000 (selected_runtime, metadata.planner_selected_runtime,
total_elapsed_seconds, stages[] with name/category/device/elapsed_seconds/rows_in/
rows_out/metadata); docs/trace.md documents every field.
"""
from __future__ import annotations

from dataclasses import asdict

from app.kernel.plan import stages_tile_run
from app.runtime.stats import spread

SCHEMA = "app.trace/1"


def build_trace(plan, inputs, selection, cold, runs, *, mode: str, nvtx: dict,
                compile_info: dict, warmup: int, verification: dict | None) -> dict:
    last = runs[-1]
    stages = []
    for i, spec in enumerate(plan.stages):
        rec = last.stages[i]
        times = [r.stages[i]["seconds"] for r in runs]
        sp = spread(times)
        meta = dict(rec["meta"]) | rec["counters"]
        if rec["size_reads"]:
            meta["allocation_size_read_reasons"] = rec["size_reads"]
        cost = plan.cost(spec.name, rec["rows_in"], rec["rows_out"], rec["meta"], inputs)
        stages.append({
            "name": spec.name, "category": spec.category, "device": rec["device"],
            "elapsed_seconds": sp["median"], "spread": sp,
            "cold_seconds": cold.stages[i]["seconds"],
            "host_seconds": spread([r.stages[i]["host_seconds"] for r in runs])["median"],
            "rows_in": rec["rows_in"], "rows_out": rec["rows_out"],
            "metadata": meta, "tiling": plan.tiling[spec.name], "cost": asdict(cost),
        })
    totals = spread([r.total_seconds for r in runs])
    # End to end = host arrays in; "after build" leaves out the stages that copy the inputs to the device
    # (their cost is on the host link), run by run, so both figures come from the same runs.
    copies = [i for i, s in enumerate(stages) if s["cost"]["kind"] == "host_link"]
    after_build = spread([r.total_seconds - sum(r.stages[i]["seconds"] for i in copies) for r in runs]) \
        if copies else None
    sums = [r.stage_sum for r in runs]
    uncovered = [r.total_seconds - s for r, s in zip(runs, sums)]
    return {
        "schema": SCHEMA,
        "kernel": plan.kernel, "version": plan.version, "mode": mode,
        "selected_runtime": selection.selected,
        "requested_runtime": selection.requested,
        "device": {"name": selection.device_name} | selection.info,
        "total_elapsed_seconds": totals["median"],
        "timing": {
            "total": totals,
            "wall": spread([r.wall_seconds for r in runs]),
            "stage_sum_seconds": spread(sums)["median"],
            "uncovered_seconds": spread(uncovered)["median"],
            "uncovered_fraction": spread(uncovered)["median"] / totals["median"] if totals["median"] else 0.0,
            # The run is its stages in order, each stage's closing mark the next one's opening and the last one's
            # the run's end: no time between stages is left to uncover (it is inside a stage's time).
            "stages_tile_run": all(u == 0 for u in uncovered) and stages_tile_run(plan),
            "clock": "CUDA events on the plan's stream" if selection.selected == "gpu"
                     else "time.perf_counter (monotonic)",
            "warmup_runs": warmup, "timed_runs": len(runs),
            "after_build": after_build,
            "build_stages": [stages[i]["name"] for i in copies],
        },
        "cold": {
            "compile_seconds": compile_info.get("total_seconds", 0.0),
            "compile": compile_info,
            "total_seconds": cold.total_seconds,
            "wall_seconds": cold.wall_seconds,
            "first_run_overhead_seconds": cold.total_seconds - totals["median"],
        },
        "metadata": {
            "planner_selected_runtime": selection.planner,
            "selection_reason": selection.reason,
            "params": plan.params,
            "nvtx": nvtx,
            "verification": verification,
            "output_residency": "device" if selection.selected == "gpu" else "host",
            **({"cpu_stages_of": plan.cpu_stages_of} if selection.selected == "cpu" and plan.cpu_stages_of else {}),
        },
        "stages": stages,
    }
