"""The report's pictures draw only what was measured: point and bar selection, floors, and the why-not texts."""
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from app.analysis.devices import match_device
from app.analysis.roofline import plan_roofline
from app.kernel.cli import main
from app.report import plots
from app.report.pictures import picture_sections

PNG = b"\x89PNG\r\n\x1a\n"
NAN = float("nan")
SPEC = match_device("NVIDIA H200")[1]
EVENT_TRACE = Path(__file__).resolve().parents[1] / "data" / "event" / "join_v1_1M_100k_h200.trace.json"
SORT = "void cub::DeviceRadixSortOnesweepKernel<cub::policy_hub<long, cub::NullType>>(long *, int)"


def kernels(rows=None) -> pd.DataFrame:
    """Shaped like kernel_table's output (the columns the pictures read, plus a few they ignore)."""
    rows = rows or [
        # stage,           kernel,       us,    DRAM bytes, fp64 FLOPs, fp32 FLOPs
        ("predicate_refine", "refine",     100.0, 50e6,       4e8,        0.0),      # fp64 only
        ("candidate_filter", "filter32",    50.0, 10e6,       0.0,        2e8),      # fp32 only
        ("bounds",           "bounds_k",   143.0, 52e6,       0.0,        0.0),      # no FP work
        ("morton_sort",      SORT,          40.0,  8e6,       0.0,        0.0),      # no FP work, 2 launches
        ("morton_sort",      SORT,          60.0,  8e6,       0.0,        0.0),
        ("output_sort",      "scatter",     30.0,  NAN,       0.0,        0.0),      # bytes flagged
        ("output_sort",      "scan",         NAN,  1e6,       0.0,        0.0),      # duration missing
        ("output_sort",      "nan_fp64",    20.0,  1e6,       NAN,        0.0),      # fp64 count missing
        ("predicate_refine", "nan_bytes_fp", 10.0, NAN,       1e6,        NAN),      # FP work, bytes missing
        (None,               "outside",      5.0,  1e6,       0.0,        0.0),      # outside every stage
    ]
    df = pd.DataFrame(rows, columns=["stage", "kernel", "duration_us", "dram_bytes", "fp64_flops", "fp32_flops"])
    secs = df["duration_us"] / 1e6
    df["achieved_gbps"] = df["dram_bytes"] / secs / 1e9
    df["achieved_tflops_fp64"] = df["fp64_flops"] / secs / 1e12
    df["arithmetic_intensity"] = df["fp64_flops"] / df["dram_bytes"]
    df["sm_pct"] = df["dram_pct"] = 50.0
    df["flags"] = ""
    return df


def test_short_name_drops_templates_namespaces_and_parameters():
    assert plots.short_name(SORT) == "DeviceRadixSortOnesweepKernel"
    assert plots.short_name("cupy_copy__int64_int64") == "cupy_copy__int64_int64"
    assert plots.short_name("(anonymous namespace)::scan_k(int)") == "scan_k"
    assert len(plots.short_name("k" * 80)) == 30


def test_fp_points_one_per_precision_with_fp32_rates_derived():
    pts = plots.fp_points(kernels())
    assert sorted(zip(pts["kernel"], pts["precision"])) == [("filter32", "fp32"), ("refine", "fp64")]
    r = pts.set_index("kernel")
    assert r.loc["refine", "intensity"] == pytest.approx(4e8 / 50e6)
    assert r.loc["refine", "tflops"] == pytest.approx(4e8 / 100e-6 / 1e12)
    assert r.loc["filter32", "intensity"] == pytest.approx(2e8 / 10e6)
    assert r.loc["filter32", "tflops"] == pytest.approx(2e8 / 50e-6 / 1e12)


def test_fp_points_skip_nan_and_zero_bytes_never_plot_zero():
    df = kernels([("s", "both", 10.0, 1e6, 1e6, 3e6), ("s", "nan_time", NAN, 1e6, 1e6, 1e6),
                  ("s", "zero_bytes", 10.0, 0.0, 1e6, 0.0), ("s", "nan_fp32", 10.0, 1e6, 1e6, NAN)])
    pts = plots.fp_points(df)
    assert sorted(zip(pts["kernel"], pts["precision"])) == [("both", "fp32"), ("both", "fp64"),
                                                              ("nan_fp32", "fp64")]
    assert (pts["intensity"] > 0).all() and (pts["tflops"] > 0).all() and pts.notna().all().all()


def test_repeated_launches_pool_into_one_time_weighted_row():
    rows = plots.bandwidth_rows(kernels(), SPEC)
    sort = rows[rows["kernel"] == SORT].iloc[0]
    assert sort["launches"] == 2 and sort["duration_us"] == 100.0
    assert sort["achieved_gbps"] == pytest.approx(16e6 / 100e-6 / 1e9)
    assert sort["label"] == "morton_sort: DeviceRadixSortOnesweepKernel \u00d72"


def test_bandwidth_rows_only_measured_kernels_without_fp_work_sorted_by_time():
    rows = plots.bandwidth_rows(kernels(), SPEC)
    assert list(rows["kernel"]) == ["bounds_k", SORT, "outside"]   # by time; NaN bytes/time/FLOPs left out
    assert rows.iloc[2]["stage"] == plots.NO_STAGE
    b = rows.iloc[0]
    assert b["achieved_gbps"] == pytest.approx(52e6 / 143e-6 / 1e9)
    assert b["pct_of_peak"] == pytest.approx(100 * b["achieved_gbps"] / SPEC["memory_gbps"])


def test_kernels_in_neither_picture_are_named():
    left = plots.unplaced_kernels(kernels())
    assert sorted(left["kernel"]) == ["nan_bytes_fp", "nan_fp64", "scan", "scatter"]


@pytest.mark.parametrize("stage_dtype,kernel_dtype", [(object, "str"), ("str", object), (object, object),
                                                       ("str", "str")])
def test_every_kernel_of_a_real_capture_is_placed_whatever_its_columns_dtypes(stage_dtype, kernel_dtype):
    """The join's annotation capture (tests/fixtures/ncu), as kernel_table builds it: every kernel is in a picture.
    On an H200 host with pandas 3.0.6 (stage an object column, kernel a string one) every kernel was called missing:
    joining the two with "\x00" dropped the NUL on one side only. Keys are tuples now; each mix of dtypes here."""
    from app.analysis.kernel_metrics import kernel_table
    from app.kernel.plan import get_plan_class
    from app.runtime.profiling.parsers.ncu_csv import parse_raw
    from tests.conftest import fixture_text

    stages = [s.name for s in get_plan_class("join", "v2")().stages]
    table = kernel_table(parse_raw(fixture_text("ncu/join.annotation.csv"))[0], "join", stages, "NVIDIA H200", SPEC)
    table = table.assign(stage=table["stage"].astype(stage_dtype), kernel=table["kernel"].astype(kernel_dtype))
    assert len(plots.fp_points(table)) + len(plots.bandwidth_rows(table, None)) > 0
    assert plots.unplaced_kernels(table).empty


def test_pictures_are_pngs_and_none_without_spec_or_eligible_kernels():
    df = kernels()
    assert plots.roofline_png(df, SPEC, "t")[:8] == PNG
    assert plots.bandwidth_png(df, SPEC, "t")[:8] == PNG
    assert plots.roofline_png(df, None, "t") is None and plots.bandwidth_png(df, None, "t") is None
    no_fp = df[(df["fp64_flops"] == 0) & (df["fp32_flops"] == 0)]
    assert plots.roofline_png(no_fp, SPEC, "t") is None
    only_fp = df[df["kernel"].isin(["refine", "filter32"])]
    assert plots.bandwidth_png(only_fp, SPEC, "t") is None


def test_bandwidth_chart_caps_the_bars():
    many = kernels([("s", f"k{i}", float(i + 1), 1e6, 0.0, 0.0) for i in range(40)])
    assert len(plots.bandwidth_rows(many, SPEC)) == 40
    assert plots.bandwidth_png(many, SPEC, "t")[:8] == PNG


def test_picture_sections_embed_both_pictures_with_reading_guides():
    files, sections = picture_sections(kernels(), SPEC, "join v2 on NVIDIA H200", "NVIDIA H200")
    assert set(files) == {"roofline.png", "bandwidth.png"} and all(v[:8] == PNG for v in files.values())
    texts = [s.text for s in sections]
    assert "](roofline.png)" in texts[0] and "How to read it" in texts[0]
    assert "](bandwidth.png)" in texts[1] and "How to read it" in texts[1]
    assert sections[-1].note.startswith("Not in either picture, 4 kernel(s)")
    assert "output_sort: scatter" in sections[-1].note and "predicate_refine: nan_bytes_fp" in sections[-1].note


def test_picture_sections_say_why_a_picture_is_missing():
    files, sections = picture_sections(kernels(), None, "t", "NVIDIA B300")
    assert files == {}
    assert sections[0].text.startswith("No roofline: 'NVIDIA B300' is not in the devices table (conf/devices.json)")
    assert "python -m app.kernel devices" in sections[0].text and "stands without it" in sections[0].text
    assert sections[1].text.startswith("No bandwidth chart: 'NVIDIA B300' is not in the devices table")
    no_fp = kernels()[lambda d: (d["fp64_flops"] == 0) & (d["fp32_flops"] == 0)]
    files, sections = picture_sections(no_fp, SPEC, "t")
    assert set(files) == {"bandwidth.png"}
    assert sections[0].text == ("No roofline: none of the profiled kernels executed floating-point "
                                "instructions; see the bandwidth chart.")
    only_fp = kernels()[lambda d: d["kernel"] == "refine"]
    files, sections = picture_sections(only_fp, SPEC, "t")
    assert set(files) == {"roofline.png"} and sections[1].text.startswith("No bandwidth chart:")
    unplaceable = kernels()[lambda d: d["kernel"] == "nan_bytes_fp"]
    files, sections = picture_sections(unplaceable, SPEC, "t")
    assert files == {} and "DRAM bytes or duration are missing" in sections[0].text
    assert sections[-1].note is None          # no picture: the reasons above cover every kernel


def test_stage_floor_is_min_bytes_over_peak_bandwidth():
    trace = json.loads(EVENT_TRACE.read_text())
    roof = plan_roofline(trace["device"]["name"], trace["selected_runtime"], trace["stages"])
    rows = plots.stage_rows(trace, roof).set_index("stage")
    for s in trace["stages"]:
        r = rows.loc[s["name"]]
        assert r["device_us"] == pytest.approx(s["elapsed_seconds"] * 1e6)
        assert r["host_us"] == pytest.approx(s["host_seconds"] * 1e6)
        if s["name"] in roof["stages"]:
            assert r["floor_us"] == pytest.approx(roof["stages"][s["name"]]["bytes"] / (roof["peak_gbps"] * 1e9) * 1e6)
        else:
            assert math.isnan(r["floor_us"]) and "host link" in r["note"]
    assert plots.stage_chart_png(trace, roof, "join v1 on gpu")[:8] == PNG
    assert plots.stage_chart_subtitle(roof) == "floor = the cost model's DRAM bytes / 4,800 GB/s (H200)"


def test_stage_chart_without_roofline_and_with_idle_stages():
    trace = json.loads(EVENT_TRACE.read_text())
    trace["stages"][0]["device"] = "cpu"
    trace["stages"][1]["elapsed_seconds"] = 0.0
    roof = {"available": False, "why": "ran on the CPU: conf/devices.json holds GPU peaks only"}
    rows = plots.stage_rows(trace, roof)
    assert len(rows) == len(trace["stages"]) and rows["floor_us"].isna().all()
    assert rows.loc[0, "note"] == "ran on the CPU" and rows.loc[1, "note"] == "no GPU work"
    assert plots.stage_chart_png(trace, roof, "t")[:8] == PNG
    assert plots.stage_chart_subtitle(roof) == "no memory-roof floor: ran on the CPU: conf/devices.json holds GPU peaks only"
    assert plots.stage_chart_png({"stages": []}, roof, "t") is None


def test_event_profile_on_cpu_writes_and_embeds_the_stage_chart(tmp_path):
    assert main(["join", "--points", "2000", "--polygons", "200", "--prof_type", "event", "--device", "cpu",
                 "--out", str(tmp_path)]) == 0
    (d,) = [p for p in tmp_path.glob("profiles/event/join/*/*") if p.is_dir()]
    assert (d / "stage_chart.png").read_bytes()[:8] == PNG
    report = (d / "report.md").read_text()
    assert "## Stage chart" in report
    assert "![Time per stage: device vs host issue, with the memory-roof floor](stage_chart.png)" in report
    assert "no memory-roof floor is drawn: ran on the CPU" in report


def test_the_stage_chart_legend_covers_no_bar_and_no_figure():
    """The default overlay on an H200: the legend sat on area_reconstruction's bar and its figures ("184.3 us, host
    178.5 us, ..."). It has a band of its own below the last stage."""
    import matplotlib.pyplot as plt

    trace = json.loads((EVENT_TRACE.parent / "overlay_v3_10k_10k_h200_level_leaders.trace.json").read_text())
    roof = plan_roofline(trace["device"]["name"], trace["selected_runtime"], trace["stages"])
    fig = plots.stage_chart_figure(trace, roof, "overlay v3 on gpu")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    labels = [t for t in ax.texts if "us, host" in t.get_text()]
    assert len(labels) == len(trace["stages"]) == len(ax.patches) // 2       # a stage bar and a host bar each
    for artist in [*labels, *ax.patches]:
        assert not legend.overlaps(artist.get_window_extent(renderer)), artist
    plt.close(fig)
