"""report.md of nsys mode and the text of the timeline command: wall-time accounting, reconciliation
with CUDA-event timing, launches, the audit and its two questions."""
from __future__ import annotations

from app.analysis.audit import copy_bound, mid_plan_sync_us
from app.analysis.baseline import other_backend
from app.analysis.timeline import CAUSE_TEXT, CAUSES, time_outside_stages
from app.report.baseline import baseline_section, mismatch_warning
from app.report.clock_text import clock_cell, throttle_note
from app.report.markdown import Section, fmt, render
from app.report.sections import (verification_line, verification_section, with_verification_headline,
                                 with_verification_summary)
from app.report.timing_text import drift_of, drift_text, pace_rows, still_changing
from app.runtime.stats import MIN_CI_SAMPLES, STABLE_REL_SPREAD

BOTTLENECK = {"sync_wait": "Sync-bound (host round trips)", "launch_gap": "Launch-bound (host issue rate)",
              "launch_call": "Launch-bound (the host inside its launch calls)",
              "launch_latency": "Launch-bound (launch latency after the calls returned)",
              "before_first_op": "Host-preparation-bound",
              "after_last_op": "Host-bound (after the last op)", "no_gpu_work": "Host-only (no GPU work)"}
OPPORTUNITY = {
    "sync_wait": "Remove the synchronization round trips (upper-bound allocations or device-side sizes)",
    "launch_gap": "Cut host launch overhead (fuse launch-bound kernels or replay a CUDA graph)",
    "launch_call": "Cut the host's time inside launch calls (fewer launches, or a CUDA graph replayed in one call)",
    "launch_latency": "Cut launch latency (fewer, larger launches or a CUDA graph)",
    "before_first_op": "Take host preparation off the critical path (do it once, or while earlier GPU work runs)",
    "after_last_op": "Shrink host work after the last GPU op of each stage",
    "no_gpu_work": "Move host-only work to the GPU or out of the timed path",
    "staging": "Take the host's work before and between the copies off the critical path",
}
STAGING_CAUSES = ("launch_gap", "before_first_op")
# the causes of a gap between one op and the next
BETWEEN_OPS = ("launch_gap", "launch_call", "launch_latency", "sync_wait")

COUNTERS_NOTE = ("TC%, DRAM% and Occ% are hardware counters (sm__pipe_tensor_op_*, dram__throughput, "
                 "sm__warps_active) that a trace does not record: they are missing here, not zero. Run "
                 "`--prof_type annotation` for them.")


def stage_bottleneck(s: dict) -> str:
    if s["span_us"] <= 0:
        return "n/a"
    share = s["busy_us"] / s["span_us"]
    if share >= 0.7:
        # The busy union counts every op in the span, also ops earlier stages launched that run into it: where
        # those fill most of it, the stage is not what keeps the GPU busy (its own kernels may take 4 us of 23).
        earlier = s.get("busy_earlier_us") or 0.0
        if earlier > s["busy_us"] - earlier:
            return (f"Behind earlier stages' GPU work (busy {100 * share:.0f}%, {earlier:,.1f} of those "
                    f"{s['busy_us']:,.1f} us their ops)")
        kind = "Transfer-bound" if s["memcpy_us"] > s["kernel_us"] else "GPU-bound"
        return f"{kind} (busy {100 * share:.0f}%)"
    earlier = s.get("busy_earlier_us") or 0.0
    own_ops = s["kernel_us"] + s["memcpy_us"] + s["memset_us"]
    if earlier > s["busy_us"] - earlier and s["gpu_after_end_us"] > own_ops / 2:
        # Its busy time is mostly earlier stages' ops and its own mostly run after it closes: the GPU was behind,
        # and the few us of idle left are no launch cause of its own (an H200 join's predicate_refine: 9.4 of its
        # 10.0 busy us the previous stage's kernel, its own 10.1 us past the range, 'launch-bound' from 6.1 us).
        return (f"Behind earlier stages' GPU work (busy {100 * share:.0f}%, {earlier:,.1f} of those "
                f"{s['busy_us']:,.1f} us their ops; its own run {s['gpu_after_end_us']:,.1f} us past the range)")
    top = max(CAUSES, key=lambda c: s["idle_us"][c])
    if copy_bound(s) and top in STAGING_CAUSES:
        # Which of the two the capture shows: the wait before the first copy, or gaps between the copies. Each
        # figure for what it is: the host's quiet time ends at its first call, the GPU's wait when the copy starts.
        v, first = s["idle_us"][top], s.get("first_op_us")
        quiet = s.get("quiet_start_us")
        if top == "before_first_op":
            where = "; ".join(x for x in (
                f"the host made no CUDA call for the first {quiet:,.1f} us" if quiet is not None else "",
                f"the first copy started after {first:,.1f} us" if first is not None else "") if x) or \
                f"{v:,.1f} us of GPU idle before the host issued the first copy"
        else:
            where = f"{v:,.1f} us of host gaps between the copies"
        return f"Host-bound around its copies ({where}), busy {100 * share:.0f}%"
    return f"{BOTTLENECK[top]}, busy {100 * share:.0f}%"


def staging_opportunity(s: dict) -> str:
    """The advice for a stage that moves its data with copies and waits on the host around them, from what its
    capture shows (each copy's host memory, the gaps between copies, the host's time with no CUDA call before the
    first): pinned memory is advised only where a copy read pageable memory."""
    htod = (s.get("copies") or {}).get("HtoD", {})
    n, pageable = htod.get("count", 0), htod.get("pageable", 0)
    gap = s["idle_us"]["launch_gap"]
    back = f" and issue the copies back to back ({gap:,.1f} us of host gaps between them)" if gap >= 0.05 else ""
    if pageable:
        return (f"Keep the host arrays in pinned memory ({pageable:g} of {n:g} host->device copies read pageable "
                "memory)" + back)
    if not n:
        return OPPORTUNITY["staging"]
    # Only what the trace shows: host time with no CUDA call before the first copy. It cannot show what the host
    # did then, and an H200 join's staging queues its first DMA after one 128 KiB slice, so the copy into pinned
    # buffers explains little of a 99-528 us wait.
    quiet = s.get("quiet_start_us") or 0.0
    said = f"the host makes no CUDA call for the first {quiet:,.1f} us of that iteration's stage, " if quiet >= 0.05 \
        else ""
    return (f"Find what the host does before the first copy and cut it ({said}which the trace cannot break down; "
            f"its {n:g} copies already read pinned memory)" + back)


def _key_issue(s: dict) -> str:
    bits = []
    if s["syncs"]:
        bits.append(f"{s['syncs']:g} sync(s), {s['idle_us']['sync_wait']:,.1f} us round trips")
    if s["short_kernels"]:
        bits.append(f"{s['short_kernels']:g}/{s['kernels']:g} kernels < 10 us")
    if s["gpu_after_end_us"] > 0.05 * s["span_us"]:
        bits.append(f"GPU work {s['gpu_after_end_us']:,.1f} us past the range")
    return "; ".join(bits) or "-"


def accounting_section(rows: list[dict], title="Wall-time accounting (the median instance, us)") -> Section:
    cols = ["Range", "n", "Span", "GPU busy", "kernel", "copy", "memset"] + \
           [c.replace("_", " ") for c in CAUSES] + ["busy + idle", "max error"]
    out = []
    for s in rows:
        total = s["busy_us"] + sum(s["idle_us"].values())
        out.append([s["name"], s["instances"], fmt(s["span_us"]), fmt(s["busy_us"]), fmt(s["kernel_us"]),
                    fmt(s["memcpy_us"]), fmt(s["memset_us"])] + [fmt(s["idle_us"][c]) for c in CAUSES] +
                   [fmt(total), f"{s['accounting_max_error_pct']:.2f}%"])
    return Section(title, columns=cols, rows=out, note=(
        "Span = host wall time of the range. GPU busy = union of kernel, memcpy and memset intervals on all "
        "streams inside the span (never their sum); kernel/copy/memset = summed durations of the range's own ops, "
        "which may run past its end. Idle causes: " + "; ".join(f"{c.replace('_', ' ')} = {CAUSE_TEXT[c]}"
                                                                 for c in CAUSES) +
        ". Each row is one real instance of the range, the one whose span is the median (the lower middle one "
        "for an even count; n counts them all), so its parts add up to its span; 'max error' is the worst "
        "instance's |busy + idle - span| / span (each instance is partitioned exactly)."))


def launches_section(rows: list[dict]) -> Section:
    return Section("Launches, copies and concurrency (the median instance)",
                   columns=["Range", "GPU ops", "kernels", "kernels < 10 us", "launch->start (us)",
                            "2+ ops in flight (us)", "syncs", "GPU work past range end (us)"],
                   rows=[[s["name"], fmt(s["ops"], 0), fmt(s["kernels"], 0), fmt(s["short_kernels"], 0),
                          fmt(s["launch_latency_us"]), fmt(s["concurrent_us"]), fmt(s["syncs"], 0),
                          fmt(s["gpu_after_end_us"])] for s in rows],
                   note="The same instance as the accounting above. launch->start = median time from the start of "
                        "the API call that issued an op to the op's start on the GPU (includes the host's time inside "
                        "that call and queueing behind earlier work); n/a where the range issued no GPU op.")


def audit_section(findings: list[dict]) -> Section:
    if not findings:
        return Section("Audit", text="No findings.")
    return Section("Audit", columns=["Severity", "Finding", "Stage", "Evidence", "What to do"],
                   rows=[[f["severity"], f["rule"], f["stage"], f["evidence"], f["advice"]] for f in findings])


def event_gap_parts(s: dict, event: float, same_iteration: bool = True) -> list[tuple[float, str]]:
    """Why a range's event time and its span differ, as (us, reason) parts that add up to event - span: the
    capture's estimate splits into where the timing starts and ends against the range and the earlier work it waits
    for (they add up to the estimate's own gap, exactly), and what the estimate misses is the last part, taken from
    the unrounded figures. Each part is rounded on its own (a last part forced to close a rounded total had printed
    +19.8 for 19.72 us), so the parts shown may differ from the total shown by the rounding.
    ``same_iteration``: ``event`` is the instance's own iteration's (else every iteration's median)."""
    open_, close = s.get("event_open_us", 0.0), s.get("event_close_us", 0.0)
    parts = []
    if open_ >= 0:
        parts.append((open_, "from the CUDA event record that starts the timing to the range's start"))
    else:
        parts.append((open_, "host time in the range before its first CUDA event record, where the timing starts"))
    parts.append((-s["queued_behind_earlier_us"], "the GPU was still running earlier work when that record was "
                                                  "issued"))
    if close < 0:
        parts.append((close, "time in the range after its last CUDA event record fired and its GPU work was done "
                             "(the host finishing the run)"))
    elif s.get("event_close_by_gpu"):
        parts.append((close, "the range's GPU work finished after the host left the range (the closing event "
                             "record, issued sooner, waits for it)"))
    else:
        parts.append((close, "from the range's end to the CUDA event record that ends the timing"))
    residual = (event - s["span_us"]) - sum(v for v, _ in parts)
    parts.append((residual, "not explained by the trace: the measured event and the trace's prediction of it differ"
                  if same_iteration else "not explained by the trace (the event time is every iteration's median, "
                                         "the prediction this instance's)"))
    return [(round(v, 1), why) for v, why in parts if abs(round(v, 1)) >= 0.1]


def _reconcile_cause(s: dict, event: float, same_iteration: bool = True) -> str:
    span = s["span_us"]
    if span <= 0:
        return "-"
    said = "; ".join(f"{v:+,.1f} us: {why}" for v, why in event_gap_parts(s, event, same_iteration)) or "equal"
    return f"agree within 5%: {said}" if abs(event - span) <= 0.05 * span else said


def own_event_us(analysis: dict, s: dict) -> float | None:
    """The CUDA-event time the worker measured in the iteration of a row's instance (us); None where the capture's
    instances and the worker's iterations do not pair up one to one."""
    samples = (analysis.get("event_samples_us") or {}).get(s["name"]) or []
    i = s.get("median_instance")
    return samples[i] if i is not None and len(samples) == s["instances"] else None


def _outside_stages(analysis: dict) -> float:
    """The iteration's median instance's span less the spans of the stage ranges inside it (us); 0 where the capture's
    instances are not at hand."""
    it = analysis["iteration"]
    rec = next((r for r in analysis.get("instances", []) if r["name"] == it["name"]
                and r.get("instance") == it.get("median_instance")), None)
    if rec is None:
        return 0.0
    names = {s["name"] for s in analysis["stages"]}
    return max(0.0, time_outside_stages(rec, analysis["instances"], names) / 1e3)


def reconciliation_section(analysis: dict) -> Section:
    rows = []
    for s in [analysis["iteration"]] + analysis["stages"]:
        median, own = analysis["event_us"][s["name"]], own_event_us(analysis, s)
        # Like with like: the instance's span and trace estimate beside its own iteration's measured event (the
        # median over iterations had left an H200 join's +19.8 us 'not explained', where that iteration's event
        # matched the trace's prediction within 0.15 us). The median is shown beside it, labelled.
        event = median if own is None else own
        rows.append([s["name"], "n/a" if own is None else fmt(own), fmt(median), fmt(s["span_us"]), fmt(s["busy_us"]),
                     fmt(s["event_estimate_us"]), f"{event - s['span_us']:+,.1f}",
                     _reconcile_cause(s, event, own is not None)])
    n = analysis["iteration"]["instances"]
    return Section("Event time vs span vs GPU busy", columns=[
        "Range", "Event, this iteration (us)", f"Event, median of {n} (us)", "Span (us)", "GPU busy (us)",
        "Event from trace (us)", "Event - span", "Why"], rows=rows, note=(
            "Event = CUDA events recorded on the stream at the stage's edges (what event mode measures): 'this "
            "iteration' is the event measured in the same iteration as the row's instance (the one the accounting "
            "above shows), beside the median over every traced iteration. Span = host wall time of the NVTX range. "
            "They differ when the GPU runs behind the host: the end event fires only when the stage's GPU work is "
            "done, and the start event waits for earlier work still queued. 'Event from trace' predicts the event "
            "time from the capture alone: from the event record that starts the timing (the one before a stage's "
            "range; the first inside the iteration's) to the later of the closing record and the range's GPU work. "
            "Event - span and 'Why' use this iteration's event; 'Why' splits Event - span into parts, each rounded on "
            "its own (so they can differ from the total by the rounding); the last, where the prediction and the "
            "measured event differ, is what the trace does not explain. 'agree within 5%': this iteration's event "
            "is within 5% of the span."))


def _median_words(it: dict) -> str:
    """What the iteration's figure is: the median instance's span; for an even count, the lower middle one, beside
    the median of every span."""
    true = (it.get("span_spread") or {}).get("median_us")
    if it["instances"] % 2 or true is None or abs(true - it["span_us"]) < 0.05:
        return "the median instance's span"
    return (f"the lower middle of {it['instances']} instances, whose parts add up below; the median of the spans "
            f"{true:,.1f}")


def _where_idle(cause: str, where: dict, outside_us: float = 0.0) -> str:
    """The stage with the most of an idle cause, with its own figure. Not 'mostly in': each range's time is split
    into causes on its own (a gap before a stage's first copy is that stage's 'before first op' though the iteration
    had begun its GPU work), so the stages' figures neither add up to the iteration's nor stay under it (an H200
    report read 'mostly in owned_buffer_build (227.7 of 215.4 us)', and the join capture's sync wait was 'mostly in'
    a stage holding a quarter of it). Where no stage's range holds any of it, it lies between or after the stage
    ranges (an H200 report's 172.0 us after the last op named 'owned_buffer_build (0.0 us ...)')."""
    if where["idle_us"][cause] < 0.05:
        # Not "between the stages": an H200 join's 149.4 us of the iteration's launch gaps lay 139.9 us inside stage
        # ranges, where each stage counts its side of a gap between two ops as its own time after its last op or
        # before its first.
        where_ = ("in no stage's range: it lies between or after them" if cause not in BETWEEN_OPS else
                  f"no stage counts any of it as its own {cause.replace('_', ' ')}: the iteration's gaps between "
                  "ops run across stage boundaries, and each stage counts its side of one as its time before its "
                  "first op or after its last")
        return where_ + (f" ({outside_us:,.1f} us of the iteration is outside every stage)" if outside_us else "")
    return (f"the stage with the most of it in that iteration {where['name']} ({where['idle_us'][cause]:,.1f} us of "
            "its own span)")


def opportunities(trace: dict, analysis: dict) -> list[str]:
    """Every opportunity the capture supports, by estimated gain (the report lists the first three). Each counts
    only the median iteration's idle time inside its stage ranges, as each of its stage instances accounts its own
    span (a gap the iteration calls a launch gap is a stage's 'after last op' where no launch was pending in it),
    what the plan's code can act on: its time outside every
    stage (the profiler's closing event record and synchronize, the host finishing the run, the time before the
    first stage opens) is the run's own (an H200 join's 57.7 us after the last op held 18.9 inside a stage). The
    stage named is the one with the most of the cause in that same iteration."""
    it = analysis["iteration"]
    stages = analysis.get("iteration_stages") or analysis["stages"]
    inside = it.get("idle_in_stages_us") or it["idle_us"]
    ops, outside, staged = [], _outside_stages(analysis), []
    terminal = set(analysis.get("terminal", ()))
    for c in CAUSES:
        v, whole = inside[c], it["idle_us"][c]
        scope = f" in its stages' own accounting ({whole:,.1f}us in the whole iteration's row)"
        if c == "sync_wait" and "terminal" in analysis:
            # Only reads the plan can do without: not the result's, in the stage that hands it back, nor the time
            # after the last stage closes (the profiler's end of the run), both in the iteration's figure (an H200
            # join: 54.5 us, its only read the result's length).
            v = mid_plan_sync_us(stages, terminal)
            stages_c = [s for s in stages if s["name"] not in terminal]
            scope = f" in the stages before the result's ({whole:,.1f}us in the whole iteration's row)"
        else:
            stages_c = stages
        if v >= 0.05 and it["span_us"] and stages_c:
            where = max(stages_c, key=lambda s: s["idle_us"][c])
            # One piece of advice, however many causes lead to it; a cause the stage has none of (its max over zeros,
            # the join's launch gaps all outside the stages) is not its to advise on.
            if c in STAGING_CAUSES and copy_bound(where) and where["idle_us"][c] >= 0.05:
                staged.append((v, c, where))
                continue
            ops.append((v, f"{OPPORTUNITY[c]}; {_where_idle(c, where, outside)} — est. {100 * v / it['span_us']:.0f}% "
                           f"gain — trigger: {c}={v:,.1f}us per iteration{scope}"))
    if staged:
        # The host staging its copies shows as two idle causes (the gap before a build's first copy, the gaps
        # between its copies): listed apart, the same advice took two of the three places (an H200 join: 36% and
        # 21%). One entry. Where both causes peak in one stage (the build), its gain is that stage's own time of
        # them, what staging can save: the iteration's totals also hold other stages' launch gaps (the join
        # capture's 608.6 us against the build's own 382.4).
        v = sum(x[0] for x in staged)
        _, c, where = max(staged, key=lambda x: x[0])
        own = sum(w["idle_us"][x] for _, x, w in staged)
        if len({w["name"] for *_, w in staged}) == 1 and own >= 0.05:
            place, v = (f"the stage with the most of them in that iteration {where['name']} ({own:,.1f} us of its own "
                        "span)", min(v, own))
        else:
            place = _where_idle(c, where, outside)
        gain = f"est. {100 * v / it['span_us']:.0f}% gain"
        ops.append((v, f"{staging_opportunity(where)}; {place} — {gain} — trigger: "
                       + ", ".join(f"{c}={x:,.1f}us" for x, c, _ in staged) + " per iteration in its stages' own "
                       "accounting (" + " and ".join(f"{it['idle_us'][c]:,.1f}us" for _, c, _ in staged) + " in the "
                       "whole iteration's row)"))
    k = max(stages, key=lambda s: s["kernel_us"])
    ops.append((k["kernel_us"], f"Faster kernels in {k['name']} — est. {100 * k['kernel_us'] / it['span_us']:.0f}% "
                                f"gain at most — trigger: kernel_us={k['kernel_us']:,.1f}"))
    return [t for _, t in sorted(ops, reverse=True)]


def nsys_report(trace: dict, analysis: dict, params: dict, baseline: dict | None) -> str:
    it, stages = analysis["iteration"], analysis["stages"]
    tool = trace["metadata"]["tool"]
    share = 100 * it["busy_us"] / it["span_us"] if it["span_us"] else 0.0
    top = max(CAUSES, key=lambda c: it["idle_us"][c])
    # The largest cause the stages hold, by their own accounting summed (as the opportunities count it), and the
    # stage that loses the most in that same iteration: a stage's median instance is often another iteration's.
    own = it.get("idle_in_stages_us") or it["idle_us"]
    top_own = max(CAUSES, key=lambda c: own[c])
    if share >= 70:
        bottleneck = (f"GPU work (busy {share:.0f}% of the iteration); run `--prof_type annotation` to split "
                      "memory- from compute-bound")
    else:
        bottleneck = f"Latency-bound — host orchestration: the GPU is busy {share:.0f}% of the iteration"
    worst = max(analysis.get("iteration_stages") or stages, key=lambda s: s["span_us"] - s["busy_us"])
    whole = (f", whose largest cause is {CAUSE_TEXT[top]} at {it['idle_us'][top]:,.1f} us: the iteration splits the "
             "gaps that cross a stage boundary or lie outside every stage its own way" if top != top_own else "")
    cause = (f"Of {it['span_us']:,.1f} us in the median iteration the GPU is busy {it['busy_us']:,.1f} us; its "
             f"stages, each accounting its own span, lose the most to {CAUSE_TEXT[top_own]} ({own[top_own]:,.1f} us "
             f"summed, {it['idle_us'][top_own]:,.1f} us in the whole iteration's row{whole}). {worst['name']} loses "
             f"the most in that iteration ({worst['span_us'] - worst['busy_us']:,.1f} us idle of "
             f"{worst['span_us']:,.1f} us).")
    ops = opportunities(trace, analysis)[:3]
    clocks = params.get("clocks", {})
    backend = backend_text(tool, analysis.get("capture", {}))
    config_cols = list(trace["metadata"]["params"]) + ["device", "backend", "iterations", "clocks"]
    config = [fmt(v) for v in trace["metadata"]["params"].values()] + [
        trace["device"]["name"], backend, it["instances"], clock_cell(clocks)]
    sections = [
        Section("Configuration", columns=config_cols, rows=[config], note=throttle_note(clocks) or None),
        Section("Stages", columns=["Stage", "Duration (us)", "TC%", "DRAM%", "Occ%", "Bottleneck", "Key Issue"],
                rows=[[s["name"], fmt(s["span_us"]), "missing", "missing", "missing", stage_bottleneck(s),
                       _key_issue(s)] for s in stages],
                note="Duration = host span of the stage's NVTX range in its median instance (the lower middle one "
                     "for an even count of iterations: a real instance, so its accounting below adds up; the "
                     "median of every span is in the spread table). Bottleneck: what "
                     "the span went to; 'behind earlier stages' GPU work' where the GPU was busy in it mostly with ops "
                     "that earlier stages launched. " + COUNTERS_NOTE),
        Section(text=f"**Bottleneck:** {bottleneck}\n\n**Root cause:** {cause}"),
        Section("Top 3 Opportunities (ranked by estimated impact)", items=ops,
                note="Gain = the idle (or kernel) time that cause accounts for inside the plan's stage ranges, in "
                     "the median iteration (the whole iteration's row in the accounting table; each stage's row is "
                     "that stage's own median instance, often another iteration), each stage instance of it "
                     "splitting its own span into causes, summed, as a share of its span (for staging, where its "
                     "two causes, host "
                     "preparation and launch gaps, peak in one stage: that stage's own time of them); the stage named "
                     "is the one with the most of it in that same iteration. Idle time outside every stage range "
                     "(the profiler's event records and closing synchronize, the host finishing the run, the time "
                     "before the first stage opens) is the run's own, not the plan's, and counts in no gain. An upper "
                     "bound, since removing one cause can expose another."),
        baseline_section(trace, baseline, _baseline_warning(trace, baseline)),
        accounting_section([it] + stages),
        reconciliation_section(analysis),
        launches_section([it] + stages),
        _spread(trace, it, stages),
        *drift_and_paces(trace),
        audit_section(analysis["findings"]),
        Section("The audit's two questions", items=[
            f"**What forces this plan to behave like CPU code today?** {analysis['answers'][0]}",
            f"**What is the smallest structural change that moves it back to a GPU shape?** "
            f"{analysis['answers'][1]}"]),
        _copies(trace),
        verification_section(trace),
        Section("Capture", columns=["what", "value"], rows=_capture_rows(trace, analysis)),
    ]
    headline = (f"`{params['command_line']}` — {trace['device']['name']}, {it['instances']} iterations traced with "
                f"{backend}: {it['span_us']:,.1f} us per iteration ({_median_words(it)}), GPU busy "
                f"{it['busy_us']:,.1f} us "
                f"({share:.0f}%). Files: timeline.png, timeline.json (open in Perfetto or chrome://tracing), "
                "timeline_ranges.csv (every instance).")
    headline += still_changing(trace["timing"], "The iterations")
    if baseline and baseline.get("_mismatch"):
        headline = f"**Warning:{mismatch_warning(baseline)}** " + headline
    if trace["selected_runtime"] != "gpu" or trace["metadata"]["planner_selected_runtime"] != "gpu":
        headline = f"**CPU fallback or planner override: ran on {trace['selected_runtime']}.** " + headline
    # a wrong or unverified output leads the report, above every figure it times
    return render(trace["kernel"], trace["version"], with_verification_headline(trace, headline), sections)


def backend_text(tool: dict, capture: dict) -> str:
    """The tracer and its version as the capture records it (the exporter's EXPORT_PRODUCT_VERSION); where the
    `nsys --version` this tool ran says another, both, each named: on an H200 host the nsys bundled with Nsight
    Compute printed 2025.3.1.0 while its captures recorded 2025.3.2.0."""
    ran = tool.get("version")
    recorded = capture.get("nsys_version") if tool.get("backend") == "nsys" else None
    if recorded and ran and recorded != ran:
        return f"nsys {recorded} (as the capture records it; `nsys --version` printed {ran})"
    version = recorded or ran
    return tool["backend"] + (f" {version}" if version else "")


def _baseline_warning(trace: dict, baseline: dict | None) -> str:
    """What makes the baseline's times unlike this profile's: another mode, or another tracer."""
    if not baseline:
        return ""
    if baseline.get("mode") != "nsys":
        return (f" Warning: the baseline was measured in {baseline.get('mode')} mode, whose stage times are not "
                "host spans; compare like with like.")
    other = other_backend([baseline, trace])
    return f" Warning: {other}." if other else ""


def _spread(trace, it, stages) -> Section:
    rows = []
    for s in [it] + stages:
        sp = s["span_spread"]
        rows.append([s["name"], fmt(sp.get("median_us", s["span_us"])), fmt(sp["min_us"]), fmt(sp["max_us"]),
                     f"±{100 * sp['robust_rel_spread']:.1f}%", f"{100 * sp['rel_stdev']:.1f}%",
                     # judged from MIN_CI_SAMPLES instances, as event mode judges its runs
                     f"not judged ({s['instances']} instances)" if s.get("instances", MIN_CI_SAMPLES) < MIN_CI_SAMPLES
                     else "unstable" if sp["robust_rel_spread"] > STABLE_REL_SPREAD else "stable"])
    return Section("Spread of the span over iterations",
                   columns=["Range", "median", "min", "max", "robust spread", "rel. stdev", ""], rows=rows,
                   note=f"Robust spread = 1.4826 x median absolute deviation / median (one outlier cannot move it); "
                        "rel. stdev = the spans' standard deviation / their median; "
                        f"unstable = robust spread above {100 * STABLE_REL_SPREAD:.0f}%, judged from "
                        f"{MIN_CI_SAMPLES} instances or more; median = the median of every instance's span (for "
                        "an even count, the mean of the middle two).")


def drift_and_paces(trace) -> list[Section]:
    """The section "Drift and the host's pace": the iterations' drift check and the paces the worker timed before
    them (none for a trace with neither)."""
    timing = trace["timing"]
    check = drift_of(timing)
    pace, launch = timing.get("host_pace"), timing.get("launch_pace")
    rows = ([["drift over the traced iterations", drift_text(check, pace, launch)]] if check else []) + \
        pace_rows(timing, "each traced iteration")
    return [Section("Drift and the host's pace", columns=["what", "value"], rows=rows,
                    note="Drift: the medians of the first and last thirds of the iterations, each with its 95% "
                         "interval. The host's paces are timed just before each traced iteration, outside its "
                         "ranges: the same work every time, so where they moved, the host changed speed, not the "
                         "plan; a plan bound by its launches follows them. The launches are traced like the plan's, "
                         "so compare this pace only with another profile traced the same way (the same mode and "
                         "backend).")] if rows else []


def _copies(trace) -> Section:
    rows = []
    for s in trace["stages"]:
        m = s["metadata"]
        rows.append([s["name"], m.get("h2d_copies", 0), fmt(m.get("h2d_bytes", 0)), m.get("d2h_copies", 0),
                     fmt(m.get("d2h_bytes", 0)), m.get("syncs", 0), m.get("allocation_size_reads", 0)])
    return Section("Transfers and syncs (the stage's own counters, one iteration)",
                   columns=["Stage", "H2D copies", "H2D bytes", "D2H copies", "D2H bytes", "syncs", "size reads"],
                   rows=rows)


def _capture_rows(trace, analysis) -> list[list]:
    cap, tool = analysis["capture"], trace["metadata"]["tool"]
    rows = [["source", cap["source"]], ["tool", backend_text(tool, cap)],
            ["GPU ops in capture", f"{cap['ops']:,} ({cap['kernels']:,} kernels, {cap['memcpys']:,} memcpy, "
                                   f"{cap['memsets']:,} memset)"],
            ["GPU ops with no API record", cap["ops_without_api_record"]],
            ["uncovered (between stage ranges)", f"{trace['timing']['uncovered_seconds'] * 1e6:,.1f} us per iteration (the median of each "
                                                 "iteration's span less its stages' spans)"],
            ["mode wall time", f"{trace['timing'].get('mode_wall_seconds', 0):,.1f} s"]]
    if tool.get("overhead"):
        rows.append(["CUPTI overhead", cupti_overhead_text(tool["overhead"])])
    rows.append(["verification", verification_line(trace).strip()])
    return rows


def cupti_overhead_text(o: dict) -> str:
    """CUPTI's cost with its interval; below zero (tracing cannot make the plan faster) or not resolved, said so and
    no cost read from it."""
    pct, ci = o.get("overhead_pct"), o.get("ci_pct")
    if pct is None:
        return f"n/a (no untraced time to compare with; {o['note']})"
    runs = f"{o['untraced_wall_us']:,.1f} -> {o['traced_wall_us']:,.1f} us per iteration, {o['note']}"
    interval = f", 95% interval {ci[0]:+.1f}% to {ci[1]:+.1f}%" if ci else ", no interval (too few iterations)"
    if pct < 0:
        return (f"not read: {pct:+.2f}%{interval} ({runs}); tracing cannot make the plan faster, so the host's pace "
                "moved between the untraced iterations and the traced ones (they run in that order)")
    if not ci or ci[0] <= 0:
        return f"not resolved: {pct:+.2f}%{interval} ({runs})"
    return f"{pct:+.2f}%{interval} ({runs})"


def stage_summary_line(trace: dict, analysis: dict) -> str:
    it = analysis["iteration"]
    lines = [f"{trace['kernel']} {trace['version']} under {trace['metadata']['tool']['backend']} on "
             f"{trace['device']['name']}: {it['span_us']:,.1f} us per iteration, GPU busy {it['busy_us']:,.1f} us"]
    for s in analysis["stages"]:
        idle = max(CAUSES, key=lambda c: s["idle_us"][c])
        lines.append(f"  {s['name']:<24} span {s['span_us']:>10,.1f} us  busy {s['busy_us']:>9,.1f}  "
                     f"event {analysis['event_us'][s['name']]:>9,.1f}  top idle: {idle} {s['idle_us'][idle]:,.1f}")
    for f in analysis["findings"][:5]:
        lines.append(f"  [{f['severity']}] {f['rule']} in {f['stage']}: {f['evidence']}")
    # the check's line last and, where the output is wrong or unverified, its banner first
    return with_verification_summary(trace, "\n".join(lines))


def timeline_text(path: str, summaries: list[dict], findings: list[dict], capture: dict) -> str:
    """What `python -m app.kernel timeline REPORT` prints without --json: the same tables as a profile."""
    head = f"{capture['ranges']} ranges, {capture['ops']:,} GPU ops ({capture['source']})."
    return render("timeline", path, head, [accounting_section(summaries), launches_section(summaries),
                                          audit_section(findings)])
