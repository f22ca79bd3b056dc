"""Counter modes on this project's own annotation capture of join v2 (tests/fixtures/ncu), with single
readings taken out or made impossible the ways ncu can deliver them (a column it did not collect, a cell
left empty or "n/a", a kernel outside every range): each is named where it is missing, never summed as
zero or skipped from a total, and no bottleneck, share or gain is drawn from it."""
import json
import math

import pytest

from app.analysis.kernel_metrics import kernel_table, kernel_time, kernel_time_text, opportunities, stage_table
from app.analysis.summary import counter_summary
from app.kernel.plan import get_plan_class
from app.report.ncu_report import stage_sections
from app.runtime.profiling.parsers.ncu_csv import parse_raw
from tests.conftest import fixture_text

STAGES = [s.name for s in get_plan_class("join", "v2")().stages]
DEVICE = "NVIDIA H200"


def raw():
    return parse_raw(fixture_text("ncu/join.annotation.csv"))[0]


def analyse(df):
    kernels = kernel_table(df, "join", STAGES, DEVICE)
    stages = stage_table(kernels, STAGES)
    ops = opportunities(stages, kernel_time(stages))
    return kernels, stages, ops


def report(kernels, stages, ops) -> str:
    trace = {"metadata": {"params": {"points": 20000}, "kernels_outside_stages": int(kernels["stage"].isna().sum())},
             "device": {"name": DEVICE}, "stages": []}
    out = []
    for s in stage_sections(trace, stages, kernels, ops, None, "ncu --clock-control none"):
        out += [s.title or "", s.text or "", str(s.rows), " ".join(o for o in (s.items or []))]
    return "\n".join(out)


def row(df, kernel):
    (i,) = df.index[df["kernel"] == kernel].tolist()
    return i


def test_the_capture_as_made_has_every_reading():
    kernels, stages, ops = analyse(raw())
    assert (kernels["missing"] == "").all()
    assert kernel_time(stages) == pytest.approx(kernels["duration_us"].sum())
    assert all(o["gain_pct"] is not None for o in ops)
    summary = counter_summary(stages, kernels, ops)
    assert summary["duration_us"] == pytest.approx(kernel_time(stages)) and "duration_us" not in summary["missing"]


@pytest.mark.parametrize("how", ["column", "empty", "n/a"])
def test_a_kernel_without_its_time_leaves_its_stage_and_the_total_without_one(how):
    df = raw()
    i = row(df, "init_run")
    if how == "column":
        df = df.drop(columns=["duration_ns"])
    else:
        df["duration_ns"] = df["duration_ns"].astype(object)
        df.loc[i, "duration_ns"] = "" if how == "empty" else "n/a"
    kernels, stages, ops = analyse(df)
    bounds = stages.set_index("stage").loc["bounds"]
    assert math.isnan(bounds["duration_us"]) and math.isnan(bounds["sm_pct"])      # not join_extent's 15.8 us of 17.6
    assert bounds["bottleneck"].startswith("n/a (gpu__time_duration.sum missing or flagged for")
    assert math.isnan(kernel_time(stages)) and "kernel time n/a (gpu__time_duration.sum" in kernel_time_text(stages)
    assert "gpu__time_duration.sum" in kernels.loc[i, "missing"]
    text = report(kernels, stages, ops)
    assert "**Bottleneck:** n/a" in text and "nan" not in text.replace("n/a", "")
    assert "est. gain unknown" in text
    summary = counter_summary(stages, kernels, ops)
    assert summary["duration_us"] is None and summary["achieved_gbps"] is None and summary["bottleneck"] == "n/a"
    assert "gpu__time_duration.sum" in summary["missing"]["duration_us"]


def test_a_rate_above_the_peak_is_flagged_and_its_readings_unused():
    df = raw()
    i = row(df, "refine")
    df.loc[i, "duration_ns"] = 100.0          # 1.06 MB in 100 ns: 10.6 TB/s on a 4.8 TB/s card
    kernels, stages, ops = analyse(df)
    k = kernels.loc[i]
    assert "above the NVIDIA H200's peak 4,800.0" in k["flags"] and "gpu__time_duration.sum=100 ns" in k["flags"]
    assert math.isnan(k["duration_us"]) and math.isnan(k["dram_bytes"]) and math.isnan(k["achieved_gbps"])
    assert stages.set_index("stage").loc["predicate_refine", "bottleneck"].startswith("n/a (")
    df.loc[i, "duration_ns"] = 0.0            # a kernel takes time: every rate would be infinite
    k = kernel_table(df, "join", STAGES, DEVICE).loc[i]
    assert "duration_us=0" in k["flags"] and math.isnan(k["achieved_gbps"])


def test_the_summary_divides_the_stage_kernels_bytes_by_their_own_time():
    df = raw()
    i = row(df, "refine")
    df.at[i, "nvtx_stack"] = [("join", "profile")]       # launched outside every stage range
    kernels, stages, ops = analyse(df)
    assert kernels.loc[i, "stage"] is None
    staged = kernels[kernels["stage"].notna()]
    summary = counter_summary(stages, kernels, ops)
    assert summary["achieved_gbps"] == pytest.approx(staged["dram_bytes"].sum() / staged["duration_us"].sum() / 1e3)
    assert summary["duration_us"] == pytest.approx(staged["duration_us"].sum())
    text = report(kernels, stages, ops)
    assert "nan" not in text.replace("n/a", "")                              # the stage cell reads "-"


def test_spills_waves_and_l2_with_a_part_missing_are_missing():
    df = raw().drop(columns=["local_load_bytes"])
    kernels, stages, ops = analyse(df)
    refine = stages.set_index("stage").loc["predicate_refine"]
    assert math.isnan(refine["local_spill_bytes"])                            # not its stores' 662,304 B alone
    assert "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum" in kernels.loc[row(df, "refine"), "missing"]
    assert not any("spills" in o["name"] for o in ops)

    df = raw()
    i = row(df, "join_extent")
    df["waves_per_sm"] = df["waves_per_sm"].astype(object)
    df.loc[i, "waves_per_sm"] = "n/a"
    kernels, stages, ops = analyse(df)
    assert math.isnan(stages.set_index("stage").loc["bounds", "waves_per_sm"])     # not init_run's 0.00
    assert not any(o["name"].startswith("Fill the GPU in bounds") for o in ops)

    df = raw()
    heavy = kernel_table(df, "join", STAGES, DEVICE)
    i = heavy.index[(heavy["stage"] == "candidate_filter") & heavy["l2_judged"]][0]
    df["l2_hit_pct"] = df["l2_hit_pct"].astype(object)
    df.loc[i, "l2_hit_pct"] = ""
    kernels, stages, ops = analyse(df)
    assert math.isnan(stages.set_index("stage").loc["candidate_filter", "l2_hit_pct"])
    assert not any(o["name"].startswith("Improve locality in candidate_filter") for o in ops)


def _units_changed(column: str, unit: str) -> str:
    """The committed capture with ``column``'s unit cell replaced (the values as they were)."""
    import csv
    import io

    text = fixture_text("ncu/join.annotation.csv")
    lines = text.splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.reader(io.StringIO("".join(lines[i:]))))
    rows[1][rows[0].index(column)] = unit
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return "".join(lines[:i]) + buf.getvalue()


def test_a_reading_in_an_unknown_unit_is_missing_with_its_unit_named():
    df, units = parse_raw(_units_changed("dram__bytes_read.sum", "sector"))
    kernels = kernel_table(df, "join", STAGES, DEVICE, units=units)
    stages = stage_table(kernels, STAGES)
    ops = opportunities(stages, kernel_time(stages))
    assert kernels["dram_bytes"].isna().all() and kernels["achieved_gbps"].isna().all()
    assert all("dram__bytes_read.sum (unit 'sector' not understood (expected one of 'byte', 'Kbyte'" in m
               for m in kernels["missing"])
    assert kernel_time(stages) == pytest.approx(kernels["duration_us"].sum())      # the time is still read
    text = report(kernels, stages, ops)
    assert "dram__bytes_read.sum (unit 'sector' not understood" in text
    # Without the units the reading is still missing (parse_raw left it out), named by the metric alone.
    assert all("dram__bytes_read.sum" in m for m in kernel_table(df, "join", STAGES, DEVICE)["missing"])


def test_a_stage_that_ran_gpu_work_without_a_kernel_in_the_capture_is_missing_not_zero():
    from app.analysis.kernel_metrics import stages_with_gpu_work
    from app.runtime.profiling.counters import summary

    df = raw()
    df = df[df["kernel"] != "refine"].reset_index(drop=True)          # the capture lost refine
    # The capture's own worker record: on the GPU, every stage given rows, the compile record naming the stages
    # that launch kernels of their own (all but the build, which only copies).
    record = json.loads(fixture_text("ncu/join.compile.json"))
    worker = {"selection": {"selected": "gpu"}, "compile": record,
              "stages": [{"name": n, "device": "gpu", "rows_in": 100} for n in STAGES]}
    assert stages_with_gpu_work(worker) == set(STAGES) - {"owned_buffer_build"}
    kernels = kernel_table(df, "join", STAGES, DEVICE)
    stages = stage_table(kernels, STAGES, stages_with_gpu_work(worker))
    ops = opportunities(stages, kernel_time(stages))
    refine = stages.set_index("stage").loc["predicate_refine"]
    assert refine["kernels"] == 0 and refine["unprofiled"]
    assert math.isnan(refine["duration_us"]) and math.isnan(refine["achieved_gbps"])         # not 0.0 us
    assert refine["bottleneck"] == ("n/a (no kernel profiled, though the stage ran on the GPU: "
                                    "gpu__time_duration.sum missing)")
    assert math.isnan(kernel_time(stages))
    assert kernel_time_text(stages) == "kernel time n/a (no kernel profiled in predicate_refine, which ran on the GPU)"
    assert all(o["gain_pct"] is None for o in ops)                  # a share of an unknown total is unknown
    text = report(kernels, stages, ops)
    assert "**Bottleneck:** n/a" in text and "nan" not in text.replace("n/a", "")
    s = summary(stages, kernels, ops)
    assert s["duration_us"] is None and s["achieved_gbps"] is None and s["bottleneck"] == "n/a"
    assert "predicate_refine" in s["missing"]["duration_us"]

    # A CPU run, or a stage given no rows, launched nothing: "no kernels" stays a finding, not a gap.
    for w in ({"selection": {"selected": "cpu"}, "stages": [{"name": n, "device": "cpu", "rows_in": 100}
                                                            for n in STAGES]},
              {"selection": {"selected": "gpu"}, "stages": [{"name": n, "device": "gpu", "rows_in": 0}
                                                            for n in STAGES]}):
        refine = stage_table(kernels, STAGES, stages_with_gpu_work(w)).set_index("stage").loc["predicate_refine"]
        assert refine["bottleneck"] == "no kernels" and not refine["unprofiled"]

    # A GPU stage of copies alone (the build) launches no kernel of ours: the backend's compile record lists the
    # stages that do, and a capture with none in the build lost nothing there.
    assert STAGES[0] == "owned_buffer_build" and not (kernels["stage"] == STAGES[0]).any()   # none in the capture
    build = stages.set_index("stage").loc[STAGES[0]]
    assert build["bottleneck"] == "no kernels" and not build["unprofiled"]
    # ncu times kernels only: the build's row gives no time rather than a time of zero
    trace = {"metadata": {"params": {}, "kernels_outside_stages": 0}, "device": {"name": DEVICE}, "stages": []}
    table = next(t for t in stage_sections(trace, stages, kernels, ops, None, "x") if t.title == "Stages")
    assert table.rows[0][:2] == [STAGES[0], "- (no kernels: ncu times kernels only)"]
    assert table.rows[1][0] == STAGES[1] and table.rows[1][1] == f"{stages.iloc[1]['duration_us']:,.1f}"
    # Without that record every GPU stage given rows is expected to launch kernels: the build is then missing too.
    bare = {"selection": {"selected": "gpu"}, "stages": worker["stages"]}
    assert stages_with_gpu_work(bare) == set(STAGES)
