"""The report's table of stage times without the other marks, from a real H100 trace: what the other marks add
to a stage is called resolved only where its interval is above zero, the rule the advice reads it by."""
import json
from pathlib import Path

from app.analysis import advice
from app.report.event_report import _one_mark_section

TRACE = Path(__file__).parents[1] / "data" / "event" / "join_v4_100k_10k_h100_host_pace_again.trace.json"


def test_what_the_other_marks_add_says_not_resolved_where_its_interval_reaches_zero():
    trace = json.loads(TRACE.read_text())
    section = _one_mark_section(trace)
    rows = {r[0]: r for r in section.rows}
    stages = trace["timing"]["one_mark"]["stages"]
    # the capture holds both kinds: build and filter reach zero, the others do not
    assert {s["name"] for s in stages if s["marks_add_ci95"][0] <= 0} == {"owned_buffer_build", "candidate_filter"}
    for s in stages:
        assert rows[s["name"]][4].endswith(", not resolved") == (s["marks_add_ci95"][0] <= 0), rows[s["name"]]


def test_what_the_other_marks_add_wholly_below_zero_is_said_so():
    """A real H200 overlay trace whose refine read 23.3 us faster with every stage marked, its interval wholly below
    zero: not an interval that reaches zero, and not a cost the advice may leave out of a gain."""
    trace = json.loads((TRACE.parent / "overlay_v3_10k_10k_h200_marks_below_zero.trace.json").read_text())
    stages = {s["name"]: s for s in trace["timing"]["one_mark"]["stages"]}
    assert stages["exact_intersection_refine"]["marks_add_ci95"][1] < 0
    rows = {r[0]: r for r in _one_mark_section(trace).rows}
    for name, s in stages.items():
        lo, hi = s["marks_add_ci95"]
        assert rows[name][4].endswith(", below zero (marks only add work): not resolved") == (hi < 0), rows[name]
        assert rows[name][4].endswith("not resolved") == (lo <= 0), rows[name]
    assert "exact_intersection_refine" not in advice._marks_added(trace)


def test_too_few_rounds_for_an_interval_is_not_resolved():
    trace = json.loads(TRACE.read_text())
    for s in trace["timing"]["one_mark"]["stages"]:
        s["marks_add_ci95"] = [float("nan"), float("nan")]
    rows = _one_mark_section(trace).rows[:-1]
    assert rows and all(r[4].endswith(", not resolved") and "n/a" in r[4] for r in rows)


def test_graph_replay_row_gives_both_intervals_and_says_when_they_overlap():
    """On a real H200 trace the replay and eager medians are shown with their 95% intervals; a replay whose
    interval overlaps the eager one, or pairs too few for one, is said not resolved."""
    from app.report.event_report import _hygiene_rows
    from app.runtime.graph import GRAPH_MAX_PAIRS
    from app.runtime.timing import OVERHEAD_MAX_PAIRS

    assert GRAPH_MAX_PAIRS == OVERHEAD_MAX_PAIRS
    trace = json.loads((TRACE.parent / "join_v3_100k_10k_h200.trace.json").read_text())
    timing = trace["timing"]
    replay = timing["graph"]["replay"]

    def row():
        return dict(_hygiene_rows(timing))["graph replay vs eager, after the build (us)"]

    g, e = replay["graph_ci95"], replay["eager_ci95"]
    assert g[1] < e[0]                                        # this capture's replay is clearly faster
    text = row()
    assert text.count("[95% interval ") == 2 and "not resolved" not in text
    replay["graph_ci95"] = [g[0], e[0] + 1e-6]                # overlapping intervals
    assert ", not resolved: the two 95% intervals overlap" in row()
    replay["graph_ci95"] = replay["eager_ci95"] = [float("nan")] * 2
    assert "not resolved: " in row() and "[95% interval" not in row()


def test_a_time_interval_reaching_below_zero_is_said_to_be_noise():
    """The default overlay on an H200: refine's time with one mark a run, 6.3 us, has the interval -6.3 to 25.9 us;
    no stage takes less than no time, so the row says its low end is the runs' noise. The other rows' lie above."""
    trace = json.loads((TRACE.parent / "overlay_v3_10k_10k_h200_level_leaders.trace.json").read_text())
    rows = {r[0]: r for r in _one_mark_section(trace).rows}
    assert rows["exact_intersection_refine"][3] == "-6.3 – 25.9 (below zero at its low end: the runs' noise)"
    assert rows["exact_intersection_refine"][2] == "not resolved (6.3)"
    for s in trace["timing"]["one_mark"]["stages"]:
        assert rows[s["name"]][3].endswith("noise)") == (s["ci95"][0] < 0)


def test_stage_figures_that_add_up_past_the_whole_plans_are_said_so():
    """The default join on an H200: what the other marks add to bounds, morton_sort and output_sort (4.3, 5.1 and
    8.9 us, each resolved) adds up to 18.3 us, past the whole plan's paired 8.0 us (3.8 to 13.0). The note says so;
    a trace whose figures fit says nothing."""
    trace = json.loads((TRACE.parent / "join_v5_100k_10k_h200_marks_add.trace.json").read_text())
    note = _one_mark_section(trace).note
    assert ("The stages' resolved figures add up to 18.3 us, more than the whole plan's 8.0 us (95% interval up to "
            "13.0)") in note
    assert "add up to" not in _one_mark_section(json.loads(TRACE.read_text())).note.split("cost.")[-1]
