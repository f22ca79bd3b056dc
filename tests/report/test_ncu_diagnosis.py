"""The counter modes' diagnosis on this project's own H200 captures (tests/fixtures/ncu): a stage whose kernel was
sampled mostly at barriers is named as such, a grid that fills its block slots but for a few is no issue, a stage
of copies has no time, and the FLOP rate is named by what it counts."""
import math

import pytest

from app.analysis.kernel_metrics import flop_rates, kernel_table, kernel_time, opportunities, stage_table
from app.analysis.summary import counter_summary
from app.kernel.plan import get_plan_class
from app.report.ncu_report import stage_sections
from app.runtime.profiling.ncu import with_barrier_lines
from app.runtime.profiling.parsers.ncu_csv import parse_raw
from tests.conftest import fixture_text

DEVICE = "NVIDIA H200"
PLANS = {"join": ("join", "v2"), "overlay": ("overlay", "v2")}


def _capture(name: str, stages: list[str] | None = None, raw=None):
    kernel, version = PLANS[name]
    names = stages or [s.name for s in get_plan_class(kernel, version)().stages]
    if raw is None:
        raw, _ = parse_raw(fixture_text(f"ncu/{name}.full.raw.csv"))
    kernels = kernel_table(raw, kernel, names, DEVICE)
    return names, kernels, stage_table(kernels, names)


def _sections(names, kernels, stages, summary=None):
    ops = opportunities(stages, kernel_time(stages))
    rows = stages.set_index("stage")
    trace = {"metadata": {"params": {}, "kernels_outside_stages": int(kernels["stage"].isna().sum())},
             "device": {"name": DEVICE}, "summary": summary,
             "stages": [{"name": n, "ncu": {k: (None if v != v else v) for k, v in rows.loc[n].items()},
                         "cost": None} for n in names]}
    return {s.title or "": s for s in stage_sections(trace, stages, kernels, ops, None, "ncu")}, ops


def test_a_stage_whose_kernel_waits_at_barriers_says_so_in_its_key_issue():
    """overlay v2's edge_pairs_sweep: 1,104 of its 2,133 warp samples (51.8%) waited at a barrier; the filter stage's
    Key Issue names it. The scan of 322 samples at 53% does the same for the event sort; one of 3 samples at 67%
    (join's scan_i32_i32) is too few to tell, and annotation mode's capture (no warp samples) names none."""
    names, kernels, stages = _capture("overlay")
    sections, _ = _sections(names, kernels, stages)
    issues = {r[0]: r[-1] for r in sections["Stages"].rows}
    assert issues["segment_mbr_filter"].startswith("edge_pairs_sweep: 52% of warp samples waiting at a barrier")
    assert issues["reconstruction_event_sort"].startswith("scan_i32_i32: 53% of warp samples waiting at a barrier")
    assert "barrier" not in issues["area_reconstruction"]          # area_rings: 22% of its samples
    names, kernels, stages = _capture("join")
    assert not any("barrier" in r[-1] for r in _sections(names, kernels, stages)[0]["Stages"].rows)
    ann, _ = parse_raw(fixture_text("ncu/overlay.annotation.csv"))
    names, kernels, stages = _capture("overlay", raw=ann)
    assert kernels["barrier_stall_pct"].isna().all()
    assert not any("barrier" in r[-1] for r in _sections(names, kernels, stages)[0]["Stages"].rows)


def test_the_root_cause_names_barrier_waits_with_ncus_cycles_and_the_line():
    """Where the longest stage's kernel was sampled mostly at barriers, SM% and DRAM% alone ("latency-bound") miss
    why: the root cause gives the share, the cycles ncu's CPIStall rule reads, and the line the hot-spot reader
    found most of the barrier samples on."""
    names, kernels, stages = _capture("overlay", ["segment_mbr_filter"])
    sweep = kernels[(kernels["kernel"] == "edge_pairs_sweep") & (kernels["warp_samples"] > 2000)].iloc[0]
    lines = {int(kernels.index.get_loc(sweep.name)): ("app/kernel/overlay/overlay.cu:123", 40.0)}
    sections, _ = _sections(names, with_barrier_lines(kernels, lines), stages)
    cause = sections[""].text.split("**Root cause:** ", 1)[1]
    assert ("Its kernel edge_pairs_sweep spent 51.8% of its warp samples (1,104 of 2,133) waiting at a barrier"
            in cause)
    assert "(40% on app/kernel/overlay/overlay.cu:123)" in cause
    assert f"ncu counts {sweep['barrier_cycles_per_issue']:.1f} of the {sweep['cycles_per_issue']:.1f} cycles" in cause
    issues = {r[0]: r[-1] for r in sections["Stages"].rows}
    assert "(40% on app/kernel/overlay/overlay.cu:123)" in issues["segment_mbr_filter"]
    names, kernels, stages = _capture("overlay", ["area_reconstruction"])
    assert "barrier" not in _sections(names, kernels, stages)[0][""].text


@pytest.mark.parametrize("waves, issue", [(0.99, False), (0.91, False), (0.85, True), (0.08, True)])
def test_a_grid_under_one_wave_is_an_issue_only_where_it_leaves_slots_empty(waves, issue):
    """join v5's output_fused ran 782 blocks in 792 slots, 0.99 waves/SM: 1% of the slots empty, about 0.2 of its
    17 us. The Key Issue and the "Fill the GPU" opportunity name a grid only from a tenth of the slots empty."""
    raw, _ = parse_raw(fixture_text("ncu/join.full.raw.csv"))
    raw.loc[raw["kernel"] == "refine", "waves_per_sm"] = waves             # predicate_refine's one kernel
    names, kernels, stages = _capture("join", raw=raw)
    sections, ops = _sections(names, kernels, stages)
    key = {r[0]: r[-1] for r in sections["Stages"].rows}["predicate_refine"]
    assert ("waves/SM" in key) is issue and any(o["name"].startswith("Fill the GPU in predicate_refine")
                                                for o in ops) is issue
    if issue:
        assert key.endswith(f"; {waves:.2f} waves/SM ({100 * (1 - waves):.0f}% of block slots empty)")


def test_a_stage_of_copies_has_no_time_and_the_total_is_the_kernels():
    """The build launches no kernel: ncu cannot time its copies. Its time, bytes and FLOPs are missing, not 0.0,
    and the kernel time is the other stages' (the headline's)."""
    names, kernels, stages = _capture("join")
    build = stages.set_index("stage").loc["owned_buffer_build"]
    assert build["kernels"] == 0 and not build["unprofiled"]
    assert all(math.isnan(build[c]) for c in ("duration_us", "dram_bytes", "fp64_flops", "local_spill_bytes"))
    assert kernel_time(stages) == pytest.approx(kernels.loc[kernels["stage"].notna(), "duration_us"].sum())
    sections, _ = _sections(names, kernels, stages)
    row = next(r for r in sections["Stages"].rows if r[0] == "owned_buffer_build")
    assert row[1] == "- (no kernels: ncu times kernels only)" and row[-2] == "no kernels"
    lost = stage_table(kernels[kernels["stage"] != "bounds"], names, {"bounds"})       # a stage whose kernels were lost
    assert math.isnan(kernel_time(lost))


def test_the_summarys_flop_rate_is_named_by_what_it_counts():
    """ncu counts fp32 operations beside fp64 ones (join v5's iteration: 4,692 of them): achieved_tflops holds both
    and says so, and each precision's rate is beside it; the report gives the same figures under the same names."""
    names, kernels, stages = _capture("join")
    ops = opportunities(stages, kernel_time(stages))
    summary = flop_rates(counter_summary(stages, kernels, ops), kernels)
    staged = kernels[kernels["stage"].notna()]
    secs = staged["duration_us"].sum() / 1e6
    assert staged["fp32_flops"].sum() > 0
    assert summary["achieved_tflops_fp64"] == pytest.approx(staged["fp64_flops"].sum() / secs / 1e12)
    assert summary["achieved_tflops_fp32"] == pytest.approx(staged["fp32_flops"].sum() / secs / 1e12)
    both = summary["achieved_tflops_fp64"] + summary["achieved_tflops_fp32"]
    assert summary["achieved_tflops"] == pytest.approx(both)
    assert "fp64 and fp32 operations together" in summary["rates_from"]
    note = _sections(names, kernels, stages, summary)[0]["Stages"].note
    assert "TFLOP/s counting fp64 and fp32 operations together (fp64 " in note
    untimed = kernels.copy()
    untimed.loc[untimed.index[3], "fp32_flops"] = float("nan")
    partial = flop_rates(counter_summary(stages, untimed, ops), untimed)
    assert partial["achieved_tflops_fp32"] is None and partial["achieved_tflops"] is None
    assert partial["achieved_tflops_fp64"] is not None and "fp32_flops" in partial["missing"]["achieved_tflops_fp32"]


def test_a_tail_waves_gain_is_the_slot_time_its_last_wave_leaves_empty():
    """ncu's LaunchConfiguration rule gives a partial last wave's share of the runtime (overlay v3's edge_pairs_warp:
    599 blocks on 528 slots, 1.13 waves, "up to 50.0%"); with blocks of equal time a grid of whole waves recovers
    the slot time that wave leaves empty, 43.3% of the kernel here. A grid under one wave keeps ncu's estimate."""
    from app.analysis.kernel_metrics import attribute_stages
    from app.runtime.profiling.ncu import _rule_ops
    from app.runtime.profiling.parsers.ncu_csv import parse_details

    raw, _ = parse_raw(fixture_text("ncu/overlay_v3.full.raw.csv"))
    _, rules = parse_details(fixture_text("ncu/overlay_v3.full.details.csv"))
    names = [s.name for s in get_plan_class("overlay", "v3")().stages]
    rules = rules.assign(stage=attribute_stages(rules, "overlay", names))
    kernels = kernel_table(raw, "overlay", names, DEVICE)
    ops = {o["name"]: o for o in _rule_ops(rules, raw, kernels)}
    warp = ops["LaunchConfiguration in segment_mbr_filter (edge_pairs_warp)"]
    row = raw[raw["kernel"] == "edge_pairs_warp"].iloc[0]
    share = 100 * float(kernels.loc[raw["kernel"] == "edge_pairs_warp", "duration_us"].iloc[0]) / float(
        kernels["duration_us"].sum())
    waves = float(row["grid_blocks"]) / 528
    assert round(waves, 2) == 1.13
    assert warp["gain_pct"] == pytest.approx(share * (2 - waves) / 2)
    assert "599 blocks on 528 block slots are 1.13 waves" in warp["trigger"] and "43.3%" in warp["trigger"]
    small = ops["LaunchConfiguration in segment_mbr_filter (sort_pairs)"]        # a grid under one wave
    assert "block slots" not in small["trigger"] and "speedup=93.9%" in small["trigger"]
