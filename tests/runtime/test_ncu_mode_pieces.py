"""ncu mode's report pieces on this project's own --set full capture of join v2 (tests/fixtures/ncu)."""
import gzip
import shutil

import pytest

from app.analysis.kernel_metrics import attribute_stages, kernel_table
from app.kernel.plan import get_plan_class
from app.runtime.profiling.ncu import _flag_speedups, _hot_listing, _rule_ops, _rules_section, _verbose, hot_spots
from app.runtime.profiling.parsers.ncu_csv import parse_details, parse_raw, parse_source
from app.runtime.profiling.parsers.ncu_rep import (branch_targets, line_table, load_module, read_samples,
                                                   render_hot_lines, short_path, waited_barrier)
from tests.conftest import OWN_FIXTURES, fixture_text

STAGES = [s.name for s in get_plan_class("join", "v2")().stages]


class _Plan:
    kernel, version = "join", "v2"


@pytest.fixture(scope="module")
def capture():
    raw, _ = parse_raw(fixture_text("ncu/join.full.raw.csv"))
    metrics, rules = parse_details(fixture_text("ncu/join.full.details.csv"))
    rules = rules.assign(stage=attribute_stages(rules, "join", STAGES))
    return raw, metrics, rules


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("rep") / "join.ncu-rep"
    with gzip.open(OWN_FIXTURES / "ncu" / "join.full.ncu-rep.gz", "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def test_rule_gains_are_global_speedup_times_kernel_share(capture):
    """A global estimate is a share of its kernel's time: scaled by the kernel's share of the iteration it is a
    gain. A local one (of the unit the rule measures: HighPipeUtilization 98.6% on join_extent) gives none and
    ranks last."""
    raw, _, rules = capture
    ops = _rule_ops(rules, raw, kernel_table(raw, "join", STAGES, "NVIDIA H200"))
    gains = [o["gain_pct"] for o in ops if o["gain_pct"] is not None]
    assert ops and gains == sorted(gains, reverse=True) and ops[:len(gains)] == [o for o in ops if o["gain_pct"]
                                                                                  is not None]
    top = ops[0]
    opt = rules[(rules["rule_type"] == "OPT")].dropna(subset=["speedup_pct"])
    rule = opt[opt["speedup_type"] == "global"].sort_values("speedup_pct").iloc[-1]
    # No gain can exceed the rule's own speedup: it is scaled by the kernel's share of the iteration.
    assert 0 < top["gain_pct"] <= rule["speedup_pct"] and "est. global" in top["trigger"]
    local = [o for o in ops if "est. local" in o["trigger"]]
    assert len(local) == int((opt["speedup_type"] == "local").sum()) > 0
    assert all(o["gain_pct"] is None and o["trigger"].endswith("(of the unit the rule measures, not the kernel's "
                                                               "time)") for o in local)


def test_rule_gains_never_come_from_impossible_or_missing_readings(capture):
    """An Estimated Speedup above 100% is not a reading: flagged in the rules table, ranked nowhere. A kernel
    whose time is missing leaves every share unknown (the total they divide by is): gains None, ranked last,
    never computed over the kernels that were timed. A rule of an unstaged kernel says so, never "nan"."""
    raw, _, rules = capture
    top = rules[rules["rule_type"] == "OPT"].dropna(subset=["speedup_pct"]).index[0]
    bad = rules.copy()
    bad.loc[top, "speedup_pct"] = 450.0
    bad = _flag_speedups(bad)
    kernels = kernel_table(raw, "join", STAGES, "NVIDIA H200")
    ops = _rule_ops(bad, raw, kernels)
    assert all(o["gain_pct"] is None or o["gain_pct"] <= 100 for o in ops)
    assert "450" not in " ".join(o["trigger"] for o in ops)
    row = next(r for r in _rules_section(bad).rows if r[3] == bad.loc[top, "rule"] and r[1] == bad.loc[top, "kernel"][:30])
    assert row[4] == "Estimated Speedup=450% outside 0-100%, not used"
    untimed = raw.copy()
    untimed.loc[untimed.index[3], "duration_ns"] = float("nan")
    ops = _rule_ops(rules, untimed, kernel_table(untimed, "join", STAGES, "NVIDIA H200"))
    assert ops and all(o["gain_pct"] is None for o in ops)
    outside = raw.copy()
    outside["nvtx_stack"] = [[] for _ in range(len(outside))]
    unstaged = rules.assign(stage=attribute_stages(rules.assign(nvtx_stack=[[]] * len(rules)), "join", STAGES))
    ops = _rule_ops(unstaged, outside, kernel_table(outside, "join", STAGES, "NVIDIA H200"))
    assert ops and all(" in unstaged kernel (" in o["name"] for o in ops)
    assert all(r[0] == "-" for r in _rules_section(unstaged).rows)


def test_an_occupancy_rule_on_a_grid_under_one_wave_gets_the_tools_note(capture):
    """ncu's AchievedOccupancy rule puts the gap to the theoretical occupancy down to scheduling overheads or
    imbalance. Where the grid is under one wave the tool says beside it what caps the occupancy: join's point_cells
    runs 79 blocks on 132 SMs, one a busy SM of the 8 it could hold, a cap of 12% of the theoretical (ncu measured
    10.1% of 100%). Every cap it gives bounds the capture's own figures; a grid of a wave or more gets no note."""
    import re

    raw, _, rules = capture
    section = _rules_section(rules, raw)
    rows = {(r[1], r[3]): r[5] for r in section.rows}
    note = rows[("point_cells", "AchievedOccupancy")]
    assert note.startswith("This tool: its 79 blocks are under one wave on 132 SMs, 1.0 a busy SM of the 8 it could "
                           "hold: that caps achieved occupancy at about 12% of the theoretical")
    assert "NCU: The difference between calculated theoretical" in note
    noted = [r for r in section.rows if r[3] == "AchievedOccupancy" and r[5].startswith("This tool:")]
    assert len(noted) == 16                  # every kernel of join v2 at 20k x 2k is under one wave
    assert rows[("init_run", "AchievedOccupancy")].startswith("This tool: its 1 block is under one wave")
    names = [s.name for s in get_plan_class("overlay", "v3")().stages]
    raw3, _ = parse_raw(fixture_text("ncu/overlay_v3.full.raw.csv"))
    _, rules3 = parse_details(fixture_text("ncu/overlay_v3.full.details.csv"))
    section3 = _rules_section(rules3.assign(stage=attribute_stages(rules3, "overlay", names)), raw3)
    for r in noted + [r for r in section3.rows if r[3] == "AchievedOccupancy" and r[5].startswith("This tool:")]:
        cap = float(re.search(r"at about (\d+)% of the theoretical", r[5]).group(1))
        theory, achieved = (float(x) for x in re.search(r"theoretical \(([\d.]+)%\) and measured achieved "
                                                        r"occupancy \(([\d.]+)%\)", r[5]).groups())
        assert 100 * achieved / theory <= cap + 1, r[1]          # the cap, rounded, bounds what ncu measured
    ops = _rule_ops(rules, raw, kernel_table(raw, "join", STAGES, "NVIDIA H200"))
    op = next(o for o in ops if o["name"] == "AchievedOccupancy in morton_sort (point_cells)")
    assert "(this tool: its 79 blocks are under one wave" in op["trigger"]
    # ncu's estimate is of the whole gap from 10.1% to 100%; the grid caps it at 12.5%, so the gain counts the
    # share beyond the cap only: (12.5 - 10.1) / (100 - 10.1), about 3% of ncu's figure.
    row = raw[raw["kernel"] == "point_cells"].iloc[0]
    theory, achieved = (float(row[c]) for c in ("sm__maximum_warps_per_active_cycle_pct", "achieved_occupancy_pct"))
    beyond = (theory / 8 - achieved) / (theory - achieved)
    assert 0 < beyond < 0.05 and f"the gain counts the {100 * beyond:.0f}% of the gap beyond that cap" in op["trigger"]
    whole = next(o for o in _rule_ops(rules, raw.assign(launch__sm_count=1.0), kernel_table(
        raw, "join", STAGES, "NVIDIA H200")) if o["name"] == op["name"])       # one SM: a wave, no cap, no note
    assert "this tool" not in whole["trigger"] and op["gain_pct"] == pytest.approx(whole["gain_pct"] * beyond)
    assert all("this tool" not in r[5] for r in section.rows if r[3] != "AchievedOccupancy")
    assert all(not r[5].startswith("This tool") for r in _rules_section(rules).rows)       # no raw page, no note

    rows3 = {r[1]: r[5] for r in section3.rows if r[3] == "AchievedOccupancy"}
    assert not rows3["edge_pairs_warp"].startswith("This tool")          # 599 blocks, 1.13 waves
    assert not rows3["bucket_sort"].startswith("This tool")              # 528 blocks, one full wave
    assert rows3["area_rings_flip"].startswith("This tool: its 225 blocks")


def test_rules_table_verbose_report_and_sass_listing(capture):
    _, metrics, rules = capture
    section = _rules_section(rules)
    assert len(section.rows) == len(rules)
    verbose = _verbose(_Plan, metrics, rules)
    assert "GPU Speed Of Light Throughput" in verbose and "DRAM Frequency" in verbose
    sass = parse_source(fixture_text("ncu/join.full.source.csv"))["refine"]
    hot = _hot_listing("refine", sass)
    assert hot.startswith("# refine") and hot.count("\n| 0x") == 20


def test_ncu_report_reads_stall_samples_per_source_line(report):
    module, where = load_module(None)
    assert module is not None, where
    samples = read_samples(module, report)
    raw, _ = parse_raw(fixture_text("ncu/join.full.raw.csv"))
    assert [samples[i]["kernel"] for i in sorted(samples)] == raw["kernel"].tolist()   # same IDs as the CSV
    refine = samples[raw.index[raw["kernel"] == "refine"][0]]
    pcs = refine["samples"]
    reasons = [c for c in pcs if c.startswith("stall_")]
    # Every sample has exactly one reason (the issuing warp counts as "selected").
    assert (pcs[reasons].sum(axis=1) == pcs["samples"]).all() and pcs["samples"].sum() > 100
    lines = line_table(pcs)
    assert lines["samples"].sum() == pcs["samples"].sum()
    assert lines["share_pct"].sum() == pytest.approx(100)
    top = lines.iloc[0]
    assert short_path(top["file"]).startswith("app/kernel/") and top["line"] > 0
    assert top["reasons"][0][1] >= top["reasons"][-1][1]
    # Every kernel of join's iteration is this project's own, built with -lineinfo: each sample has its line.
    assert all(d["samples"]["line"].notna().all() and d["samples"]["file"].map(short_path).str.startswith(
        "app/kernel/").all() for d in samples.values())
    # A warp waiting at a barrier is sampled on an instruction after the BAR (up to four after it here): those samples
    # sit on the BAR itself, whose source line is the barrier's. The listing is the source page's, of the same report.
    listings = [dict(zip(x["Address"].map(lambda a: int(a, 16)), x["Source"].str.strip()))
                for x in parse_source(fixture_text("ncu/join.full.source.csv")).values()]
    on_bar = 0
    for kid, d in samples.items():
        listing = listings[kid]
        for pc, n, text in zip(d["samples"]["pc"], d["samples"]["stall_barrier"], d["samples"]["sass"]):
            assert listing[pc].split()[0] == text.split()[0]
            moved = waited_barrier(pc, listing, branch_targets(listing)) if n > 0 else None
            assert moved is None, (d["kernel"], hex(pc))
            on_bar += n if text.startswith("BAR") else 0
    assert on_bar == sum(d["samples"]["stall_barrier"].sum() for d in samples.values()) > 0
    # refine's 17 samples on a BSSY four instructions after its BAR are the BAR's line's, not the BSSY's.
    bssy = next(pc for pc, t in listings[12].items()
                if t.startswith("BSSY") and listings[12][pc - 64].startswith("BAR"))
    assert bssy not in set(refine["samples"]["pc"]) and samples[12]["kernel"] == "refine"
    bar = pcs.set_index("pc").loc[bssy - 64]
    assert bar["stall_barrier"] >= 17 and bar["sass"].startswith("BAR.SYNC") and bar["line"] > 0
    # A kernel without a line table (a library kernel; the overlay capture's cupy_copy) is still listed, by SASS.
    bare = dict(refine, samples=pcs.assign(line=float("nan"), file=None))
    text = render_hot_lines("cupy_copy", "area_reconstruction", bare)
    assert "carries no line table" in text and "(no line info)" in text and "| 0x" in text


def test_hot_spots_section_ranks_kernels_by_time(report, capture):
    raw, _, _ = capture
    kernels = kernel_table(raw, "join", STAGES, "NVIDIA H200")
    sources = parse_source(fixture_text("ncu/join.full.source.csv"))
    files, section, barrier_lines = hot_spots(str(report), None, kernels, sources)
    assert sum(n.startswith("hot/") for n in files) == len(kernels)
    # Top stall reasons are stalls: refine's hottest line has "selected (issuing)" second in its listing (a warp
    # issuing, no stall), and the table skips it for the next reason.
    rows = {r[1]: r for r in section.rows}
    assert "selected (issuing) 6%" in next(x for x in files["hot/012_refine.md"].splitlines() if x.startswith("| 1 |"))
    assert rows["refine"][5] == "long_scoreboard, wait" and not any("selected" in r[5] for r in section.rows)
    # Each kernel's barrier samples, moved onto the BARs, are on the line of its __syncthreads: refine's 51 + 17.
    line, pct = barrier_lines[12]
    assert line == "app/kernel/common.cuh:153" and pct == pytest.approx(100 * 51 / 445)
    assert "`__syncthreads();`" in next(x for x in files["hot/012_refine.md"].splitlines() if "common.cuh:159 " in x)
    assert sum(n.startswith("sass/") for n in files) == len(sources)
    times = [float(r[2].replace(",", "")) for r in section.rows]
    # join_extent (the bounds' min/max over every point and vertex) is the longest kernel of this capture.
    assert times == sorted(times, reverse=True) and section.rows[0][1] == "join_extent"
    assert section.rows[0][3].startswith("app/kernel/")


def test_unreadable_report_keeps_the_profile(tmp_path, capture):
    raw, _, _ = capture
    bad = tmp_path / "bad.ncu-rep"
    bad.write_bytes(b"not a report")
    files, section, lines = hot_spots(str(bad), None, kernel_table(raw, "join", STAGES, "NVIDIA H200"),
                               parse_source(fixture_text("ncu/join.full.source.csv")))
    assert "Source lines unavailable" in section.text and any(n.startswith("sass/") for n in files) and lines == {}


def test_flops_beside_the_cost_model_per_stage(capture):
    """The report's measured-vs-model table, FLOPs half: refine's ncu count beside the model's (the same at the
    capture's sizes), a stage the model gives none shown as such, a missing count named, the build's copies n/a."""
    from app.analysis.kernel_metrics import stage_table
    from app.report.ncu_report import _flops_row
    from tests.kernel.join.test_join_cost import _cpu_stages

    raw, _, _ = capture
    costs = _cpu_stages({"points": 20_000, "polygons": 2_000})
    st = stage_table(kernel_table(raw, "join", STAGES, "NVIDIA H200"), STAGES).set_index("stage")

    def row(name, **over):
        ncu = {"kernels": int(st.loc[name, "kernels"]), "fp64_flops": float(st.loc[name, "fp64_flops"])} | over
        c = costs[name]
        return _flops_row({"name": name, "ncu": ncu, "cost": {"flops": c.flops, "precision": c.precision,
                                                              "kind": c.kind}})

    assert row("predicate_refine") == ["0.220", "0.220", "1.00"]
    assert row("bounds")[1:] == ["0.000", "n/a (the model counts none)"] and float(row("bounds")[0]) > 0
    assert row("predicate_refine", fp64_flops=None)[0] == "n/a (fp64 instruction counts missing)"
    assert row("owned_buffer_build", kernels=0) == ["n/a (copies)", "n/a (copies)", "n/a"]


def test_the_kernel_listing_read_from_the_report_is_the_source_pages(report):
    """The barrier walk reads branch targets off the whole kernel; ncu_report gives instructions by PC only, so the
    listing is walked out from the sampled PCs. On join v2's report it is the source page's, instruction for
    instruction, with the same branch targets (ncu_report writes a label beside a target: the address stays)."""
    from app.runtime.profiling.parsers.ncu_rep import SAMPLES, _instances, kernel_listing

    ncu_report, where = load_module(None)      # Nsight Compute's extras/python, found as ncu mode finds it
    assert ncu_report is not None, where
    rng = ncu_report.load_report(str(report)).range_by_idx(0)
    pages = list(parse_source(fixture_text("ncu/join.full.source.csv")).values())
    assert rng.num_actions() == len(pages)
    for i, page in enumerate(pages):
        action = rng.action_by_idx(i)
        listing = kernel_listing(action, _instances(action.metric_by_name(SAMPLES)))
        expected = dict(zip(page["Address"].map(lambda a: int(a, 16)), page["Source"].str.strip()))
        assert set(listing) == set(expected), action.name()
        assert branch_targets(listing) == branch_targets(expected), action.name()
