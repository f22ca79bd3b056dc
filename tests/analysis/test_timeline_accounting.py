"""Wall-time accounting on hand-made timelines whose answer is known to the microsecond.

Each timeline is small enough to check on paper: overlapping streams, a host
sleep between two kernels, a synchronisation round trip, an op that runs after
its range closed, a pageable copy, a range with no GPU work.
"""
import pytest

from app.analysis.audit import answers, audit
from app.analysis.intervals import covered_at_least, gaps, measure, union
from app.analysis.timeline import CAUSES, Timeline, account_ranges, summarise

US = 1000   # the timeline is in ns; the tests are written in microseconds


def R(name, s, e, tid=1, domain="d"):
    return (name, domain, s * US, e * US, tid)


def A(s, e, name, corr, tid=1):
    return (s * US, e * US, name, corr, tid)


def K(s, e, corr, stream=7):
    return (s * US, e * US, "kernel", f"k{corr}", corr, stream, 0, 0, "", "")


def C(s, e, corr, copy, mem, nbytes=1000):
    return (s * US, e * US, "memcpy", f"memcpy {copy}", corr, 7, 0, nbytes, copy, mem)


def one(ranges, api, ops, name, **kw):
    recs = [r for r in account_ranges(Timeline(ranges, api, ops, **kw)) if r["name"] == name]
    assert len(recs) == 1
    return recs[0]


def us(rec, key):
    return rec[key] / US


def idle(rec):
    return {c: v / US for c, v in rec["idle_ns"].items() if v}


def test_interval_helpers():
    assert union([(5, 9), (1, 3), (2, 4), (9, 10), (7, 7)]) == [(1, 4), (5, 10)]
    assert measure(union([(0, 10), (5, 15)])) == 15
    assert gaps(0, 20, [(2, 4), (6, 25)]) == [(0, 2), (4, 6)]
    assert gaps(0, 10, []) == [(0, 10)]
    assert covered_at_least([(0, 10), (5, 15), (8, 9)], 2, 0, 20) == 5
    assert covered_at_least([(0, 10), (5, 15), (8, 9)], 3, 0, 20) == 1


def test_overlapping_streams_count_once():
    rec = one([R("stage", 0, 100)], [A(1, 2, "cuLaunchKernel", 1), A(2, 3, "cuLaunchKernel", 2)],
              [K(10, 60, 1, stream=7), K(30, 80, 2, stream=8)], "stage")
    assert us(rec, "busy_ns") == 70          # union of [10,60) and [30,80): never the 100 us sum
    assert us(rec, "kernel_ns") == 100       # summed kernel durations are reported apart
    assert us(rec, "concurrent_ns") == 30
    # [1, 2) the host inside the launch call, [2, 10) the launch's latency after the call returned
    assert idle(rec) == {"before_first_op": 1, "launch_call": 1, "launch_latency": 8, "after_last_op": 20}
    assert rec["accounted_ns"] == rec["span_ns"]


def test_host_sleep_between_two_kernels_is_a_launch_gap():
    rec = one([R("stage", 0, 150)], [A(1, 2, "cuLaunchKernel", 1), A(120, 121, "cuLaunchKernel", 2)],
              [K(5, 25, 1), K(125, 145, 2)], "stage")
    assert us(rec, "busy_ns") == 40
    assert idle(rec) == {"before_first_op": 1, "launch_call": 1 + 1, "launch_latency": 3 + 4, "launch_gap": 95,
                         "after_last_op": 5}
    assert rec["accounted_ns"] == rec["span_ns"]


def test_gpu_drained_during_a_sync_is_a_sync_wait():
    api = [A(1, 2, "cuLaunchKernel", 1), A(10, 42, "cudaStreamSynchronize_v3020", 9), A(70, 71, "cuLaunchKernel", 2)]
    rec = one([R("stage", 0, 95)], api, [K(5, 40, 1), K(72, 90, 2)], "stage")
    assert idle(rec) == {"before_first_op": 1, "launch_call": 1 + 1, "launch_latency": 3 + 1, "sync_wait": 30,
                         "after_last_op": 5}
    assert [s["name"] for s in rec["syncs"]] == ["cudaStreamSynchronize"]


def test_event_queries_are_not_syncs_but_sync_records_are():
    api = [A(1, 2, "cuLaunchKernel", 1), A(10, 42, "cudaEventQuery_v3020", 9), A(50, 52, "cuWeirdWait", 10),
           A(70, 71, "cuLaunchKernel", 2)]
    rec = one([R("stage", 0, 95)], api, [K(5, 40, 1), K(72, 90, 2)], "stage", sync_corr=frozenset({9, 10}))
    assert [s["name"] for s in rec["syncs"]] == ["cuWeirdWait"]
    assert idle(rec)["launch_gap"] == 30      # the host was not blocked when the GPU drained at 40


def test_blocking_pageable_read_ends_a_stage_with_a_sync_wait():
    api = [A(1, 2, "cuLaunchKernel", 1), A(3, 35, "cudaMemcpyAsync_v3020", 2)]
    rec = one([R("stage", 0, 50)], api, [K(5, 20, 1), C(25, 30, 2, "DtoH", "pageable", 8)], "stage")
    assert len(rec["syncs"]) == 1             # a DtoH copy to pageable memory blocks the host
    assert idle(rec)["sync_wait"] == 20       # [30, 50): drained while the host sat in the copy call


def test_a_range_that_hands_back_the_result_finishes_after_its_read():
    """The plan's last stage reads the result's length and assembles it: the GPU idles from the read's end on, but
    only while the host sits in the call is that a wait on the read; once it returns, the host is finishing, with
    no later op the read held back (an H200 join's output_sort: 3.7 us in the sync, 18.7 us after it). A stage
    whose read is followed by more work keeps the round trip to its end."""
    api = [A(1, 2, "cuLaunchKernel", 1), A(3, 35, "cudaMemcpyAsync_v3020", 2)]
    ops = [K(5, 20, 1), C(25, 30, 2, "DtoH", "pageable", 8)]
    recs = account_ranges(Timeline([R("stage", 0, 50)], api, ops), finishing={"stage"})
    # [20, 25): the host sat in the blocking copy's call, which issues the copy: its time inside the call
    assert idle(recs[0]) == {"launch_call": 1 + 5, "launch_latency": 3, "before_first_op": 1, "sync_wait": 5,
                             "after_last_op": 15}
    assert idle(one([R("stage", 0, 50)], api, ops, "stage"))["sync_wait"] == 20
    assert recs[0]["accounted_ns"] == recs[0]["span_ns"]


def test_ops_belong_to_the_range_that_launched_them():
    ranges = [R("a", 0, 50), R("b", 60, 130)]
    api = [A(10, 11, "cuLaunchKernel", 1), A(70, 71, "cuLaunchKernel", 2)]
    ops = [K(40, 120, 1), K(120, 130, 2)]
    recs = {r["name"]: r for r in account_ranges(Timeline(ranges, api, ops))}
    a, b = recs["a"], recs["b"]
    assert a["ops"] == 1 and b["ops"] == 1
    assert us(a, "busy_ns") == 10 and us(a, "gpu_after_end_ns") == 70 and us(a, "kernel_ns") == 80
    assert us(b, "busy_ns") == 70 and us(b, "busy_own_ns") == 10 and us(b, "busy_earlier_ns") == 60
    assert sum(b["idle_ns"].values()) == 0
    # What CUDA events at the range edges would read: a waits for its kernel, b for a's.
    assert us(a, "event_estimate_ns") == 120
    assert us(b, "event_estimate_ns") == 10 and us(b, "queued_behind_earlier_ns") == 60


def test_range_with_no_gpu_work_and_nesting():
    ranges = [R("iteration", 0, 200), R("host_only", 0, 50), R("gpu", 60, 200)]
    api = [A(61, 62, "cuLaunchKernel", 1)]
    recs = {r["name"]: r for r in account_ranges(Timeline(ranges, api, [K(70, 190, 1)]))}
    assert idle(recs["host_only"]) == {"no_gpu_work": 50}
    assert recs["iteration"]["ops"] == 1 and not recs["iteration"]["leaf"]
    assert recs["host_only"]["leaf"] and recs["gpu"]["leaf"]
    findings = audit(list(recs.values()))
    assert ("LOW", "range with no GPU work", "host_only") in {(f["severity"], f["rule"], f["stage"]) for f in findings}


def test_other_threads_launches_do_not_count():
    recs = account_ranges(Timeline([R("stage", 0, 100, tid=1)], [A(10, 11, "cuLaunchKernel", 1, tid=2)],
                                   [K(20, 30, 1)]))
    assert recs[0]["ops"] == 0
    assert us(recs[0], "busy_ns") == 10 and us(recs[0], "busy_earlier_ns") == 10   # still busy, not its work
    assert idle(recs[0]) == {"no_gpu_work": 90}


def test_audit_flags_each_rule_with_evidence():
    ranges = [R("upload", 0, 100), R("compute", 100, 300), R("emit", 300, 400)]
    api = [A(5, 6, "cudaMemcpyAsync_v3020", 1),
           A(110, 111, "cuLaunchKernel", 2), A(120, 150, "cudaDeviceSynchronize_v3020", 3),
           A(160, 161, "cuLaunchKernel", 4), A(165, 200, "cudaMemcpyAsync_v3020", 5),
           A(201, 202, "cudaStreamSynchronize_v3020", 6)]
    api += [A(210 + i, 211 + i, "cuLaunchKernel", 20 + i) for i in range(6)]
    ops = [C(10, 90, 1, "HtoD", "pageable", 4 << 20), K(112, 140, 2), K(162, 180, 4),
           C(182, 190, 5, "DtoH", "pageable", 8)] + [K(215 + 3 * i, 217 + 3 * i, 20 + i) for i in range(6)]
    findings = audit(account_ranges(Timeline(ranges, api, ops)), terminal={"emit"})
    got = {(f["severity"], f["rule"], f["stage"]): f["evidence"] for f in findings}
    assert "4.19 MB" in got[("HIGH", "pageable host->device copy", "upload")]
    assert got[("BLOCKING", "synchronization with no host read", "compute")].startswith("1 sync(s)")
    assert ("MEDIUM", "device->host copy inside a compute stage", "compute") in got
    assert got[("MEDIUM", "many tiny launches", "compute")].startswith("6 of 8 kernels")
    assert ("HIGH", "span dominated by host time", "compute") in got
    assert [f["severity"] for f in findings] == sorted((f["severity"] for f in findings),
                                                       key=["BLOCKING", "HIGH", "MEDIUM", "LOW"].index)


def test_summaries_and_answers():
    ranges = [R("it", 0, 100), R("s1", 0, 40), R("s2", 40, 100), R("it", 100, 200), R("s1", 100, 140),
              R("s2", 140, 200)]
    api = [A(2, 3, "cuLaunchKernel", 1), A(10, 37, "cudaStreamSynchronize_v3020", 2), A(90, 91, "cuLaunchKernel", 3),
           A(102, 103, "cuLaunchKernel", 4), A(110, 137, "cudaStreamSynchronize_v3020", 5),
           A(190, 191, "cuLaunchKernel", 6)]
    ops = [K(5, 35, 1), K(92, 99, 3), K(105, 135, 4), K(192, 199, 6)]
    summ = {s["name"]: s for s in summarise(account_ranges(Timeline(ranges, api, ops)))}
    it = summ["it"]
    assert it["instances"] == 2 and it["span_us"] == 100 and it["busy_us"] == 37
    assert it["idle_us"]["sync_wait"] == 55 and it["accounting_max_error_pct"] == 0
    assert summ["s1"]["idle_us"]["sync_wait"] == 5                # drained at 35 while the host synced
    assert summ["s2"]["idle_us"]["before_first_op"] == 50          # the host prepared s2's launch
    q1, q2 = answers(it, [summ["s1"], summ["s2"]], [])
    assert "busy only 37%" in q1 and "55.0 us sync wait" in q1
    assert q2.startswith("Remove the mid-plan host reads")


def test_the_host_inside_a_launch_call_is_not_launch_latency():
    """An H200 overlay's segment_extraction: its one cuLaunchKernel call lasted 16.45 us on an idle GPU and the kernel
    started 0.27 us after the call returned. The 16.45 us are the host's, inside the call that issues the op; only the
    0.27 us after it are the launch's latency. The pieces still add up to the span."""
    ns = lambda x: int(round(x * US))      # noqa: E731
    ranges = [("stage", "d", 0, ns(60), 1)]
    api = [(ns(40), ns(56.45), "cuLaunchKernel", 1, 1)]
    ops = [(ns(56.72), ns(58), "kernel", "k", 1, 7, 0, 0, "", "")]
    rec = one(ranges, api, ops, "stage")
    assert rec["idle_ns"]["before_first_op"] == ns(40) and rec["idle_ns"]["launch_call"] == ns(16.45)
    assert rec["idle_ns"]["launch_latency"] == ns(0.27) and rec["accounted_ns"] == rec["span_ns"]
    assert rec["idle_iv"]["launch_call"] == [(ns(40), ns(56.45))]
    assert rec["quiet_start_ns"] == ns(40)               # no CUDA call before the launch's


def test_an_iterations_stage_is_found_inside_it():
    """An iteration [0, 100) whose one stage is [10, 60): its idle time by cause, and its stage instance."""
    from app.analysis.timeline import stages_of

    ranges = [R("it", 0, 100), R("s", 10, 60)]
    api = [A(20, 21, "cuLaunchKernel", 1), A(70, 90, "cudaStreamSynchronize_v3020", 2)]
    recs = {r["name"]: r for r in account_ranges(Timeline(ranges, api, [K(25, 50, 1)]), finishing={"it"})}
    it = recs["it"]
    assert idle(it) == {"before_first_op": 20, "launch_call": 1, "launch_latency": 4, "after_last_op": 30,
                        "sync_wait": 20}
    (stage,) = stages_of(it, list(recs.values()), {"s"})
    assert (stage["start_ns"], stage["end_ns"]) == (recs["s"]["start_ns"], recs["s"]["end_ns"])


@pytest.mark.parametrize("cause", CAUSES)
def test_every_cause_has_report_text(cause):
    from app.analysis.timeline import CAUSE_TEXT
    from app.report.timeline_report import BOTTLENECK, OPPORTUNITY

    assert CAUSE_TEXT[cause] and BOTTLENECK[cause] and OPPORTUNITY[cause]


def test_event_marks_bracketing_a_range_move_the_event_estimate():
    ranges = [R("stage", 10, 50)]
    api = [A(5, 8, "cudaEventRecord_v3020", 1), A(12, 13, "cuLaunchKernel", 2), A(52, 55, "cudaEventRecord_v3020", 3)]
    plain, marked = (account_ranges(Timeline(ranges, api, [K(15, 40, 2)]), event_marks=m)[0] for m in (False, True))
    assert us(plain, "event_estimate_ns") == 40 and us(plain, "event_marks_outside_ns") == 0
    assert us(marked, "event_estimate_ns") == 47            # from the first record's issue to the second's
    assert us(marked, "event_marks_outside_ns") == 2 + 5
    assert marked["accounted_ns"] == marked["span_ns"] == 40 * US   # the marks never enter the span


def test_interval_edges_touching_and_empty():
    assert union([(0, 5), (5, 9)]) == [(0, 9)]                    # touching intervals merge
    assert union([(3, 3), (4, 2)]) == []                           # empty and inverted ones vanish
    assert gaps(0, 10, [(0, 4), (4, 10)]) == []
    assert gaps(5, 10, [(0, 5), (10, 12)]) == [(5, 10)]
    assert gaps(0, 10, [(-5, 2), (3, 4), (12, 15)]) == [(2, 3), (4, 10)]
    assert covered_at_least([(0, 5), (5, 10)], 2, 0, 10) == 0     # an end closes before a start opens


def test_host_blocking_calls_only_are_syncs():
    """A stream waiting on an event makes the GPU wait, not the host, though CUPTI files a synchronisation
    record for it; an asynchronous device->host copy (to pinned memory) returns at once. Neither is a sync."""
    api = [A(1, 2, "cuLaunchKernel", 1), A(10, 11, "cudaStreamWaitEvent_v3020", 9),
           A(12, 13, "cuMemcpyDtoHAsync_v2", 10), A(20, 40, "cuMemcpyDtoH_v2", 11)]
    ops = [K(5, 30, 1), C(31, 32, 10, "DtoH", "pinned", 8), C(33, 35, 11, "DtoH", "pinned", 8)]
    rec = one([R("stage", 0, 50)], api, ops, "stage", sync_corr=frozenset({9}))
    assert [s["name"] for s in rec["syncs"]] == ["cuMemcpyDtoH"]


def test_a_library_range_inside_a_stage_leaves_the_stage_a_leaf():
    """A CCCL scan's range inside a stage is another domain's view of the same time: the stage keeps its
    findings (a range of the stage's own domain inside it would take them)."""
    ranges = [R("stage", 0, 200), R("cub::DeviceScan", 10, 20, domain="CCCL")]
    api = [A(11, 12, "cuLaunchKernel", 1), A(30, 130, "cudaDeviceSynchronize_v3020", 2)]
    api += [A(140 + i, 141 + i, "cuLaunchKernel", 10 + i) for i in range(6)]
    ops = [K(15, 25, 1)] + [K(150 + 3 * i, 152 + 3 * i, 10 + i) for i in range(6)]
    recs = account_ranges(Timeline(ranges, api, ops))
    assert all(r["leaf"] for r in recs)
    rules = {(f["rule"], f["stage"]) for f in audit(recs)}
    assert ("synchronization with no host read", "stage") in rules
    assert ("many tiny launches", "stage") in rules
    nested = account_ranges(Timeline(ranges + [R("inner", 30, 40)], api, ops))
    assert not next(r for r in nested if r["name"] == "stage")["leaf"]


def test_rows_are_one_real_instance_and_a_missing_latency_is_missing():
    """Each summary row is the instance whose span is the median (the lower middle one for an even count), so
    busy + idle adds up to its span; taken column by column, medians of three instances need not."""
    ranges = [R("s", 0, 100), R("s", 200, 260), R("s", 300, 380), R("host_only", 400, 450)]
    api = [A(1, 2, "cuLaunchKernel", 1), A(201, 202, "cuLaunchKernel", 2), A(301, 302, "cuLaunchKernel", 3)]
    ops = [K(10, 90, 1), K(250, 255, 2), K(305, 310, 3)]
    instances = account_ranges(Timeline(ranges, api, ops))
    summ = {s["name"]: s for s in summarise(instances)}
    s = summ["s"]
    assert s["span_us"] == 80 and s["median_instance"] == 2
    assert s["busy_us"] == 5 and s["busy_us"] + sum(s["idle_us"].values()) == s["span_us"]
    # the medians column by column: span 80, busy 5, idle 48 + 3 + ... would not add up
    assert summ["host_only"]["launch_latency_us"] is None
    from app.report.timeline_report import launches_section
    row = launches_section([summ["host_only"]]).rows[0]
    assert row[4] == "n/a"
    even = summarise(account_ranges(Timeline(ranges[:2], api[:2], ops[:2])))[0]
    assert even["span_us"] == 60 and even["median_instance"] == 1
