"""Counter values outside their physical range are flagged and never feed a conclusion; a missing
metric is missing (NaN, named), never zero; a full-set capture is read with its own metric names."""
import pandas as pd
import pytest

from app.analysis.kernel_metrics import kernel_table, stage_table
from app.runtime.profiling.parsers.ncu_csv import parse_details, parse_raw
from app.kernel.plan import get_plan_class
from tests.conftest import fixture_text


def raw_table(**over):
    row = {"kernel": "k", "nvtx_stack": [("join", "bounds")], "duration_ns": 10_000.0, "dram_read_bytes": 1e6,
           "dram_write_bytes": 1e6, "dfma": 0.0, "dadd": 0.0, "dmul": 0.0, "ffma": 0.0, "fadd": 0.0, "fmul": 0.0,
           "sm_pct": 10.0, "dram_pct": 5.0, "achieved_occupancy_pct": 40.0, "l2_hit_pct": 90.0}
    row.update(over)
    return pd.DataFrame([row])


def test_plausible_values_pass_untouched():
    k = kernel_table(raw_table(), "join", ["bounds"], "NVIDIA H200").iloc[0]
    assert k["flags"] == "" and k["bottleneck"] == "latency-bound" and k["dram_bytes"] == 2e6


@pytest.mark.parametrize("over,col,raw_value,metric", [
    ({"l2_hit_pct": 233.0}, "l2_hit_pct", "233", "lts__t_sector_hit_rate.pct"),
    ({"dram_pct": 140.0}, "dram_pct", "140", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    ({"sm_pct": -3.0}, "sm_pct", "-3", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    ({"achieved_occupancy_pct": 101.0}, "achieved_occupancy_pct", "101", "sm__warps_active"),
    ({"dram_read_bytes": -5e6}, "dram_bytes", "-4e+06", "dram_bytes"),
])
def test_impossible_values_are_flagged_with_raw_value_and_name(over, col, raw_value, metric):
    k = kernel_table(raw_table(**over), "join", ["bounds"], "NVIDIA H200").iloc[0]
    assert f"{col}={raw_value}" in k["flags"] and metric in k["flags"]
    assert k[col] != k[col]                                           # blanked: NaN
    if col in ("dram_pct", "sm_pct"):
        assert k["bottleneck"].startswith("n/a (") and "missing or flagged" in k["bottleneck"]
    if col == "l2_hit_pct":
        assert "locality" not in k["bottleneck"]                      # no advice from a flagged hit rate


def test_missing_counters_are_missing_not_zero():
    raw = raw_table().drop(columns=["dadd", "dmul", "dram_pct"])
    k = kernel_table(raw, "join", ["bounds"], "NVIDIA H200").iloc[0]
    assert k["fp64_flops"] != k["fp64_flops"] and k["achieved_tflops_fp64"] != k["achieved_tflops_fp64"]
    assert k["bottleneck"].startswith("n/a (dram__throughput")            # never "latency-bound" by default
    st = stage_table(kernel_table(pd.concat([raw_table(), raw_table(dram_pct=float("nan"))]), "join", ["bounds"],
                                  "NVIDIA H200"), ["bounds"]).iloc[0]
    assert st["dram_pct"] != st["dram_pct"]                               # one kernel without it: the stage too


@pytest.mark.parametrize("kernel", ["join", "overlay"])
def test_full_set_dram_and_sm_match_ncus_own_speed_of_light(kernel):
    """Each kernel's DRAM% and SM% equal the Speed Of Light section's values in the same capture."""
    raw, _ = parse_raw(fixture_text(f"ncu/{kernel}.full.raw.csv"))
    metrics, _ = parse_details(fixture_text(f"ncu/{kernel}.full.details.csv"))
    kernels = kernel_table(raw, kernel, [s.name for s in get_plan_class(kernel, "v2")().stages], "NVIDIA H200")
    sol = metrics[metrics["section"] == "GPU Speed Of Light Throughput"]
    assert len(kernels) == len(raw) > 10
    for k, kid in zip(kernels.itertuples(), raw["id"]):
        mine = sol[sol["id"].astype(float).astype(int) == int(float(kid))]
        dram = float(mine.loc[mine["metric"] == "DRAM Throughput", "value_num"].iloc[0])
        sm = float(mine.loc[mine["metric"] == "Compute (SM) Throughput", "value_num"].iloc[0])
        assert k.dram_pct == pytest.approx(dram, abs=0.01) and k.sm_pct == pytest.approx(sm, abs=0.01)
        assert not k.bottleneck.startswith("n/a")          # every figure was measured: a class is given


def test_full_set_alone_reads_dram_from_speed_of_light():
    """A full-set capture without annotation mode's metrics (an older ncu mode, or a user's own
    --set full) still has DRAM%: from gpu__dram_throughput, the metric Speed Of Light shows."""
    raw, _ = parse_raw(fixture_text("ncu/join.full.raw.csv"))
    both = kernel_table(raw, "join", ["bounds"], "NVIDIA H200")
    alone = kernel_table(raw.drop(columns=["dram_pct"]), "join", ["bounds"], "NVIDIA H200")
    assert alone["dram_pct"].notna().all()
    assert (alone["dram_pct"] - both["dram_pct"]).abs().max() < 0.01


@pytest.mark.parametrize("dram_bytes,locality", [(100e3, False), (4e6, True)])
def test_l2_hit_rate_judged_only_with_enough_traffic(dram_bytes, locality):
    """On kernels moving little data the L2 hit rate reflects ncu's replay (the two counter modes
    disagreed by up to ~40 points there): it is kept and shown, but gives no locality class."""
    raw = raw_table(l2_hit_pct=50.0, dram_read_bytes=dram_bytes / 2, dram_write_bytes=dram_bytes / 2)
    model = {"bounds": dram_bytes / 2}              # the kernel moves twice its model's bytes either way
    k = kernel_table(raw, "join", ["bounds"], "NVIDIA H200", model_bytes=model).iloc[0]
    assert k["l2_hit_pct"] == 50.0 and bool(k["l2_judged"]) is locality
    assert k["bottleneck"].endswith("+ locality") is locality
    st = stage_table(kernel_table(raw, "join", ["bounds"], "NVIDIA H200", model_bytes=model), ["bounds"]).iloc[0]
    assert bool(st["l2_hit_pct"] == 50.0) is locality and st["bottleneck"].endswith("+ locality") is locality


@pytest.mark.parametrize("model_bytes,locality", [(None, False), (3.9e6, False), (3.2e6, False), (3.1e6, True)])
def test_low_l2_hit_rate_is_locality_only_where_a_kernel_moves_more_than_its_stages_model(model_bytes, locality):
    """A stage that moves each byte once (its cost model's bytes) misses L2 on every first touch after ncu's cache
    flush: no "+ locality" class or advice there; more than 1.25x the model's bytes is data fetched again. With no
    model there is no such evidence, and a low hit rate alone draws no class."""
    from app.analysis.kernel_metrics import opportunities

    raw = raw_table(l2_hit_pct=50.0, dram_read_bytes=2e6, dram_write_bytes=2e6)
    k = kernel_table(raw, "join", ["bounds"], "NVIDIA H200",
                     model_bytes=None if model_bytes is None else {"bounds": model_bytes})
    assert k.iloc[0]["bottleneck"].endswith("+ locality") is locality
    st = stage_table(k, ["bounds"])
    assert st.iloc[0]["bottleneck"].endswith("+ locality") is locality
    ops = [o for o in opportunities(st, 10.0) if o["name"].startswith("Improve locality")]
    assert bool(ops) is locality
    if ops:
        assert f"one kernel's dram_bytes={4e6 / model_bytes:.2f}x the stage's cost model's" in ops[0]["trigger"]


@pytest.mark.parametrize("second_bytes,locality", [(2e6, False), (4e6, True)])
def test_a_stage_whose_kernels_each_read_their_inputs_once_is_not_a_locality_problem(second_bytes, locality):
    """ncu empties the caches before each kernel: two kernels of one stage reading the same 2 MB each move 4 MB,
    1.33x a 3 MB model, with neither fetching anything twice. Only a kernel moving more than the model on its own
    (4 MB) is evidence, and the stage's class and advice rest on it."""
    from app.analysis.kernel_metrics import opportunities

    raw = pd.concat([raw_table(l2_hit_pct=50.0, dram_read_bytes=2e6, dram_write_bytes=0.0),
                     raw_table(kernel="k2", l2_hit_pct=50.0, dram_read_bytes=second_bytes, dram_write_bytes=0.0)],
                    ignore_index=True)
    k = kernel_table(raw, "join", ["bounds"], "NVIDIA H200", model_bytes={"bounds": 3e6})
    assert k["dram_vs_model"].iloc[0] > 1.25                       # the stage's ratio, as before
    assert list(k["kernel_dram_vs_model"]) == pytest.approx([2 / 3, second_bytes / 3e6])
    assert [b.endswith("+ locality") for b in k["bottleneck"]] == [False, locality]
    st = stage_table(k, ["bounds"]).iloc[0]
    assert st["kernel_dram_vs_model"] == pytest.approx(second_bytes / 3e6)
    assert st["bottleneck"].endswith("+ locality") is locality
    assert any(o["name"].startswith("Improve locality") for o in opportunities(stage_table(k, ["bounds"]), 20.0)) \
        is locality


def test_two_passes_over_the_same_data_are_not_called_a_locality_problem():
    """The committed H200 capture of join v2 (20k x 2k, annotation mode): refine's L2 hit rate is 74% and its DRAM
    bytes 0.99x its cost model's; candidate_filter moves 2.45x its model in point_candidates' count and emit passes,
    each reading the same data after ncu's flush (0.82x and 1.08x on their own): neither stage is a locality
    problem, and no locality advice is given."""
    from app.analysis.kernel_metrics import kernel_time, opportunities
    from tests.kernel.join.test_join_cost import _cpu_stages

    names = [s.name for s in get_plan_class("join", "v2")().stages]
    model = {n: c.bytes for n, c in _cpu_stages({"points": 20_000, "polygons": 2_000}).items()
             if c.kind == "dram"}
    raw, _ = parse_raw(fixture_text("ncu/join.annotation.csv"))
    k = kernel_table(raw, "join", names, "NVIDIA H200", model_bytes=model)
    st = stage_table(k, names).set_index("stage")
    assert st.loc["predicate_refine", "l2_hit_pct"] < 80 and st.loc["predicate_refine", "dram_vs_model"] < 1.05
    assert not st.loc["predicate_refine", "bottleneck"].endswith("+ locality")
    passes = k[k["kernel"] == "point_candidates"]
    assert len(passes) == 2 and passes["l2_hit_pct"].max() < 80 and passes["kernel_dram_vs_model"].max() < 1.1
    assert st.loc["candidate_filter", "dram_vs_model"] > 2
    assert not st.loc["candidate_filter", "bottleneck"].endswith("+ locality")
    assert not any(b.endswith("+ locality") for b in k["bottleneck"])
    ops = [o["name"] for o in opportunities(st.reset_index(), kernel_time(st))]
    assert not any(o.startswith("Improve locality") for o in ops)


def test_a_negative_l2_sector_count_is_flagged_and_its_hit_rate_not_used():
    """ncu 2025.3 exported L2 sector counts below zero for a few kernels of the committed full-set capture of join
    v2: each is flagged with its value and name. The kernel's L2 hit rate, a ratio of those counts, is blanked with
    its raw value kept in the flag (join_extent: -56 of 75,268 sectors), unless the counts below zero are too few to
    move it (refine: -8 of 140,094, kept, and the flag says so). Annotation mode's capture has no such columns."""
    raw, _ = parse_raw(fixture_text("ncu/join.full.raw.csv"))
    k = kernel_table(raw, "join", ["predicate_refine"], "NVIDIA H200").set_index("kernel")
    flags = k.loc["refine", "flags"]
    assert "lts__t_sectors_srcunit_tex_op_red_lookup_miss.sum=-3 outside its physical range" in flags
    assert "lts__t_sectors_srcunit_tex_aperture_device_op_red_lookup_miss.sum=-5" in flags
    assert "l2_hit_pct=70.02 kept: the counts below zero are 8 of its 140,094 L2 sectors" in flags
    assert k.loc["refine", "l2_hit_pct"] == 70.02
    flags = k.loc["join_extent", "flags"]
    assert "lts__t_sectors_srcunit_tex_op_red_lookup_hit.sum=-56 outside its physical range" in flags
    assert "(lts__t_sector_hit_rate.pct) not used" in flags
    assert k.loc["join_extent", "l2_hit_pct"] != k.loc["join_extent", "l2_hit_pct"]
    assert k.loc["point_scatter", "flags"] == "" and k.loc["point_scatter", "l2_hit_pct"] == 84.83
    ann, _ = parse_raw(fixture_text("ncu/join.annotation.csv"))
    assert not kernel_table(ann, "join", [], "NVIDIA H200")["flags"].str.contains("lts__t_sectors").any()


def test_fill_the_gpu_weighs_each_kernel_by_its_own_waves():
    """A stage's waves/SM is its largest kernel's; a long kernel of few blocks beside a full one still leaves
    the GPU's block slots unfilled for its time, and the advice says so with that kernel's weight."""
    from app.analysis.kernel_metrics import opportunities

    raw = pd.concat([raw_table(waves_per_sm=4.0, duration_ns=10_000.0),
                     raw_table(kernel="few", waves_per_sm=0.25, duration_ns=30_000.0)], ignore_index=True)
    st = stage_table(kernel_table(raw, "join", ["bounds"], "NVIDIA H200"), ["bounds"])
    assert st.iloc[0]["waves_per_sm"] == 4.0 and st.iloc[0]["underfill_us"] == pytest.approx(22.5)
    (fill,) = [o for o in opportunities(st, 40.0) if o["name"].startswith("Fill the GPU")]
    assert fill["gain_pct"] == pytest.approx(100 * 22.5 / 40) and "22.5 of its 40.0 us" in fill["trigger"]
