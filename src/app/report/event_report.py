"""report.md for event mode: seed 004's Profiler Output Contract plus timing truth.

Section order: Configuration, Stages, Bottleneck/Root cause, Top 3 Opportunities,
vs Baseline (the contract), then Timing, Roofline, Stage chart, Transfers and
syncs, Cold start, Verification, Device -- the evidence behind the first five.
"""
from __future__ import annotations

import math

from app.analysis import advice
from app.report.baseline import baseline_section, mismatch_warning
from app.report.clock_text import clock_cell, throttle_note
from app.report.markdown import Section, fmt, fmt_pct, fmt_reading, render, us
from app.report.sections import (device_section, transfers_section, verification_section,
                                 with_verification_headline)
from app.report.timing_text import drift_of, drift_text, pace_rows, still_changing
from app.runtime.stats import MIN_CI_SAMPLES, OUTLIER_MIN_RUNS, robust_of


def build_report(trace: dict, params_json: dict, roof: dict, baseline: dict | None,
                 stage_chart: bool = False) -> str:
    """``stage_chart``: stage_chart.png is written beside report.md, so embed it."""
    findings = advice.stage_findings(trace, roof)
    ops = advice.opportunities(trace, roof, findings)
    bottleneck, cause = advice.overall(trace, findings, roof)
    occ = {s["name"]: s["metadata"].get("theoretical_occupancy_pct") for s in trace["stages"]}
    timing = trace["timing"]
    drift_check = drift_of(timing)
    pace = timing.get("host_pace")
    launch = timing.get("launch_pace")
    followed = [what for what, p in (("the host CPU's own pace", pace), ("the host's launch pace", launch))
                if p and p.get("follows")]
    sections = [
        Section("Configuration", columns=list(trace["metadata"]["params"]) + ["device", "runtime", "clocks"],
                rows=[[fmt(v) for v in trace["metadata"]["params"].values()]
                      + [trace["device"]["name"], trace["selected_runtime"], clock_cell(params_json.get("clocks"))]],
                note=throttle_note(params_json.get("clocks")) or None),
        Section("Stages", columns=["Stage", "Duration (us)", "± spread", "Host (us)", "TC%", "DRAM%", "Occ%",
                                   "Bottleneck", "Key Issue"],
                rows=[[f["stage"], us(s["elapsed_seconds"]), _spread_cell(s["spread"]),
                       _host_cell(s),
                       "n/a", fmt_pct(f["dram_pct"]), fmt(occ[f["stage"]], 1), f["bottleneck"], f["key_issue"]]
                      for f, s in zip(findings, trace["stages"])],
                note="Duration = median of the timed runs; ± spread = 1.4826 x median absolute deviation / median "
                     "(robust: outlier runs, counted in brackets, cannot move it). "
                     "Host = time the Python side spent in the stage: issuing its work (GPU work is asynchronous: "
                     "Host close to Duration means its launches may set its time -- or its kernels take about as long: nsys "
                     "mode tells them apart) and, where marked \"waits\", waiting "
                     "for a read from the device (a size or the result's length), which waits for all the work "
                     "queued before it, earlier stages' included. TC% n/a: these kernels use no tensor cores and event mode reads no counters. "
                     "DRAM% = the cost model's bytes / measured time / peak GB/s (the model counts each byte "
                     "a stage reads or writes once: real DRAM traffic is more where it re-reads, less where an "
                     "earlier stage left the data in L2). Occ% = the lowest theoretical occupancy (from "
                     "registers, shared memory and block size) among the kernels of ours the stage launched in this "
                     "run; annotation mode measures achieved values."),
        Section(text=f"**Bottleneck:** {bottleneck}\n\n**Root cause:** {cause}"),
        Section("Top 3 Opportunities (ranked by estimated impact)",
                items=[f"{o['name']} — est. {fmt(o['gain_pct'], 0, '%') if o['gain_pct'] is not None else 'n/a'} "
                       f"gain — trigger: {o['trigger']}" for o in ops[:3]] or ["none triggered"],
                note=f"Gain = time above {advice.ATTAINABLE:.0%} of the stage's roofline, as a share of the plan; "
                     "where the profile measured what the other stages' marks add to a stage's time, that is left "
                     "out first (the marks are the profiler's, not the code's)."),
        baseline_section(trace, baseline),
        Section("Timing", columns=["what", "value"], rows=[
            ["total, median of timed runs (us): host arrays in, result "
             + ("on the device" if trace["selected_runtime"] == "gpu" else "in host memory (a CPU run)"),
             us(trace["total_elapsed_seconds"])],
            *([[f"after the {'host->device' if trace['selected_runtime'] == 'gpu' else 'input'} build "
                f"({', '.join(timing['build_stages'])} left out) (us)",
                us(timing["after_build"]["median"])]] if timing.get("after_build") else []),
            *([["end to end, host arrays in and out (us)", _end_to_end(timing["end_to_end"])]]
              if timing.get("end_to_end") else []),
            *([["host->device DMA alone: the build's staged bytes again, from their pinned buffers (us)",
                _staging_dma(timing["staging_dma"], trace["selected_runtime"])]] if "staging_dma" in timing else []),
            ["total min / max (us)", f"{us(timing['total']['min'])} / {us(timing['total']['max'])}"],
            ["95% interval of the median (us)", _ci_text(timing["total"])],
            ["total robust spread (1.4826 x MAD / median)", _robust_text(timing["total"], followed)],
            ["outlier runs (outside 1.5 x IQR)", _outliers_text(timing["total"])],
            ["total rel. stdev (for reference; outliers inflate it)", fmt(100 * timing["total"]["rel_stdev"], 2, "%")],
            ["sum of stages, run by run (median of each run's sum, us)", us(timing["stage_sum_seconds"])],
            ["sum of the Duration column (each stage's own median, us)", _column_sum_text(trace)],
            ["uncovered by stages, run by run (median of each run's total less its stages, us)",
             f"{us(timing['uncovered_seconds'])} ({fmt(100 * timing['uncovered_fraction'], 2, '%')})"
             + (": none by construction: each stage's closing mark opens the next and the last one's ends the run, "
                "so the stages tile it, and host or idle time between two stages' work counts in a stage's time"
                if timing.get("stages_tile_run") else "")],
            ["host wall incl. final sync (us)", us(timing["wall"]["median"])],
            ["runs", f"{timing['warmup_runs']} warm-up{_warmup_text(timing.get('warmup'))}, "
                     f"{timing['timed_runs']} timed; clock: {timing['clock']}"],
            *([["drift over the timed runs", drift_text(drift_check, pace, launch)]] if drift_check else []),
            *pace_rows(timing, "each timed run"),
            *([["the timed runs repeated later (the overhead pairs' runs with every stage marked, us)",
                _repeated_text(timing["repeated_later"])]] if timing.get("repeated_later") else []),
            *_hygiene_rows(timing),
        ]),
        _one_mark_section(trace),
        _roofline(roof),
        _stage_chart(roof) if stage_chart else None,
        transfers_section(trace),
        _rows_and_meta(trace),
        _cold(trace),
        verification_section(trace),
        device_section(trace, params_json),
    ]
    unstable = [s["name"] for s in trace["stages"]            # None, or too few runs in an older trace: not judged
                if s["spread"].get("stable") is False and s["spread"]["runs"] >= MIN_CI_SAMPLES]
    headline = (f"`{params_json['command_line']}` — {trace['selected_runtime'].upper()} "
                f"({trace['device']['name']}), total {us(trace['total_elapsed_seconds'])} us median of "
                f"{timing['timed_runs']} runs." + (f" Unstable stages (robust spread > 2%): {', '.join(unstable)}."
                                                   if unstable else "")
                + _cpu_stages_text(trace)
                + still_changing(timing, "The timed runs")
                + (f" **The machine's pace moved during the profile** ({_repeated_text(timing['repeated_later'])})."
                   if (timing.get("repeated_later") or {}).get("apart") else ""))
    if baseline and baseline.get("_mismatch"):
        headline = f"**Warning:{mismatch_warning(baseline)}** " + headline
    # a wrong or unverified output leads the report, above every figure it times
    headline = with_verification_headline(trace, headline)
    return render(trace["kernel"], trace["version"], headline, [s for s in sections if s])


def _cpu_stages_text(trace: dict) -> str:
    """Where this version runs another's stages on the CPU: its difference is in its GPU kernels only."""
    other = trace["metadata"].get("cpu_stages_of")
    if not other:
        return ""
    return (f" On the CPU, {trace['kernel']} {trace['version']} runs {other}'s stages (the versions differ in their "
            f"GPU kernels only), so this profile times the same code as {trace['kernel']} {other} on the CPU.")


def _roofline(roof):
    if not roof.get("available"):
        return Section("Roofline (cost model)", text=f"No roofline: {roof['why']}.")
    e = roof["end_to_end"]
    rows = [[name, fmt(p["bytes"] / 1e6, 2), *_flop_cells(p, fmt(p["achieved_gbps"])),
             "flagged: " + "; ".join(p["flags"]) if p.get("flags") else fmt_pct(p["pct_of_roofline"])]
            for name, p in list(roof["stages"].items()) + ([("all after the build", e)] if e else [])]
    if e:
        below = (e["arithmetic_intensity"] or 0) < roof["ridge_flop_per_byte"]
        where = (f"After the build the plan runs at {fmt(e['arithmetic_intensity'], 3)} FLOP/byte (its time: the "
                 "Timing table's \"after the host->device build\", where the profile has one), "
                 f"{'below' if below else 'above'} the ridge: the {'memory' if below else 'compute'} roof is the one "
                 "that applies.")
    else:
        where = f"No end-to-end point: {roof.get('end_to_end_why') or 'not recorded'}."
    return Section("Roofline (cost model)",
                   text=f"{roof['device_model']}: {roof['peak_gbps']:,.0f} GB/s, {roof['peak_tflops']:,.1f} TFLOP/s "
                        f"{roof['precision']}, peaks {roof.get('peaks_source', 'datasheet')}; ridge point "
                        f"{roof['ridge_flop_per_byte']:.1f} FLOP/byte. Scope: {roof['scope']}. {where}",
                   columns=["Stage", "model MB", "model MFLOP", "FLOP/B", "GB/s", "TFLOP/s", "% of roofline"], rows=rows,
                   note="Bytes and flops are the plan's cost model (each byte read or written once, each modelled operation "
                        "counted), not counters. A figure the "
                        "cost model cannot reach (above the peak) or a time that is no measurement is flagged, and "
                        "no class or advice is drawn from it.")


def _flop_cells(p: dict, gbps: str) -> list[str]:
    """model MFLOP, FLOP/B, GB/s (given) and TFLOP/s of a roofline point. A stage whose model counts no
    floating-point work (a sort, or a filter of comparisons) has no FLOP rate to give, rather than a rate of zero."""
    if not p["flops"]:
        return ["0 (none modelled)", "-", gbps, "- (none modelled)"]
    return [fmt(p["flops"] / 1e6, 2), fmt_reading(p["arithmetic_intensity"], 3), gbps,
            fmt_reading(p["achieved_tflops"], 4)]


def _host_cell(stage: dict) -> str:
    """The stage's host time, marked where it includes waiting for the device: a read there waits for everything
    queued before it, so the host time is not the stage's launch cost (a join's last stage can read 5-11x its
    own duration while the build's copies finish)."""
    waits = (stage.get("metadata") or {}).get("syncs", 0)
    return us(stage["host_seconds"]) + (" (waits)" if waits else "")


def _column_sum_text(trace: dict) -> str:
    """The Stages table's column added up, and why it need not equal the runs' own sums: each stage's median
    comes from a different run, so the gap is the runs' spread, while the uncovered row is the time no stage
    timed."""
    column = sum(s["elapsed_seconds"] for s in trace["stages"])
    gap = column - trace["timing"]["stage_sum_seconds"]
    return (f"{us(column)} ({'+' if gap >= 0 else '-'}{us(abs(gap))} from the runs' own sums: each stage's median "
            "comes from its own run, so the two differ by the runs' spread, not by time left untimed)")


def _ci_text(sp: dict) -> str:
    if "median_ci95" not in sp:
        return "n/a (not recorded in this trace)"
    lo, hi = sp["median_ci95"]
    if not _finite(lo, hi):
        return (f"n/a ({sp['runs']} timed run{'s' if sp['runs'] != 1 else ''}: a 95% interval of the median needs "
                f"at least {MIN_CI_SAMPLES})")
    return f"{us(lo)} – {us(hi)}"


def _robust_text(sp: dict, followed: list[str]) -> str:
    if sp.get("runs", 0) < 2:
        return "n/a (one timed run has no spread; stability not judged)"
    if sp.get("stable") is None or sp["runs"] < MIN_CI_SAMPLES:    # older traces judged fewer runs: not here
        return (fmt(100 * robust_of(sp), 2, "%") + f" (stability not judged from {sp['runs']} runs: it needs "
                f"{MIN_CI_SAMPLES})")
    return fmt(100 * robust_of(sp), 2, "%") + (
        " (stable)" if sp["stable"] else
        f" (UNSTABLE: > 2%; the runs followed {' and '.join(followed)}, see below)" if followed else " (UNSTABLE: > 2%)")


def _outliers_text(sp: dict) -> str:
    if "outliers" not in sp:
        return "n/a (not recorded in this trace)"
    if sp["outliers"] is None or sp["runs"] < OUTLIER_MIN_RUNS:     # older traces wrote 0 for too few runs
        return f"n/a ({sp['runs']} timed run{'s' if sp['runs'] != 1 else ''}: outliers are counted from {OUTLIER_MIN_RUNS})"
    return f"{sp['outliers']} of {sp['runs']}"


def _finite(*values) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


def _spread_cell(sp: dict) -> str:
    if sp.get("runs", 0) < 2:
        return "n/a (1 run)"
    return f"±{100 * robust_of(sp):.1f}%" + (f" ({sp['outliers']} outl.)" if sp.get("outliers") else "")


def _hygiene_rows(timing: dict) -> list[list[str]]:
    """How the runs were made: why this many, L2 between runs, what the stage marks cost, graph capture."""
    rows = []
    stop = timing.get("stopped_by")
    if stop and stop["requested"] == "auto":
        why = {"ci": f"the median's 95% interval reached ±{100 * stop.get('ci_half_width', 0):.2f}% "
                     f"(target ±{100 * stop.get('target', 0):.0f}%)",
               "budget": f"the {stop.get('budget_seconds', 0):.0f} s budget ran out at ±"
                         f"{100 * stop.get('ci_half_width', 0):.2f}% (target ±{100 * stop.get('target', 0):.0f}%)",
               "max_runs": f"the {stop.get('max_runs')} run cap"}[stop["rule"]]
        rows.append(["--bench_runs auto stopped by", why])
    if timing.get("l2"):
        l2 = timing["l2"]
        rows.append(["L2 between timed runs", f"{l2['mode']}: {l2['why']}"])
    if timing.get("instrumentation"):
        ins = timing["instrumentation"]
        ci = ins.get("overhead_ci95")
        within = (f", 95% interval {fmt(100 * ci[0], 2, '%')} to {fmt(100 * ci[1], 2, '%')}" if ci and _finite(*ci)
                  else f", no 95% interval ({ins['pairs']} pairs: it needs at least {MIN_CI_SAMPLES})" if ci else "")
        if ci and _finite(*ci) and ci[0] <= 0:
            within += (" (it reaches zero: the marks' cost is not resolved from the runs' noise"
                       + ("; below zero the marked runs simply read faster" if ins["overhead_fraction"] < 0 else "")
                       + ")")
        elif ins["overhead_fraction"] < 0:
            within += " (below zero: the marked runs read faster, so the marks' cost is not resolved)"
        # Traces made before the paired estimate carry no interval: theirs was a difference of medians.
        how = "median difference of" if ci else "difference of the medians of"
        # A mark's cost, with its interval: on the CPU a mark is a clock read, and the pairs' noise can dwarf it.
        # Traces before the count of marks carry none.
        each = ""
        if ins.get("per_mark_seconds") is not None:
            lo_m, hi_m = ins.get("per_mark_ci95") or (None, None)
            each = (f"; {us(ins['per_mark_seconds'])} us a mark" +
                    (f" (95% interval {us(lo_m)} to {us(hi_m)} us{', not resolved' if lo_m <= 0 else ''})"
                     if _finite(lo_m, hi_m) else "") +
                    f" for the {ins['extra_marks']} marks the bare plan does not record")
        rows.append(["instrumentation overhead (per-stage marks)",
                     f"{fmt(100 * ins['overhead_fraction'], 2, '%')} of the bare plan{within}{each} "
                     f"({us(ins['bare_median_seconds'])} us bare vs {us(ins['instrumented_median_seconds'])} us; "
                     f"{how} {ins['pairs']} interleaved pairs{_pairs_stop(ins)})"])
    one = timing.get("one_mark") or {}
    if one.get("overhead_fraction") is not None and one.get("overhead_ci95"):
        lo, hi = one["overhead_ci95"]
        within = (f"95% interval {fmt(100 * lo, 2, '%')} to {fmt(100 * hi, 2, '%')}"
                  + (", it reaches zero: not resolved from the runs' noise" if lo <= 0 else "")
                  if _finite(lo, hi) else f"no 95% interval ({one['rounds']} rounds: it needs at least "
                                          f"{MIN_CI_SAMPLES})")
        rows.append(["instrumentation overhead, one stage mark a run (the stage times without the other marks)",
                     f"{fmt(100 * one['overhead_fraction'], 2, '%')} of the bare plan, {within} "
                     f"({us(one['overhead_seconds'])} us; each round's median difference of its one-mark runs from "
                     f"its bare run, the median over {one['rounds']} rounds)"])
    if timing.get("graph"):
        rows.append(["CUDA graph", timing["graph"]["why"]])
        replay = timing["graph"].get("replay")
        if replay and replay.get("replayed"):
            # The timed runs' own figure beside the comparison's eager one: measured apart, on some H200 nodes
            # they differed by up to a quarter (eager 500 against 400 us), and the speed-up depends on which. The
            # host's pace moves during a profile: within one join profile on an H100, batches of 30 marked runs
            # took 201 to 334 us after the build at different points. Only the interleaved pair compares alike.
            own = timing.get("after_build") or {}
            beside = (f"; the profile's own timed runs gave {us(own['median'])} us after the build, "
                      f"{fmt(own['median'] / replay['graph_after_build_seconds'], 2, 'x')} the replay, measured "
                      "apart, at another point of the profile: the host's pace moves between batches of runs, so "
                      "compare the interleaved pair"
                      if own.get("median") and replay["graph_after_build_seconds"] > 0 else "")
            rows.append(["graph replay vs eager, after the build (us)",
                         f"{us(replay['graph_after_build_seconds'])} replayed{_ci_of(replay.get('graph_ci95'))} vs "
                         f"{us(replay['eager_after_build_seconds'])} eager{_ci_of(replay.get('eager_ci95'))} "
                         f"({fmt(replay['speedup'], 2, 'x')}{_graph_resolved(replay)}; "
                         f"medians of {replay['runs']} interleaved runs{beside}): "
                         + replay["why"]])
        elif replay:
            rows.append(["graph replay", replay["why"]])
    return rows


def _ci_of(ci) -> str:
    return f" [95% interval {us(ci[0])} – {us(ci[1])}]" if ci and _finite(*ci) else ""


def _graph_resolved(replay: dict) -> str:
    """Whether the replay's and the eager runs' medians are told apart: their 95% intervals must not overlap."""
    g, e = replay.get("graph_ci95"), replay.get("eager_ci95")
    if not (g and e and _finite(*g, *e)):
        return f", not resolved: {replay['runs']} pairs give no 95% interval (it needs {MIN_CI_SAMPLES})"
    return "" if advice.replay_resolved(replay) else ", not resolved: the two 95% intervals overlap"


def _marks_add_status(lo: float, hi: float) -> str:
    """What the other marks add to a stage is a cost: resolved only where its interval lies above zero. Wholly
    below zero is outside what marks can do, and said so rather than called an interval that reaches zero."""
    if lo > 0:
        return ""
    if hi < 0:
        return ", below zero (marks only add work): not resolved"
    return ", not resolved"


def _one_mark_section(trace: dict) -> Section | None:
    """Each stage's time from runs with no other stage mark (app.runtime.one_mark), beside its time with every
    stage marked in the same rounds and what the other marks add to it."""
    one = trace["timing"].get("one_mark")
    if one is None:         # traces made before this measurement
        return None
    title = "Stage times without the other stages' marks"
    if "stages" not in one:
        return Section(title, text=f"Not measured: {one['why']}.")
    rows = []
    for o in one["stages"]:
        lo, hi = o["ci95"]
        alo, ahi = o["marks_add_ci95"]
        rows.append([o["name"], us(o["marked_seconds"]),
                     us(o["seconds"]) if o["resolved"] else f"not resolved ({us(o['seconds'])})",
                     # a time is never below zero: an interval reaching there shows the runs' noise, not a time
                     f"{us(lo)} – {us(hi)}" + (" (below zero at its low end: the runs' noise)" if lo < 0 else ""),
                     # resolved as advice.py reads it: only an interval above zero says the marks cost this stage
                     f"{us(o['marks_add_seconds'])} ({us(alo)} – {us(ahi)})" + _marks_add_status(alo, ahi)])
    ins = trace["timing"]["instrumentation"]          # the pairs the one-mark runs ran beside
    paired = ins["overhead_fraction"] * ins["bare_median_seconds"]
    rows.append(["whole plan", us(one["marked_median_seconds"]),
                 f"{us(one['bare_median_seconds'])} bare (the stages above add up to {us(one['stage_sum_seconds'])})",
                 "", f"{us(paired)} (the instrumentation overhead, in Timing)"])
    return Section(title, columns=["Stage", "Every stage marked (us)", "One mark a run (us)", "95% interval (us)",
                                   "The other marks add (us, 95% interval)"], rows=rows,
                   note="A stage mark's cost lands after it, so in a run marked at every stage boundary (the timed "
                        "runs) each stage carries the cost of the mark that starts it. Every round of the "
                        "instrumentation overhead's pairs -- a bare run and a run marked at every boundary -- also "
                        "ran the plan once with a single stage mark at the end of each stage but the last, in a "
                        f"shuffled order ({one['rounds']} rounds). In each round a stage's time is the time to the "
                        "mark after it minus the time to the mark before it, each from its own run; the figure is "
                        "the median over the rounds. These times carry no other mark's cost, but each has the spread "
                        "of the plan up to it, from both of its runs; their intervals come from more rounds than the "
                        "timed runs, so they can be narrower or wider than the Duration's. \"Every stage "
                        "marked\" is the median of the same rounds' marked runs, so the last column compares like "
                        "with like: the median of the rounds' differences. Not resolved: the figure's interval reaches "
                        "zero (or there are too few rounds for one), or lies wholly below it, which marks cannot "
                        "cause (they only add work: the stage's two runs differed by more than its time, most "
                        "likely), and no conclusion is drawn from it. In the whole plan's row the first two figures "
                        "are each side's own median and the last is the median of the rounds' differences: on a "
                        "noisy machine the two medians can even fall the other way round, while the paired "
                        "difference, taken from runs side by side, is the steadier measure of what the marks cost."
                        + _marks_add_sum_note(one, ins))


def _marks_add_sum_note(one: dict, ins: dict) -> str:
    """Where the stages' resolved figures add up to more than the whole plan's paired overhead can be (its 95%
    interval's top), a sentence saying so: each figure is the median of its own differences, and they need not add
    up (the default join on an H200: bounds 4.3, morton_sort 5.1 and output_sort 8.9 us, 18.3 together, against the
    plan's 8.0 us, 3.8 to 13.0)."""
    resolved = [o for o in one["stages"] if o["marks_add_ci95"][0] > 0 and o["marks_add_seconds"] > 0]
    b = ins["bare_median_seconds"]
    top = ins["overhead_ci95"][1] * b if ins.get("overhead_ci95") and ins["overhead_ci95"][1] is not None else None
    total = sum(o["marks_add_seconds"] for o in resolved)
    if top is None or total <= top:
        return ""
    return (f" The stages' resolved figures add up to {us(total)} us, more than the whole plan's "
            f"{us(ins['overhead_fraction'] * b)} us (95% interval up to {us(top)}): each is the median of that "
            "stage's own differences, which need not add up, so read each as an upper figure for its stage alone.")


def _stage_chart(roof):
    floor = ("the black diamond is the fastest the stage could run at peak DRAM bandwidth moving only the "
             "cost model's bytes, so the gap from diamond to bar end is the headroom."
             if roof.get("available") else f"no memory-roof floor is drawn: {roof.get('why')}.")
    return Section("Stage chart",
                   text="![Time per stage: device vs host issue, with the memory-roof floor](stage_chart.png)\n\n"
                        "How to read it: the thick bar is the stage's measured time (median of timed runs), the thin "
                        "dark bar over it the time the host spent in the stage: issuing its work, and in a stage the "
                        "Stages table marks \"(waits)\" mostly waiting for a read from the device, which waits for "
                        "all the work queued before it. The two overlap in time and do not add, and the thin bar can "
                        "be the longer. On the GPU, in a stage that does not wait, a thin bar as long as the thick one "
                        "means its launches may set its time, or its kernels take about as long (nsys mode tells them "
                        "apart); " + floor)


def _rows_and_meta(trace):
    skip = {"h2d_copies", "h2d_bytes", "d2h_copies", "d2h_bytes", "syncs", "allocation_size_reads",
            "result_size_reads", "theoretical_occupancy_pct"}
    rows = []
    for s in trace["stages"]:
        meta = ", ".join(f"{k}={fmt(v) if not isinstance(v, list) else '; '.join(v)}"
                         for k, v in s["metadata"].items() if k not in skip)
        rows.append([s["name"], s["category"], s["device"], fmt(s["rows_in"]), fmt(s["rows_out"]), meta or "-"])
    return Section("Rows and stage metadata", columns=["Stage", "Category", "Device", "Rows in", "Rows out",
                                                       "Metadata"], rows=rows)


def _cold(trace):
    c = trace["cold"]
    rows = [["compile / JIT, or a load from CuPy's kernel cache when it is warm (s)", fmt(c["compile_seconds"], 4)],
            ["first run total (us)", us(c["total_seconds"])],
            ["first-run overhead over warm median (us)", us(c["first_run_overhead_seconds"])]]
    rows += [[f"first run: {s['name']} (us)", us(s["cold_seconds"])] for s in trace["stages"]]
    return Section("Cold start (not in the warm figures)", columns=["what", "value"], rows=rows)


def _pairs_stop(ins: dict) -> str:
    """Why the overhead pairs stopped where they did (traces before this rule carry none)."""
    stop = ins.get("stopped")
    if stop == "interval":
        return f"; stopped once the interval was within +-{100 * ins['target_ci']:.1f}%"
    if stop == "budget":
        return "; stopped by the time budget" + (f", short of the +-{100 * ins['target_ci']:.1f}% interval aimed at"
                                                 if ins.get("target_ci") else "")
    if stop == "max_pairs":
        return f"; stopped at the most pairs allowed, short of the +-{100 * ins['target_ci']:.1f}% interval aimed at"
    return ""


def _end_to_end(e2e: dict) -> str:
    """The end-to-end row: the median, its interval, and -- from traces that have it -- the bare plan of the same
    runs, so a reader sees what the copy back and the host's calls around the GPU's work add."""
    ci = e2e.get("median_ci95")
    text = us(e2e["median"]) + (f", 95% interval {us(ci[0])} – {us(ci[1])}" if ci else "")
    if e2e.get("bare_median_seconds") is not None:
        text += f"; the bare plan of the same runs {us(e2e['bare_median_seconds'])}"
    return f"{text} (median of {e2e['runs']} runs: {e2e['how']})"


def _staging_dma(dma: dict | None, runtime: str) -> str:
    if not dma and runtime != "gpu":
        return "n/a (a CPU run: no host->device copy)"
    if not dma:
        return ("not measured: the last run staged nothing (inputs under the staging threshold take the pageable "
                "copy, and inputs already in pinned memory go straight to the device)")
    return (f"{us(dma['seconds'])} for {dma['bytes'] / 1e6:.1f} MB ({fmt(dma['gbps'], 1, ' GB/s')}; median of "
            f"{dma['runs']}: {dma['how']})")


def _warmup_text(warm: dict | None) -> str:
    """Why the warm-up stopped where it did (traces made before --warmup auto carry nothing to say)."""
    if not warm or warm.get("rule") in (None, "count"):
        return ""
    change = f"{100 * warm['last_change']:+.1f}%" if "last_change" in warm else "n/a"
    least = f" and at least {warm['min_seconds']:.1f} s" if warm.get("min_seconds") else ""
    why = {"steady": f"until steady{least}: the last {warm['window']} runs' median within "
                     f"±{100 * warm['steady_within']:.0f}% of the {warm['window']} before ({change})",
           "budget": f"stopped by its {warm.get('budget_seconds', 0):.0f} s budget, not yet steady ({change})",
           "max_runs": f"stopped at {warm.get('max_runs')} runs, not yet steady ({change})"}[warm["rule"]]
    return f" ({why}; {warm['seconds']:.2f} s)"


def _repeated_text(r: dict) -> str:
    """timing.repeated_later in words: the same runs at two points of the profile, and what follows if they differ."""
    (a, b), (c, d) = r["later_ci95"], r["timed_ci95"]
    level = (f"{us(r['later_median'])} (95% interval {us(a)} – {us(b)}) against the timed runs' "
             f"{us(r['timed_median'])} ({us(c)} – {us(d)}), {100 * r['change']:+.1f}%")
    if not _finite(a, b, c, d):
        return f"{level}: a side has too few runs for a 95% interval, so the two levels are not compared"
    if not r["apart"]:
        # Overlap resolves no change; it does not show there was none (a later batch of 10 pairs can be wide).
        return f"{level}: their intervals overlap, so no change between the two batches is resolved"
    return (f"{level}: their intervals do not overlap, so the same runs read differently a few seconds later (the "
            "machine's pace moving is the likely cause). "
            "The overhead pairs' figures (the bare plan, end to end, the stage times without the other marks) and "
            "the graph pairs' come from other batches than the timed runs: compare figures only within one batch")
