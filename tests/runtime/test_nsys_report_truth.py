"""nsys mode's report against the capture it came from: every figure and every piece of advice is checked here
against what the committed real captures (tests/fixtures/nsys/) hold, or, for pure arithmetic, against hand-made
timelines whose answer is known to the microsecond."""
import re
import sqlite3
import statistics

import pytest

from app.analysis.audit import answers, audit, host_time_advice
from app.analysis.timeline import Timeline, account_ranges, median_instance, summarise
from app.report.timeline_report import (backend_text, event_gap_parts, nsys_report, opportunities, own_event_us,
                                        reconciliation_section, stage_bottleneck, staging_opportunity)
from app.runtime.profiling.nsys import nsys_trace
from app.runtime.profiling.parsers.nsys_sqlite import read_sqlite
from app.runtime.profiling.worker import PROFILE_RANGE
from tests.runtime.nsys_capture import fixture, raw_ranges
from tests.runtime.test_nsys_fixtures import KERNELS, analyses

PART = re.compile(r"(?:^|; |: )([+-][\d,]+\.\d) us: ")
US = 1000


def _parts(why: str) -> list[float]:
    return [float(x.replace(",", "")) for x in PART.findall(why)]


def _report(kernel, backend="nsys", version="2025.3.1"):
    plan, both = analyses(kernel)
    analysis, worker = both[backend]
    trace = nsys_trace(plan, worker, analysis, {"backend": backend, "version": version, "command": []})
    return analysis, trace, nsys_report(trace, analysis, {"command_line": "x", "clocks": {"locked": False}}, None)


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_why_parts_add_up_to_event_minus_span_on_every_row(kernel):
    """An H200 join's bounds row read -13.3 us with parts +9.1, +32.0 and -50.6 (-9.5): the closing event record's
    issue was counted twice, once among the records around the range and once inside the GPU work past its end,
    where the estimate takes the later of the two ends, not their sum. Every row's parts now sum to its
    Event - span (each part rounded on its own), and the capture's parts (all but the unexplained one) to the
    estimate's own gap."""
    _, both = analyses(kernel)
    for backend, (analysis, _) in both.items():
        for rec in analysis["instances"]:
            gap = rec["event_open_ns"] - rec["queued_behind_earlier_ns"] + rec["event_close_ns"]
            assert gap == rec["event_estimate_ns"] - rec["span_ns"], (backend, rec["name"])     # exactly, in ns
        rows = reconciliation_section(analysis).rows
        assert [r[0] for r in rows] == [PROFILE_RANGE] + [s["name"] for s in analysis["stages"]]
        for row, s in zip(rows, [analysis["iteration"]] + analysis["stages"]):
            parts = _parts(row[-1])
            event = own_event_us(analysis, s)
            assert row[6] == f"{event - s['span_us']:+,.1f}", (backend, row)
            # each part and the total rounded on their own: at most half a step each apart
            assert parts and abs(sum(parts) - (event - s["span_us"])) <= 0.05 * len(parts) + 1e-9, (backend, row)
            told = [v for v, why in event_gap_parts(s, event) if not why.startswith("not explained")]
            assert sum(told) == pytest.approx(s["event_estimate_us"] - s["span_us"], abs=0.25), (backend, row)


def test_the_closing_record_inside_the_gpu_overrun_is_counted_once():
    """Hand-made: the range is [10, 50) us, its event records are issued at 5-8 and 52-55, its kernel runs until 60.
    The events read 8 -> 60 = 52 us: +2 before the range, +10 of GPU work past its end (the record's issue at 55 is
    inside those 10), nothing more."""
    ranges = [("stage", "d", 10 * US, 50 * US, 1)]
    api = [(5 * US, 8 * US, "cudaEventRecord", 1, 1), (12 * US, 13 * US, "cuLaunchKernel", 2, 1),
           (52 * US, 55 * US, "cudaEventRecord", 3, 1)]
    ops = [(15 * US, 60 * US, "kernel", "k", 2, 7, 0, 0, "", "")]
    (s,) = summarise(account_ranges(Timeline(ranges, api, ops), event_marks=True))
    assert s["event_estimate_us"] == 52 and s["span_us"] == 40
    assert s["event_open_us"] == 2 and s["event_close_us"] == 10 and s["event_close_by_gpu"]
    parts = event_gap_parts(s, 52.0)
    assert [v for v, _ in parts] == [2.0, 10.0] and "finished after the host left" in parts[1][1]
    # A measured event 1.3 us longer: the capture's parts stay, the rest is named unexplained, and all add up.
    parts = event_gap_parts(s, 53.3)
    assert [v for v, _ in parts] == [2.0, 10.0, 1.3] and parts[-1][1].startswith("not explained by the trace")


def test_the_iterations_event_from_trace_is_the_figure_its_why_explains():
    """The iteration's events run from the run's first event record (inside its range, before the first stage) to
    its last stage's closing record: the stage events tile the run, so the host time between stage ranges is in
    them. The row had shown the span as 'Event from trace' while its 'Why' took the time outside every stage
    range off it (an H200 join: 419.3 shown, 343.7 used, and 35.8 us left 'not explained'). Now the row's figure
    is the mark-to-mark estimate, read here from the raw export, and its parts explain it."""
    analysis, _, _ = _report("join")
    db = fixture("join.sqlite")
    it = analysis["iteration"]
    rec = next(r for r in analysis["instances"] if r["name"] == PROFILE_RANGE
               and r["instance"] == it["median_instance"])
    con = sqlite3.connect(db)
    marks = con.execute("SELECT r.start, r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                        "WHERE s.value LIKE 'cudaEventRecord%' AND r.start >= ? AND r.start < ? AND r.globalTid = ? "
                        "ORDER BY r.start", (rec["start_ns"], rec["end_ns"], rec["tid"])).fetchall()
    first, last = marks[0][1], marks[-1][1]
    (gpu_end,) = con.execute("SELECT MAX(o.end) FROM (SELECT correlationId, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION "
                             "ALL SELECT correlationId, end FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT "
                             "correlationId, end FROM CUPTI_ACTIVITY_KIND_MEMSET) o JOIN CUPTI_ACTIVITY_KIND_RUNTIME "
                             "r ON r.correlationId = o.correlationId WHERE r.start >= ? AND r.start < ? AND "
                             "r.globalTid = ?", (rec["start_ns"], last, rec["tid"])).fetchone()
    (stage_starts,) = zip(*[(b,) for n in [s["name"] for s in analysis["stages"]] for b, _, _ in raw_ranges(db, n)
                            if rec["start_ns"] <= b < rec["end_ns"]])
    assert first < min(stage_starts)                        # the run's first record precedes its first stage
    assert rec["event_estimate_ns"] == max(last, gpu_end) - first
    row = reconciliation_section(analysis).rows[0]
    assert row[5] == f"{rec['event_estimate_ns'] / 1e3:,.1f}" and row[5] != row[3]
    assert "outside every stage" not in row[-1]
    event = own_event_us(analysis, it)
    residual = [v for v, why in event_gap_parts(it, event) if why.startswith("not explained")]
    assert abs(sum(residual)) < 0.02 * event        # the capture explains the iteration's events (had: 55.3 us)


def test_the_iterations_parts_say_where_its_timing_starts_and_ends():
    """Hand-made iteration [0, 100) us: its first record at 4-5, a stage's kernel to 60, its last record at 70-72,
    then the host's end-of-run work to 100: the events read 5 -> 72 = 67 us, -5 before the first record and -28
    after the last."""
    ranges = [("it", "d", 0, 100 * US, 1), ("s", "d", 10 * US, 65 * US, 1)]
    api = [(4 * US, 5 * US, "cudaEventRecord", 1, 1), (12 * US, 13 * US, "cuLaunchKernel", 2, 1),
           (70 * US, 72 * US, "cudaEventRecord", 3, 1)]
    ops = [(20 * US, 60 * US, "kernel", "k", 2, 7, 0, 0, "", "")]
    summ = {s["name"]: s for s in summarise(account_ranges(Timeline(ranges, api, ops), event_marks=True))}
    it = summ["it"]
    assert it["event_estimate_us"] == 67 and it["event_open_us"] == -5 and it["event_close_us"] == -28
    parts = event_gap_parts(it, 67.0)
    assert [v for v, _ in parts] == [-5.0, -28.0] and sum(v for v, _ in parts) == 67 - 100
    assert summ["s"]["event_estimate_us"] == 72 - 5             # the stage: its own records, just outside it


@pytest.mark.parametrize("kernel", KERNELS)
def test_host_time_advice_names_only_what_the_capture_shows(kernel):
    """An H200 overlay's segment_extraction (one kernel, no synchronisation, most of its idle before its first op)
    was told to 'issue the stage's work without host round trips; fuse or graph-capture its launches'. Each stage's
    advice now names round trips only where the stage synchronised, fusing only where it launched more than once,
    and pinned memory only where a copy read pageable memory."""
    _, both = analyses(kernel)
    for backend, (analysis, _) in both.items():
        recs = {}
        for r in analysis["instances"]:
            recs.setdefault(r["name"], []).append(r)
        found = [f for f in analysis["findings"] if f["rule"] == "span dominated by host time"]
        assert found, backend
        for f in found:
            rep = median_instance(recs[f["stage"]])
            if not rep["syncs"]:
                assert "round trip" not in f["advice"], (backend, f)
            if rep["ops"] <= 1:
                assert "fuse" not in f["advice"], (backend, f)
            if not rep["copies"].get("HtoD", {}).get("pageable"):
                assert "pinned memory (" not in f["advice"] and "keep those host arrays" not in f["advice"]
    # The audited H200 stage, as its accounting read (us): one kernel, no sync.
    said = host_time_advice({"before_first_op": 23.1, "launch_gap": 0.0, "sync_wait": 0.0, "launch_latency": 11.5,
                             "after_last_op": 0.0, "no_gpu_work": 0.0}, 1, 0, {}, False)
    assert said.startswith("23.1 us of host work before its first GPU op")
    assert "round trip" not in said and "fuse" not in said
    assert "its one GPU op kept the GPU idle 11.5 us from that call's return to its start (launch latency)" in said
    # A stage that did synchronise, with several launches, is told both.
    said = host_time_advice({"sync_wait": 48.3, "launch_gap": 37.0, "launch_latency": 42.0}, 7, 1, {}, False)
    assert said.startswith("across its 7 GPU ops, 37.0 us of host gaps between them, 42.0 us of launch latency "
                           "after those calls returned: fuse them") and "48.3 us of GPU idle around its 1 host round " \
                                                                        "trip(s)" in said


def test_copies_from_pinned_memory_are_not_told_to_use_pinned_memory():
    """An H200 join's build: every host->device copy read pinned memory (srcKind 1), one record per call, with no
    host gap between the copies; the GPU waited 93.9 us before the first while the host copied the inputs into
    pinned staging buffers. The report had called it 'Host-staging-bound (copies wait for the host)', blamed
    'host-side staging between copies' and advised pinned memory 'so each copy is one DMA'. The committed join
    capture's build copies from pinned memory too: the report says so, and advises pinned memory only where a copy
    read pageable memory."""
    analysis, trace, report = _report("join")
    build = analysis["stages"][0]
    htod = build["copies"]["HtoD"]
    con = sqlite3.connect(fixture("join.sqlite"))
    kinds = dict(con.execute("SELECT id, name FROM ENUM_CUDA_MEM_KIND"))
    (start, end, tid), *_ = raw_ranges(fixture("join.sqlite"), build["name"])
    src = [kinds[k] for (k,) in con.execute(
        "SELECT m.srcKind FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = "
        "m.correlationId JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind WHERE r.start >= ? AND r.start < ? AND "
        "r.globalTid = ? AND o.name = 'CUDA_MEMCPY_KIND_HTOD'", (start, end, tid))]
    assert src and all("PINNED" in k for k in src) and htod["pageable"] == 0 and htod["calls"] == htod["count"]
    for text in ("Host-staging-bound", "host-side staging", "so each copy is one DMA",
                 "keep the host arrays in pinned"):
        assert text not in report, text
    assert stage_bottleneck(build).startswith("Host-bound around its copies (")
    (f,) = [f for f in analysis["findings"]
            if f["stage"] == build["name"] and f["rule"] == "span dominated by host time"]
    assert f"its {htod['count']} host->device copies already read pinned memory, one DMA per call" in f["advice"]
    assert f"(the stage's staging: {trace['stages'][0]['metadata']['staging']})" in f["advice"]
    assert "already read pinned memory" in report.split("## Top 3 Opportunities")[1].split("\n## ")[0]
    # With no gap between the copies (the H200 build), none is named; a pageable copy is told to pin.
    quiet = dict(build, idle_us=dict(build["idle_us"], launch_gap=0.0))
    assert "back to back" not in staging_opportunity(quiet)
    assert f"the host makes no CUDA call for the first {build['quiet_start_us']:,.1f} us of that iteration's stage" \
        in staging_opportunity(quiet)
    # Each figure for what it is: the host's time before its first call, and when the first copy started.
    assert stage_bottleneck(dict(quiet, idle_us=dict(quiet["idle_us"], before_first_op=500.0))).startswith(
        f"Host-bound around its copies (the host made no CUDA call for the first {build['quiet_start_us']:,.1f} us; "
        f"the first copy started after {build['first_op_us']:,.1f} us)")
    paged = dict(build, copies={"HtoD": dict(htod, pageable=2)})
    assert staging_opportunity(paged).startswith(f"Keep the host arrays in pinned memory (2 of {htod['count']} ")
    assert "keep those host arrays in pinned memory" in host_time_advice(
        build["idle_us"], build["ops"], 0, paged["copies"], True)


def test_the_version_is_the_one_the_capture_records():
    """`nsys --version` of the nsys bundled with Nsight Compute printed 2025.3.1.0 while the capture's exporter
    recorded 2025.3.2.0 (META_DATA_EXPORT): the report gives the capture's, and where they differ both, named."""
    db = fixture("join.sqlite")
    (recorded,) = sqlite3.connect(db).execute(
        "SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_PRODUCT_VERSION'").fetchone()
    assert read_sqlite(str(db)).meta["nsys_version"] == recorded == "2025.3.2.0"
    _, trace, report = _report("join", version="2025.3.1.0")
    both = "nsys 2025.3.2.0 (as the capture records it; `nsys --version` printed 2025.3.1.0)"
    assert f"traced with {both}:" in report and f"| {both} | 3 |" in report and f"| tool | {both} |" in report
    _, _, same = _report("join", version=recorded)
    assert "traced with nsys 2025.3.2.0:" in same and "--version" not in same
    assert backend_text({"backend": "nsys", "version": "2025.3.1.0"}, {}) == "nsys 2025.3.1.0"
    assert backend_text({"backend": "cupti", "version": "13.4.0"}, {"nsys_version": recorded}) == "cupti 13.4.0"


def test_the_relative_stdev_is_over_the_median_of_the_spans():
    """For an even count the row is the lower middle instance (20 us of 10, 20, 30, 100); the spread's relative
    stdev divides by the median of the spans (25), as its column's median does."""
    ranges = [("r", "d", i * 1000 * US, (i * 1000 + d) * US, 1) for i, d in enumerate((10, 20, 30, 100))]
    (s,) = summarise(account_ranges(Timeline(ranges, [], [])))
    assert s["span_us"] == 20 and s["span_spread"]["median_us"] == 25
    assert s["span_spread"]["rel_stdev"] == pytest.approx(statistics.stdev([10, 20, 30, 100]) / 25)


def test_audit_of_a_foreign_capture_still_runs():
    """The timeline command's audit (no plan, no staging account) gives the same capture-only advice."""
    db = fixture("overlay.sqlite")
    findings = audit(account_ranges(read_sqlite(str(db)), domain="overlay"))
    assert any(f["rule"] == "span dominated by host time" for f in findings)
    assert all("fuse or graph-capture its launches" not in f["advice"] for f in findings)


def test_the_results_read_is_no_round_trip_to_remove():
    """The default join on an H200: its only host read is output_sort's read of the result's length, yet 'remove
    the round trips' was advised at 13% from the iteration's 54.5 us, of which 33.6 came after output_sort closed
    (the profiler's end of the run). The committed join capture also reads sizes mid-plan: the opportunity counts
    those stages' figures alone, and where the stage handing back the result holds every read, it is not given."""
    analysis, trace, md = _report("join")
    stages = {s["name"]: s for s in analysis["stages"]}
    assert analysis["terminal"] == ["output_sort"] and stages["output_sort"]["syncs"] == 1
    # the stages of the iteration the tables show, beside that iteration's own figure
    mid = sum(s["idle_us"]["sync_wait"] for s in analysis["iteration_stages"]
              if s["name"] != "output_sort" and s["syncs"])
    whole = analysis["iteration"]["idle_us"]["sync_wait"]
    assert 0 < mid < whole
    line = next(x for x in opportunities(trace, analysis) if "round trips" in x)
    assert (f"trigger: sync_wait={mid:,.1f}us per iteration in the stages before the result's ({whole:,.1f}us in the "
            "whole iteration's row)") in line
    audit_row = next(x for x in md.splitlines() if x.startswith("| HIGH | span dominated by host time | output_sort |"))
    assert "while the host sat in its read of the result's size, which the plan needs" in audit_row
    # Its host work after the read returned is its own, after its last op, not a wait on the read.
    out = stages["output_sort"]["idle_us"]
    assert out["after_last_op"] > out["sync_wait"] > 0
    analysis["terminal"] = sorted(stages)                  # every read the result's: nothing to remove
    assert not any("Remove the synchronization round trips" in x for x in opportunities(trace, analysis))
    # Nor does the audit's smallest change name it, even where the round trips are the iteration's largest cause.
    it = dict(analysis["iteration"], idle_in_stages_us=dict(analysis["iteration"]["idle_in_stages_us"], sync_wait=1e6))
    q2 = answers(it, analysis["stages"], analysis["findings"], None, {"output_sort"})[1]
    assert q2.startswith("Remove the mid-plan host reads") and "largest in the median iteration in candidate_filter" \
        in q2
    q2 = answers(it, analysis["stages"], analysis["findings"], None, set(stages))[1]
    assert "host reads" not in q2


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_event_column_comes_with_each_iterations_figure(kernel):
    """The report's Event column is the median of the worker's CUDA-event times over the traced iterations: the
    trace keeps each one, so the figure can be worked out again (an audit could not)."""
    analysis, trace, _ = _report(kernel)
    for s in trace["stages"]:
        assert len(s["event_samples"]) == analysis["iteration"]["instances"]
        assert statistics.median(s["event_samples"]) == pytest.approx(s["event_seconds"], rel=1e-12)
    tm = trace["timing"]
    assert statistics.median(tm["event_total_samples"]) == pytest.approx(tm["event_total_seconds"], rel=1e-12)
