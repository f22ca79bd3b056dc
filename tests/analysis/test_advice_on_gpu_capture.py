"""Analyses and the report on real event-mode traces captured on the lent H200 (tests/data/event/)."""
import json
from pathlib import Path

import pytest

from app.analysis import advice
from app.analysis.roofline import plan_roofline
from app.report.event_report import build_report

DATA = Path(__file__).resolve().parents[1] / "data" / "event"


@pytest.fixture(scope="module")
def big():
    return json.loads((DATA / "join_v1_1M_100k_h200.trace.json").read_text())


def test_roofline_recomputed_from_capture(big):
    roof = plan_roofline(big["device"]["name"], big["selected_runtime"], big["stages"])
    assert roof["available"] and roof["device_model"] == "H200"
    assert roof["ridge_flop_per_byte"] == pytest.approx(34.0e12 / 4800e9)
    refine = next(s for s in big["stages"] if s["name"] == "predicate_refine")
    point = roof["stages"]["predicate_refine"]
    assert point["achieved_gbps"] == pytest.approx(refine["cost"]["bytes"] / refine["elapsed_seconds"] / 1e9)
    assert "owned_buffer_build" not in roof["stages"]          # host link, not on the DRAM roofline


def test_transfer_dominated_plan_is_called_transfer_bound(big):
    roof = plan_roofline(big["device"]["name"], big["selected_runtime"], big["stages"])
    findings = advice.stage_findings(big, roof)
    line, cause = advice.overall(big, findings, roof)
    assert line == "Transfer-bound (host->device copy)"
    assert cause.startswith("owned_buffer_build copies 49.7 MB at 5.5 GB/s") and "latency-bound" in cause   # h2d_bytes, the bytes its rate is of
    ops = advice.opportunities(big, roof, findings)
    assert ops[0]["trigger"].startswith("h2d_share=90%, h2d_gbps=5.")
    assert all(o["gain_pct"] is None or o["gain_pct"] >= 0 for o in ops)
    assert [o["gain_pct"] for o in ops] == sorted((o["gain_pct"] for o in ops), key=lambda g: -(g or 0))


def test_report_renders_contract_from_capture(big):
    params = {"command_line": "python -m app.kernel join --device gpu --points 1000000 --polygons 100000",
              "clocks": {"locked": False, "detail": "not locked"}}
    roof = plan_roofline(big["device"]["name"], big["selected_runtime"], big["stages"])
    md = build_report(big, params, roof, baseline=big)
    assert "**Bottleneck:** Transfer-bound (host->device copy)" in md
    assert "| total (us) | 9,926.8 | 9,926.8 | +0.0% |" in md
    assert md.count("\n1. ") == 1 and "\n3. " in md


def _overlap_bound(trace) -> str:
    """What overlapping the build's copies with the stages after it could hide at most, from the capture: the
    stages after the build as the runs give them (the median of each run's rest), not their medians added up."""
    build, *after = trace["stages"]
    rest = (trace["timing"].get("after_build") or {}).get("median") or sum(s["elapsed_seconds"] for s in after)
    hidden = min(build["elapsed_seconds"], rest)
    return f"can hide at most {100 * hidden / trace['total_elapsed_seconds']:.0f}%"


def test_a_build_already_staged_through_pinned_memory_is_not_told_to_stage(big):
    """Captured after the build moved to pinned staging: still transfer-bound, but 'copy from pinned memory'
    would be advice it already follows. Overlapping its copies with compute is given its real bound (what the
    stages after the build take), not the build's whole share."""
    staged = json.loads((DATA / "join_v1_1M_100k_h200_pinned.trace.json").read_text())
    assert staged["stages"][0]["metadata"]["staging"].startswith("pinned")
    assert "staging_dma" not in staged["timing"]          # captured before the DMA alone was measured
    for trace, expected in ((staged, "Keep inputs device-resident across calls (saves the whole build); "
                                     "overlapping the copies with the "
                                     f"stages after them {_overlap_bound(staged)}"),
                            (big, "Keep inputs device-resident across calls, or copy from pinned memory")):
        roof = plan_roofline(trace["device"]["name"], trace["selected_runtime"], trace["stages"])
        findings = advice.stage_findings(trace, roof)
        assert advice.overall(trace, findings, roof)[0] == "Transfer-bound (host->device copy)"
        top = advice.opportunities(trace, roof, findings)[0]
        assert top["name"].startswith(expected) and top["name"].endswith("(owned_buffer_build)")


def test_a_plan_whose_only_read_cuts_the_result_is_not_told_to_remove_round_trips(big):
    """join v3 captured with --graph: its one size read comes after output_sort's last launch, so no stage is
    called a host round trip, the stages after the build are capturable, and the transfers table says which
    read that was. An older capture without the counter shows it as not recorded, never as zero."""
    from app.report.sections import transfers_section
    from app.runtime.recorder import RunRecord
    from app.runtime.timing import graph_capturability

    v3 = json.loads((DATA / "join_v3_100k_10k_h200.trace.json").read_text())
    assert v3["metadata"]["verification"]["matches"] is True
    reads = {s["name"]: (s["metadata"]["allocation_size_reads"], s["metadata"]["result_size_reads"])
             for s in v3["stages"]}
    assert reads == dict.fromkeys(reads, (0, 0)) | {"output_sort": (1, 1)}
    graph = v3["timing"]["graph"]
    assert graph["after_build"] is True and graph["replay"]["replayed"] is True
    assert graph["replay"]["size_reads_replayed"] == 1
    # The judgment is the capture's own: recomputed from its stage counters it is the same.
    stages = [{"name": s["name"], "counters": s["metadata"], "meta": s["metadata"]} for s in v3["stages"]]
    judged = graph_capturability(RunRecord(stages, 1.0, 1.0), "gpu")
    # The capture's own judgment, but for its wording of the inputs a graph serves (narrowed since it was made).
    assert {k: v for k, v in judged.items() if k != "why"} == {k: v for k, v in graph.items()
                                                               if k not in ("replay", "why")}
    assert "It serves new data with the same counts" in judged["why"]
    roof = plan_roofline(v3["device"]["name"], v3["selected_runtime"], v3["stages"])
    findings = advice.stage_findings(v3, roof)
    assert not any("host sync" in f["key_issue"] for f in findings)
    ops = advice.opportunities(v3, roof, findings)
    assert not any(o["name"].startswith("Remove host round-trips") for o in ops)
    # Its 5 MB build went pageable on purpose (pinned staging measured slower there): not told to pin.
    assert v3["stages"][0]["metadata"]["staging"].startswith("pageable")
    assert ops[0]["name"] == ("Keep inputs device-resident across calls (pinned staging measured slower at this "
                              "size) (owned_buffer_build)")
    table = {r[0]: r[-2:] for r in transfers_section(v3).rows}
    assert table["output_sort"] == ["1", "1"] and table["candidate_filter"] == ["0", "0"]
    old = json.loads((DATA / "join_v1_1M_100k_h200_pinned.trace.json").read_text())
    assert {r[-1] for r in transfers_section(old).rows} == {"result_size_reads not recorded"}


def test_the_report_says_why_the_overhead_pairs_stopped():
    v3 = json.loads((DATA / "join_v3_100k_10k_h200.trace.json").read_text())
    params = {"command_line": "python -m app.kernel join v3 --graph", "clocks": {"locked": False, "detail": "no"}}
    roof = plan_roofline(v3["device"]["name"], v3["selected_runtime"], v3["stages"])
    assert "stopped" not in v3["timing"]["instrumentation"]           # captured before the rule: nothing said
    row = next(line for line in build_report(v3, params, roof, None).splitlines() if "instrumentation overhead" in line)
    assert "interleaved pairs)" in row and "stopped" not in row and "for each of" not in row   # nor a mark's cost
    v3["timing"]["instrumentation"] |= {"extra_marks": 5, "per_mark_seconds": 3.1e-6, "per_mark_ci95": [-1e-6, 6.2e-6]}
    assert ("; 3.1 us a mark (95% interval -1.0 to 6.2 us, not resolved) for the 5 marks the bare plan does not "
            "record ("
            in build_report(v3, params, roof, None))
    for stop, text in (("interval", "stopped once the interval was within +-0.5%"),
                       ("budget", "stopped by the time budget, short of the +-0.5% interval aimed at"),
                       ("max_pairs", "stopped at the most pairs allowed, short of the +-0.5% interval")):
        v3["timing"]["instrumentation"] |= {"stopped": stop, "target_ci": 0.005}
        assert text in build_report(v3, params, roof, None)


def test_overlay_v3_capture_keeps_its_room_and_names_its_remaining_round_trips():
    """overlay v3 at 100k x 100k: the candidates fit the room kept from run to run (no regrowth), the random
    layers need no end marks, the walk ran about one midpoint test a cut ring instead of one a piece, and
    the report names the reads that still keep the plan out of a graph."""
    from app.runtime.recorder import RunRecord
    from app.runtime.timing import graph_capturability

    v3 = json.loads((DATA / "overlay_v3_100k_100k_h200.trace.json").read_text())
    assert v3["version"] == "v3" and v3["metadata"]["verification"]["matches"] is True
    st = {s["name"]: s["metadata"] for s in v3["stages"]}
    filt, refine, area = st["segment_mbr_filter"], st["exact_intersection_refine"], st["area_reconstruction"]
    assert filt["candidates"] <= filt["candidate_room"] and "candidate_room_grown" not in filt
    assert filt["allocation_size_reads"] == 2                       # polygon pairs, then the room check
    assert refine["end_marks"] == 0 and refine["split_events"] == 2 * refine["proper"]
    assert area["pip_tests"] < area["cut_rings"] + 2 * filt["polygon_pairs"] < area["fragments"]
    stages = [{"name": s["name"], "counters": s["metadata"], "meta": s["metadata"]} for s in v3["stages"]]
    graph = graph_capturability(RunRecord(stages, 1.0, 1.0), "gpu")
    assert graph == {k: v for k, v in v3["timing"]["graph"].items() if k != "replay"}
    assert graph["after_build"] is False and graph["blockers"][1:] == [
        "segment_extraction: 1 allocation-size read(s)", "segment_mbr_filter: 2 allocation-size read(s)",
        "area_reconstruction: 1 allocation-size read(s)"]
    roof = plan_roofline(v3["device"]["name"], v3["selected_runtime"], v3["stages"])
    ops = advice.opportunities(v3, roof, advice.stage_findings(v3, roof))
    assert ops[0]["name"] == ("Keep inputs device-resident across calls (saves the whole build); overlapping the "
                              "copies with the stages "
                              f"after them {_overlap_bound(v3)} (owned_buffer_build)")
    assert any(o["name"].startswith("Remove host round-trips in segment_mbr_filter") for o in ops)


def test_overlay_v3_with_rooms_reads_only_its_result_and_replays_as_a_graph_for_new_inputs():
    """overlay v3 at 100k x 100k once it read no size before its result (2026-11-27): every count fitted the rooms
    kept from the earlier runs, the only read is the result's length after the last launch, the stages after the
    build capture as one graph that serves new data of the same counts, and no advice asks to remove round trips."""
    from app.runtime.recorder import RunRecord, mid_plan_reads
    from app.runtime.timing import graph_capturability

    v3 = json.loads((DATA / "overlay_v3_100k_100k_h200_rooms.trace.json").read_text())
    assert v3["version"] == "v3" and v3["metadata"]["verification"]["matches"] is True
    st = {s["name"]: s["metadata"] for s in v3["stages"]}
    assert [mid_plan_reads(m) for m in st.values()] == [0] * 6
    filt, area = st["segment_mbr_filter"], st["area_reconstruction"]
    assert area["result_size_reads"] == area["allocation_size_reads"] == 1 and "room_grown" not in area
    assert filt["polygon_pairs"] <= filt["pair_room"] and filt["candidates"] <= filt["candidate_room"]
    stages = [{"name": s["name"], "counters": s["metadata"], "meta": s["metadata"]} for s in v3["stages"]]
    graph = graph_capturability(RunRecord(stages, 1.0, 1.0), "gpu")
    # The capture's own judgment, but for its wording of the inputs a graph serves (narrowed since it was made).
    assert {k: v for k, v in graph.items() if k != "why"} == {k: v for k, v in v3["timing"]["graph"].items()
                                                              if k not in ("replay", "why")}
    assert "It serves new data with the same counts" in graph["why"] and "fit the rooms" in graph["why"]
    assert graph["after_build"] is True and graph["blockers"] == [
        "owned_buffer_build: 6 copies of host arrays (host work: the arrays are copied into pinned staging buffers "
        "first)"]
    replay = v3["timing"]["graph"]["replay"]
    assert replay["replayed"] is True and replay["size_reads_replayed"] == replay["result_reads_in_replay"] == 1
    roof = plan_roofline(v3["device"]["name"], v3["selected_runtime"], v3["stages"])
    ops = advice.opportunities(v3, roof, advice.stage_findings(v3, roof))
    assert not any("round-trip" in o["name"] for o in ops)


def test_inputs_that_went_straight_from_pinned_memory_are_not_told_to_pin_or_stage():
    """A build whose arrays were DMA'd from the caller's pinned memory (the real 1M capture, its staging line
    set as the backend writes it then): the advice and the graph judgment say what was done, not 'pin'."""
    from app.runtime.recorder import RunRecord
    from app.runtime.timing import graph_capturability

    trace = json.loads((DATA / "join_v1_1M_100k_h200_pinned.trace.json").read_text())
    trace["stages"][0]["metadata"]["staging"] = ("3 of 4 arrays straight from the caller's pinned memory; pageable "
                                                 "copies (0.8 MB, under the 16 MiB from which pinned staging is faster)")
    roof = plan_roofline(trace["device"]["name"], trace["selected_runtime"], trace["stages"])
    top = advice.opportunities(trace, roof, advice.stage_findings(trace, roof))[0]
    assert top["name"] == ("Keep inputs device-resident across calls (they already go straight from pinned memory) "
                           "(owned_buffer_build)")
    stages = [{"name": s["name"], "counters": s["metadata"], "meta": s["metadata"]} for s in trace["stages"]]
    assert "from pageable host memory" in graph_capturability(RunRecord(stages, 1.0, 1.0), "gpu")["blockers"][0]
    trace["stages"][0]["metadata"]["staging"] = "4 of 4 arrays straight from the caller's pinned memory"
    stages[0]["meta"] = trace["stages"][0]["metadata"]
    assert "DMA from the caller's pinned memory" in graph_capturability(RunRecord(stages, 1.0, 1.0), "gpu")["blockers"][0]


def test_a_staged_build_is_split_into_its_dma_and_the_host_copy_from_its_own_capture():
    """join v4 at 1M x 100k with the DMA alone measured after its timed runs: the advice prices handing the
    inputs over in pinned memory at the build less that DMA, and the root cause names the host copy as the
    bound. Every figure is recomputed from the capture."""
    from app.report.markdown import us

    t = json.loads((DATA / "join_v4_1M_100k_h200_dma.trace.json").read_text())
    build, dma, total = t["stages"][0], t["timing"]["staging_dma"], t["total_elapsed_seconds"]
    assert build["metadata"]["staging"].startswith("pinned") and dma["bytes"] == build["metadata"]["h2d_bytes"]
    assert dma["gbps"] == pytest.approx(dma["bytes"] / dma["seconds"] / 1e9)
    assert 0 < dma["seconds"] < build["elapsed_seconds"]            # the build holds its DMA
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    findings = advice.stage_findings(t, roof)
    top = advice.opportunities(t, roof, findings)[0]
    assert top["gain_pct"] == pytest.approx(100 * build["elapsed_seconds"] / total)
    pinned = 100 * (build["elapsed_seconds"] - dma["seconds"]) / total
    assert top["name"] == (
        f"Keep inputs device-resident across calls (saves the whole build), or hand them over in pinned memory "
        f"(est. {pinned:.0f}%: the "
        f"DMA alone runs at {dma['gbps']:.1f} GB/s, {dma['seconds'] * 1e6:,.0f} of the build's "
        f"{build['elapsed_seconds'] * 1e6:,.0f} us; the rest is the host's own work in the build, its copy into the "
        "staging buffers among it); "
        f"overlapping the copies with the stages after them {_overlap_bound(t)} (owned_buffer_build)")
    assert top["trigger"].endswith(f", dma_alone_gbps={dma['gbps']:.1f}")
    line, cause = advice.overall(t, findings, roof)
    assert line == "Transfer-bound (host->device copy)"
    assert f"run at {dma['gbps']:.1f} GB/s, so the host's work in the build, not the DMA, is the bound." in cause
    params = {"command_line": "python -m app.kernel join v4 --points 1M --polygons 100k", "clocks": {"locked": False}}
    md = build_report(t, params, roof, None)
    assert (f"| host->device DMA alone: the build's staged bytes again, from their pinned buffers (us) | "
            f"{us(dma['seconds'])} for {dma['bytes'] / 1e6:.1f} MB ({dma['gbps']:.1f} GB/s; median of 5") in md


def test_a_dma_alone_no_faster_than_its_build_draws_no_conclusion():
    """Outside its physical range (the build contains its DMA, so the DMA alone cannot take longer): the
    figure stays in the timing table, and neither the advice nor the root cause builds on it."""
    t = json.loads((DATA / "join_v4_1M_100k_h200_dma.trace.json").read_text())
    t["timing"]["staging_dma"]["gbps"] = t["stages"][0]["metadata"]["h2d_bytes"] / t["stages"][0]["elapsed_seconds"] \
        / 1e9 / 2
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    findings = advice.stage_findings(t, roof)
    top = advice.opportunities(t, roof, findings)[0]
    assert "pinned memory" not in top["name"] and "dma_alone" not in top["trigger"]
    assert "bound" not in advice.overall(t, findings, roof)[1].split(". ")[0]


def test_the_report_says_when_the_timed_runs_were_still_changing():
    """The real join v4 capture at 1M x 100k (one warm-up run, before --warmup auto): its first ten timed runs'
    median is far above its last ten's, and the report's first line says so, from the capture's own runs."""
    from app.runtime.stats import drift

    t = json.loads((DATA / "join_v4_1M_100k_h200_dma.trace.json").read_text())
    assert "drift" not in t["timing"] and t["timing"]["warmup_runs"] == 1
    d = drift(t["timing"]["total"]["samples"])
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    params = {"command_line": "python -m app.kernel join v4 --points 1M --polygons 100k", "clocks": {"locked": False}}
    first = build_report(t, params, roof, None).splitlines()
    headline = next(line for line in first if line.startswith("`python -m app.kernel"))
    assert "**The timed runs were still changing**" in headline
    assert f"({100 * d['change']:+.1f}%; {d['runs_per_third']} runs each)" in headline
    steady = json.loads((DATA / "join_v3_100k_10k_h200.trace.json").read_text())
    roof = plan_roofline(steady["device"]["name"], steady["selected_runtime"], steady["stages"])
    md = build_report(steady, params, roof, None)
    assert "still changing" not in md and "| drift over the timed runs | no drift resolved: " in md
    # The graph comparison's eager runs are measured apart from the timed runs: both figures are shown.
    from app.report.markdown import us

    own, replay = steady["timing"]["after_build"]["median"], steady["timing"]["graph"]["replay"]
    assert (f"the profile's own timed runs gave {us(own)} us after the build, "
            f"{own / replay['graph_after_build_seconds']:,.2f}x the replay, measured apart") in md


def test_the_headline_names_unstable_stages_by_the_robust_spread_it_judged_them_on():
    """A stage is unstable when its robust spread (1.4826 x MAD / median) is over 2%: the headline lists
    exactly those stages of a real capture, under that name, not under the relative stdev."""
    t = json.loads((DATA / "overlay_v3_100k_100k_h200_rooms.trace.json").read_text())
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    params = {"command_line": "python -m app.kernel overlay v3 --left 100k --right 100k", "clocks": {"locked": False}}
    headline = next(line for line in build_report(t, params, roof, None).splitlines()
                    if line.startswith("`python -m app.kernel"))
    unstable = [s["name"] for s in t["stages"] if s["spread"]["robust_rel_spread"] > 0.02]
    assert unstable and f"Unstable stages (robust spread > 2%): {', '.join(unstable)}." in headline
    assert "rel. stdev" not in headline


def test_a_stage_whose_host_time_includes_a_wait_for_the_device_is_marked():
    """A stage that reads from the device (a size, the result's length) waits there for all the work queued
    before it: in a real join capture the last stage's host time is several times its own duration while the
    build's copies finish. Its Host cell says so; a stage that only launches is not marked."""
    t = json.loads((DATA / "join_v4_1M_100k_h200_dma.trace.json").read_text())
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    md = build_report(t, {"command_line": "python -m app.kernel join v4", "clocks": {"locked": False}}, roof, None)
    rows = {line.split("|")[1].strip(): line.split("|")[4].strip() for line in md.splitlines()
            if line.startswith("| ") and line.count("|") == 10}
    from app.report.markdown import us

    waits = [s for s in t["stages"] if s["metadata"]["syncs"]]
    launches = [s for s in t["stages"] if not s["metadata"]["syncs"]]
    assert waits and launches
    for s in waits:
        assert rows[s["name"]] == f"{us(s['host_seconds'])} (waits)"
    for s in launches:
        assert rows[s["name"]] == us(s["host_seconds"])
    last = t["stages"][-1]
    assert last in waits and last["host_seconds"] > 4 * last["elapsed_seconds"]
    assert 'where marked "waits", waiting for a read from the device' in md


def test_a_baseline_from_another_card_of_the_same_model_is_compared_with_a_note():
    """Two real overlay captures from two H200 nodes: the report compares them and says, in its vs Baseline
    section, that part of the change may be the machines'. Against itself it says nothing of the kind."""
    base = json.loads((DATA / "overlay_v3_100k_100k_h200.trace.json").read_text())
    t = json.loads((DATA / "overlay_v3_100k_100k_h200_rooms.trace.json").read_text())
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    params = {"command_line": "python -m app.kernel overlay v3 --left 100k --right 100k", "clocks": {"locked": False}}
    section = build_report(t, params, roof, base).split("## vs Baseline")[1].split("\n## ")[0]
    assert (f"Note: the two profiles ran on different cards ({base['device']['uuid']}, {t['device']['uuid']}), so "
            "on different machines") in section
    assert "ran on different cards" not in build_report(t, params, roof, t).split("## vs Baseline")[1]
    # The same baseline as an older trace, one that records no card: one machine cannot be told from two.
    older = json.loads(json.dumps(base))
    del older["device"]["uuid"]
    section = build_report(t, params, roof, older).split("## vs Baseline")[1].split("\n## ")[0]
    assert ("Note: the baseline profile does not record the card it ran on, so whether the two ran on one machine "
            "is not known") in section


def test_the_stage_times_without_the_other_marks_are_the_captures_own():
    """Captured at the default sizes: each stage's row gives the trace's figures, the whole plan's row the same
    rounds' medians and the pairs' own overhead, and the Timing section the one-mark runs' overhead."""
    t = json.loads((DATA / "join_v4_100k_10k_h200_one_mark.trace.json").read_text())
    one, ins = t["timing"]["one_mark"], t["timing"]["instrumentation"]
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    md = build_report(t, {"command_line": "python -m app.kernel join v4", "clocks": {"locked": False}}, roof, None)
    section = md.split("## Stage times without the other stages' marks")[1].split("\n## ")[0]
    assert one["rounds"] == ins["pairs"] == 283 and f"({one['rounds']} rounds)" in section
    for s in one["stages"]:
        row = next(line for line in section.splitlines() if line.startswith(f"| {s['name']} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        lo, hi = s["ci95"]
        alo, ahi = s["marks_add_ci95"]
        assert s["resolved"] and cells[1] == f"{s['marked_seconds'] * 1e6:,.1f}"
        assert cells[2] == f"{s['seconds'] * 1e6:,.1f}" and cells[3] == f"{lo * 1e6:,.1f} – {hi * 1e6:,.1f}"
        assert cells[4] == (f"{s['marks_add_seconds'] * 1e6:,.1f} ({alo * 1e6:,.1f} – {ahi * 1e6:,.1f})"
                            + ("" if alo > 0 else ", not resolved"))
    # the filter's Duration with every stage marked is 29.5 us, of which the other marks add 5.8 us
    assert "| candidate_filter | 29.5 | 20.5 | 17.2 – 23.6 | 5.8 (3.3 – 9.2) |" in section
    whole = next(line for line in section.splitlines() if line.startswith("| whole plan |"))
    assert f"{ins['instrumented_median_seconds'] * 1e6:,.1f}" in whole
    assert f"{ins['bare_median_seconds'] * 1e6:,.1f} bare" in whole
    assert one["bare_median_seconds"] == ins["bare_median_seconds"]
    assert f"{ins['overhead_fraction'] * ins['bare_median_seconds'] * 1e6:,.1f} (the instrumentation overhead" in whole
    row = next(line for line in md.splitlines() if "one stage mark a run" in line)
    assert f"{one['overhead_fraction'] * 100:.2f}% of the bare plan" in row and "283 rounds" in row
    old = json.loads((DATA / "join_v3_100k_10k_h200.trace.json").read_text())     # made before: no section
    assert "without the other stages' marks" not in build_report(old, {"command_line": "x", "clocks": {}},
                                                                  plan_roofline(old["device"]["name"], "gpu",
                                                                                old["stages"]), None)


def test_a_stage_the_other_marks_measurably_inflate_says_so_in_its_key_issue():
    """From the capture: the filter (5.8 us [3.3, 9.2] of 29.5), output_sort (8.4 [1.7, 15.7] of 67.7) and bounds
    (2.4 [0.4, 4.9] of 23.3) are named; refine's interval reaches zero and the build's share is small: not."""
    t = json.loads((DATA / "join_v4_100k_10k_h200_one_mark.trace.json").read_text())
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    issues = {f["stage"]: f["key_issue"] for f in advice.stage_findings(t, roof)}
    # The share is of the stage's time in the runs that measured it (29.5 us), not of its Duration (the timed runs).
    said = "marks add 5.8 us to its time (20% of its 29.5 us in the runs that measured them)"
    assert said in issues["candidate_filter"] and "(10% of its 23.3 us" in issues["bounds"]
    assert "add 8.4 us to its time (12% of its 67.7 us" in issues["output_sort"]
    assert not any("marks add" in issues[s] for s in ("owned_buffer_build", "morton_sort", "predicate_refine"))
    old = json.loads((DATA / "join_v3_100k_10k_h200.trace.json").read_text())      # made before: nothing said
    assert not any("marks add" in f["key_issue"]
                   for f in advice.stage_findings(old, plan_roofline(old["device"]["name"], "gpu", old["stages"])))


def test_a_gain_leaves_out_what_the_other_marks_measurably_add():
    """The profiler's marks are not the code's time: where the capture resolved what the other stages' marks add to
    a stage, its gain is figured without them and the trigger says how much was left out; where the interval of that
    figure reaches zero (predicate_refine here), nothing is left out."""
    t = json.loads((DATA / "join_v4_100k_10k_h200_one_mark.trace.json").read_text())
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    ops = {o["name"]: o for o in advice.opportunities(t, roof, advice.stage_findings(t, roof))}
    added = {o["name"]: o for o in t["timing"]["one_mark"]["stages"]}
    total = t["total_elapsed_seconds"]
    checked = set()
    for s in t["stages"]:
        op = next((o for n, o in ops.items() if n.startswith(("Fuse or enlarge the launches of " + s["name"] + " ",
                                                               "Find whether the launches or the kernels set "
                                                               + s["name"] + "'s time"))), None)
        if op is None:
            continue
        a = added[s["name"]]
        left_out = a["marks_add_seconds"] if a["marks_add_ci95"][0] > 0 else 0.0
        target = roof["stages"][s["name"]]["roofline_seconds"] / advice.ATTAINABLE
        assert op["gain_pct"] == pytest.approx(100 * (s["elapsed_seconds"] - left_out - target) / total)
        assert (f"the other marks' {left_out * 1e6:.1f} us left out" in op["trigger"]) == (left_out > 0)
        checked.add((s["name"], left_out > 0))
    assert ("candidate_filter", True) in checked and ("predicate_refine", False) in checked
    md = build_report(t, PARAMS, roof, None)
    assert "that is left out first (the marks are the profiler's, not the code's)" in md


@pytest.mark.parametrize("name,offered", [("join_v3_100k_10k_h200", True), ("overlay_v3_100k_100k_h200_rooms", True),
                                          ("overlay_v3_100k_100k_h200", False)])
def test_a_measured_graph_replay_is_an_opportunity_of_its_measured_gain(name, offered):
    """With --graph the profile times the stages after the build replayed as one CUDA graph, interleaved with eager
    runs: where the two are told apart and the graph serves new data, replaying it is advised, its gain the measured
    difference. The older overlay capture read sizes mid-plan (its graph replays taped sizes: the same data only)."""
    t = json.loads((DATA / f"{name}.trace.json").read_text())
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    graph = "Replay the stages after the build as one CUDA graph"
    ops = [o for o in advice.opportunities(t, roof, advice.stage_findings(t, roof)) if o["name"].startswith(graph)]
    assert bool(ops) == offered
    if not offered:
        assert t["timing"]["graph"]["replay"]["replayed"] and not t["timing"]["graph"]["after_build"]
        return
    (op,) = ops
    r = t["timing"]["graph"]["replay"]
    g, e = r["graph_after_build_seconds"], r["eager_after_build_seconds"]
    assert op["gain_pct"] == pytest.approx(100 * (e - g) / t["total_elapsed_seconds"])
    assert f"measured here: {g * 1e6:,.1f} against {e * 1e6:,.1f} us eager, interleaved" in op["name"]
    overlapping = json.loads(json.dumps(t))
    overlapping["timing"]["graph"]["replay"]["graph_ci95"] = [g, e]        # reaches the eager interval: not resolved
    roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
    assert not any(o["name"].startswith(graph)
                   for o in advice.opportunities(overlapping, roof, advice.stage_findings(overlapping, roof)))
    if name == "join_v3_100k_10k_h200":       # 116.2 against 367.6 us of a 1,075.4 us plan
        assert round(op["gain_pct"]) == 23
        assert "Replay the stages after the build as one CUDA graph" in build_report(t, PARAMS, roof, None)


def test_runs_that_followed_the_launch_pace_point_the_root_cause_at_a_graph_replay():
    """A default join whose 10 runs rose and fell with the host's launch pace (+0.85): the root cause says so and
    names --graph, which measures what the launches cost. Not where the runs did not follow it, nor where a graph
    replay was measured already (its opportunity says what it saves)."""
    def cause(t):
        roof = plan_roofline(t["device"]["name"], t["selected_runtime"], t["stages"])
        return advice.overall(t, advice.stage_findings(t, roof), roof)[1]

    t = json.loads((DATA / "join_v4_100k_10k_h200_launch_paced.trace.json").read_text())
    lp = t["timing"]["launch_pace"]
    assert lp["follows"] and lp["runs"] == 10
    text = cause(t)
    # output_sort's 95% interval, 38.8-80.1 us, holds bounds' 22.1-44.9 in part and no other stage's: both lead.
    assert text.endswith(f"led by output_sort and bounds (level within their 95% intervals); the runs followed the "
                         f"host's launch pace (rank correlation "
                         f"{lp['rank_correlation']:+.2f} over 10 runs), so --graph, which times the stages after the "
                         "build replayed as one CUDA graph, would show what their launches cost.")
    assert text.count(". ") == 1                    # still two sentences
    replayed = json.loads(json.dumps(t))
    replayed["timing"]["graph"] = {"after_build": True, "replay": {"replayed": True}}
    assert "--graph" not in cause(replayed)
    other = json.loads((DATA / "join_v4_100k_10k_h200_launch_pace.trace.json").read_text())
    assert other["timing"]["launch_pace"]["follows"] is False and "--graph" not in cause(other)


def _edited(name: str, stage: str, **changes) -> dict:
    """A real H200 trace with one stage's measured time or cost-model figures changed as an impossible reading
    would have them."""
    trace = json.loads((DATA / name).read_text())
    s = next(x for x in trace["stages"] if x["name"] == stage)
    for key, value in changes.items():
        (s["cost"] if key in ("bytes", "flops") else s)[key] = value
    return trace


PARAMS = {"command_line": "python -m app.kernel join", "clocks": {"locked": False, "detail": "not locked"}}


@pytest.mark.parametrize("stage,changes,flag", [
    ("predicate_refine", {"elapsed_seconds": 1e-6}, "of the 4,800 GB/s peak: the time or the cost model is wrong"),
    ("output_sort", {"bytes": -1e6}, "cannot be negative"),
    ("candidate_filter", {"elapsed_seconds": 0.0}, "is not a measurement"),
])
def test_an_impossible_roofline_figure_is_flagged_and_draws_no_conclusion(stage, changes, flag):
    """The cost model counts the least a stage must move: above the peak, or with a time that is no measurement,
    the time or the model is wrong. The stage is flagged, classed nothing, advised nothing, and the end-to-end
    point, a sum over it, is not given (it had read 611 GB/s over a zero time, and a report with every stage at
    zero had crashed)."""
    trace = _edited("join_v4_100k_10k_h200_launch_pace.trace.json", stage, **changes)
    roof = plan_roofline(trace["device"]["name"], trace["selected_runtime"], trace["stages"])
    point = roof["stages"][stage]
    assert any(flag in f for f in point["flags"]) and point["dram_pct"] is None and point["pct_of_roofline"] is None
    assert roof["end_to_end"] is None and roof["end_to_end_why"] == f"not summed: {stage} flagged"
    findings = {f["stage"]: f for f in advice.stage_findings(trace, roof)}
    assert findings[stage]["bottleneck"] == "n/a (flagged)" and flag in findings[stage]["key_issue"]
    assert not any(stage in o["name"] for o in advice.opportunities(trace, roof, list(findings.values())))
    md = build_report(trace, PARAMS, roof, None)
    assert f"No end-to-end point: not summed: {stage} flagged." in md and "flagged: " in md


def test_a_compute_bound_stage_is_told_about_its_arithmetic_and_the_compute_roof():
    """Above the ridge the compute roof applies (the report had always said memory), and a compute-bound stage's
    cause and advice are its FLOPs (it had been told to cut bytes, at DRAM 0.4%)."""
    trace = _edited("join_v4_100k_10k_h200_launch_pace.trace.json", "output_sort", flops=2.8e9)
    roof = plan_roofline(trace["device"]["name"], trace["selected_runtime"], trace["stages"])
    p = roof["stages"]["output_sort"]
    assert 60 <= p["flop_pct"] <= 100 and p["dram_pct"] < 60 and p["bound_by"] == "compute"
    findings = advice.stage_findings(trace, roof)
    assert next(f for f in findings if f["stage"] == "output_sort")["bottleneck"] == "compute-bound"
    ops = [o for o in advice.opportunities(trace, roof, findings) if "output_sort" in o["name"]]
    assert ops and ops[0]["name"].startswith("Cut the arithmetic of output_sort") and \
        ops[0]["trigger"] == f"flop_pct={p['flop_pct']:.1f}"
    md = build_report(trace, PARAMS, roof, None)
    e = roof["end_to_end"]
    assert e["arithmetic_intensity"] > roof["ridge_flop_per_byte"]
    assert "above the ridge: the compute roof is the one that applies." in md


@pytest.mark.parametrize("name", ["join_v3_100k_10k_h200", "join_v4_100k_10k_h200_launch_pace"])
def test_a_stage_timed_around_its_result_read_is_not_told_to_fuse_its_launches(name):
    """output_sort reads the result's length: the read waits for all queued work and the stage's end is marked after
    it, so its time is mostly that wait (93.6 us of 10-14 us of kernels on an H200). Its Key Issue says so, and no
    'fuse or enlarge the launches' is advised for it; the build's Key Issue gives the bytes it copied (the transfers
    table's 4,975,584), not the plan's own 5,067,616."""
    trace = json.loads((DATA / f"{name}.trace.json").read_text())
    roof = plan_roofline(trace["device"]["name"], trace["selected_runtime"], trace["stages"])
    findings = {f["stage"]: f for f in advice.stage_findings(trace, roof)}
    assert findings["output_sort"]["key_issue"].startswith("its time holds the result-length read's wait")
    assert not any("output_sort" in o["name"] for o in advice.opportunities(trace, roof, list(findings.values())))
    build = trace["stages"][0]["metadata"]
    assert (build["h2d_bytes"], build["owned_bytes"]) == (4975584, 5067616)
    assert findings["owned_buffer_build"]["key_issue"] == "5.0 MB host->device"


def test_a_build_that_is_the_plans_largest_stage_is_the_bottleneck_under_half_the_plan():
    """The default join on a slow H100 host: the build 48% of the plan, output_sort 21%. The headline names the copy,
    as the opportunities do, not 'latency-bound, led by output_sort'; the stages after it are named in the cause."""
    trace = json.loads((DATA / "join_v4_100k_10k_h100_host_pace_slow_host.trace.json").read_text())
    roof = plan_roofline(trace["device"]["name"], trace["selected_runtime"], trace["stages"])
    findings = advice.stage_findings(trace, roof)
    shares = {f["stage"]: f["share_pct"] for f in findings}
    assert 30 <= shares["owned_buffer_build"] < 50 and shares["owned_buffer_build"] == max(shares.values())
    line, cause = advice.overall(trace, findings, roof)
    assert line == "Transfer-bound (host->device copy)"
    assert f"takes {shares['owned_buffer_build']:.0f}% of the plan" in cause and "led by output_sort" in cause
    assert advice.opportunities(trace, roof, findings)[0]["name"].endswith("(owned_buffer_build)")


def test_the_roofline_table_gives_no_flop_rate_where_the_model_counts_none():
    """A real H200 event profile of overlay v3 (docs/kernels/profiles): the sorts and the filter's comparisons are
    modelled with no FLOPs, so they have no TFLOP/s to give (it read 0.0000, like a measured rate of zero); a share
    of the roofline under 0.05% keeps two significant digits instead of reading 0.0."""
    from app.report.event_report import _roofline

    trace = json.loads((Path(__file__).resolve().parents[2] / "docs/kernels/profiles/overlay-v3-10k-10k-ready-for-next-run"
                        / "trace.json").read_text())
    roof = trace["roofline"]
    section = _roofline(roof)
    rows = {r[0]: dict(zip(section.columns, r)) for r in section.rows}
    sort = rows["reconstruction_event_sort"]
    assert sort["model MFLOP"] == "0 (none modelled)" and sort["TFLOP/s"] == "- (none modelled)"
    assert sort["GB/s"] == f"{roof['stages']['reconstruction_event_sort']['achieved_gbps']:,.1f}"
    refine = rows["exact_intersection_refine"]
    assert refine["TFLOP/s"] == f"{roof['stages']['exact_intersection_refine']['achieved_tflops']:.4f}"
    area = dict(roof["stages"]["area_reconstruction"], pct_of_roofline=0.047)
    (row,) = _roofline(dict(roof, stages={"area_reconstruction": area}, end_to_end=None)).rows
    assert row[-1] == "0.047"


NO_GPU, THIS_GPU = "Profile on a GPU: ", "Profile on this machine's GPU: "


@pytest.mark.parametrize("planner,reason,name", [
    ("cpu", "no GPU: CuPy is not installed", NO_GPU + "this run used the numpy path"),
    ("gpu", "--device cpu", THIS_GPU + "this run used the numpy path"),
    ("gpu", "GPU backend failed to build: CompileException", THIS_GPU + "this run used the numpy path"),
])
def test_a_cpu_run_is_told_to_profile_on_a_gpu_whether_or_not_the_machine_has_one(tmp_path, planner, reason, name):
    """A run on the numpy path gets the opportunity to profile on a GPU, with what kept it off one: none on the
    machine, --device cpu where there is one (a CPU run on a GPU machine had no opportunity at all), or a failed
    GPU build."""
    from app.kernel.cli import main

    out = tmp_path / "out"
    assert main(["join", "--points", "2000", "--polygons", "200", "--device", "cpu", "--bench_runs", "2",
                 "--out", str(out)]) == 0
    (trace_path,) = out.glob("profiles/event/join/*/*/trace.json")
    trace = json.loads(trace_path.read_text())
    trace["metadata"].update(planner_selected_runtime=planner, selection_reason=reason)
    roof = plan_roofline(trace["device"]["name"], trace["selected_runtime"], trace["stages"])
    ops = advice.opportunities(trace, roof, advice.stage_findings(trace, roof))
    (op,) = [o for o in ops if o["name"].startswith("Profile on")]
    assert op["name"] == name and op["gain_pct"] is None
    assert op["trigger"] == f"selected_runtime=cpu, planner_selected_runtime={planner}, reason={reason!r}"
    trace["selected_runtime"] = "gpu"               # a run on the GPU is never told to profile on one
    assert not [o for o in advice.opportunities(trace, roof, []) if o["name"].startswith("Profile on")]
