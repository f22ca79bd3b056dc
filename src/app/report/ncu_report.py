"""report.md for annotation and ncu modes: the seed-004 contract with measured NCU metrics."""
from __future__ import annotations

from app.analysis.kernel_metrics import (DURATION, L2_JUDGE_MIN_BYTES, LOCALITY_MIN_EXCESS, UNDERFILL_MIN_SHARE,
                                        barrier_bound, kernel_time, kernel_time_text, poor_locality, underfill_share,
                                        underfilled)
from app.report.clock_text import clock_cell, throttle_note
from app.report.markdown import Section, fmt, fmt_pct, fmt_reading, render
from app.report.sections import with_verification_headline


GAIN_NOTE = ("Gain = the stage's share of kernel time x an estimate of the part it could recover: "
             "(1 - max(SM%, DRAM%)/100) when latency-bound, the share of block slots left empty when that is "
             f"{UNDERFILL_MIN_SHARE:.0%} or more, 0.5 for occupancy < 25%, 0.3 for a locality issue (see the Kernels "
             "table's note) or spills. Rough, measured inputs; rank, do not promise.")
RULE_NOTE = "Gain = NCU's estimated speedup for the rule x the kernel's share of the iteration's kernel time."


def stage_sections(trace: dict, stages, kernels, ops: list[dict], spec, clock: str,
                   gain_note: str = GAIN_NOTE) -> list[Section]:
    total = kernel_time(stages)
    by_time = stages[stages["kernels"] > 0].sort_values("duration_us", ascending=False)
    if len(by_time) and total != total:
        # Which stage takes the most time is unknown while one's time is: no bottleneck is named.
        bottleneck = "n/a"
        cause = f"Not judged: {kernel_time_text(stages)}; the stages' shares of the time are unknown."
    elif len(by_time):
        top = by_time.iloc[0]
        # The whole class, "+ locality" included: trace.json's summary.bottleneck is this same stage's class.
        bottleneck = top["bottleneck"][:1].upper() + top["bottleneck"][1:] if "-bound" in top["bottleneck"] \
            else top["bottleneck"]
        cause = (f"{top['stage']} takes {100 * top['duration_us'] / total:.0f}% of the kernel time at SM "
                 f"{_pct(top['sm_pct'])} and DRAM {_pct(top['dram_pct'])} of peak "
                 f"(achieved occupancy {_pct(top['achieved_occupancy_pct'])}, L2 hit {_pct(top['l2_hit_pct'])}).")
        waits = barrier_bound(kernels, top["stage"])
        if waits is not None:
            cause += " " + _barrier_cause(waits)
    else:
        bottleneck, cause = "n/a", "No stage kernels were profiled."
    rows = []
    for r in stages.itertuples():
        issue = []
        # Only where the Kernels table's note calls it a locality issue: a low hit rate alone proves nothing.
        if r.kernels and poor_locality(r):
            culprit = _culprit(kernels, r.stage, r.locality_excess)
            issue.append(f"L2 hit {r.l2_hit_pct:.0f}% ({culprit} moved {r.locality_excess:.2f}x the stage's "
                         "modelled bytes)")
        if r.kernels and r.local_spill_bytes > 0:
            # ncu counts the bytes local loads and stores moved (l1tex__t_bytes_pipe_lsu_mem_local_op_ld/st): the
            # traffic of spills and of local arrays, not the size of what spilled.
            issue.append(f"{r.local_spill_bytes:,.0f} B of local-memory traffic (spills or local arrays)")
        waits = barrier_bound(kernels, r.stage) if r.kernels else None
        if waits is not None:
            issue.insert(0, _barrier_issue(waits))
        if underfilled(r):
            empty = f"{100 * underfill_share(r):.0f}% of block slots empty"
            # A stage's waves/SM is its largest grid's: with several kernels the empty share is over all their time.
            issue.append(f"{r.waves_per_sm:.2f} waves/SM ({empty})" if r.kernels == 1 else
                         f"{empty} over its kernels' time (largest grid {r.waves_per_sm:.2f} waves/SM)")
        # A stage that launched no kernel (the build's copies) has no time ncu could take: not a time of zero.
        duration = fmt(r.duration_us) if r.kernels or r.unprofiled else "- (no kernels: ncu times kernels only)"
        rows.append([r.stage, duration, fmt_pct(r.sm_pct), fmt_pct(r.dram_pct),
                     fmt_pct(r.achieved_occupancy_pct), r.bottleneck, "; ".join(issue) or "-"])
    outside = trace["metadata"]["kernels_outside_stages"]
    return [
        Section("Configuration", columns=list(trace["metadata"]["params"]) + ["device", "clocks"],
                rows=[[fmt(v) for v in trace["metadata"]["params"].values()] + [trace["device"]["name"], (
                    f"{clock_cell(trace['metadata']['clocks'])}; {clock}" if "clocks" in trace["metadata"]
                    else clock)]],
                note=throttle_note(trace["metadata"].get("clocks")) or None),
        Section("Stages", columns=["Stage", "Duration (us)", "TC%", "DRAM%", "Occ%", "Bottleneck", "Key Issue"],
                rows=[[r[0], r[1], r[2] + " (SM%)", *r[3:]] for r in rows],
                note="Duration = summed GPU time of the stage's kernels in one warm iteration (ncu). These "
                     "kernels use no tensor cores: the TC% column shows SM% (sm__throughput) instead. "
                     f"Kernels outside any stage range: {outside}.{_rates_text(trace.get('summary'))}"),
        Section(text=f"**Bottleneck:** {bottleneck}\n\n**Root cause:** {cause}"),
        Section("Top 3 Opportunities (ranked by estimated impact)",
                items=[f"{o['name']} — {_gain(o)} — trigger: {o['trigger']}" for o in ops[:3]]
                or ["none triggered"], note=gain_note),
        Section("Kernels", columns=["Stage", "Kernel", "us", "GB/s", "TFLOP/s fp64", "FLOP/B", "% roofline",
                                    "SM%", "DRAM%", "Occ%", "L2 hit%", "regs", "waves/SM", "Bottleneck"],
                rows=[[k.stage or "-", k.kernel[:40], fmt(k.duration_us), fmt(k.achieved_gbps),
                       fmt_reading(k.achieved_tflops_fp64, 4), fmt_pct(k.arithmetic_intensity),
                       fmt_pct(k.pct_of_roofline), fmt_pct(k.sm_pct), fmt_pct(k.dram_pct),
                       fmt_pct(k.achieved_occupancy_pct), _l2(k), fmt(k.registers, 0), fmt_pct(k.waves_per_sm),
                       k.bottleneck] for k in kernels.itertuples()],
                note=f"L2 hit% marked * was measured on under {L2_JUDGE_MIN_BYTES // 1024} KiB of DRAM traffic: there "
                     "the rate reflects ncu's replay more than the kernel (the two counter modes disagree by up to "
                     "~40 points on such kernels), so no locality class or advice is drawn from it, and a stage's "
                     "L2 hit% is over its other kernels only. ncu empties the caches before each kernel it profiles "
                     "(--cache-control all, its default, which this tool keeps): every kernel misses L2 at each "
                     "first touch however its accesses are ordered, and the kernels of one stage each read the "
                     "inputs they share from DRAM again. A hit rate under 80% is therefore a locality issue "
                     f"(\"+ locality\") only where one kernel on its own moves more than {LOCALITY_MIN_EXCESS}x its "
                     "stage's cost-model DRAM bytes (\"largest kernel / model\" in the measured-vs-model table "
                     "below): data it fetched twice. "
                     "Where that is unknown, no locality class is drawn. GB/s, FLOP/B and % roofline use the DRAM "
                     "bytes ncu counted while the kernel ran, which leave out most of its writes (see the note "
                     "under the measured-vs-model table)."),
        _listing("Flagged values (impossible readings, used for no conclusion)", "What was read", kernels, "flags"),
        _listing("Missing readings (shown as n/a, used for no conclusion)", "ncu metrics missing or unreadable",
                 kernels, "missing"),
        Section("DRAM bytes and FLOPs: measured vs cost model",
                columns=["Stage", "measured MB (ncu)", "cost-model MB", "bytes: measured / model",
                         "bytes: largest kernel / model", "measured MFLOP fp64 (ncu)", "cost-model MFLOP",
                         "FLOPs: measured / model"],
                rows=[_bytes_row(s) + _flops_row(s) for s in trace["stages"]],
                note="The cost model counts each byte a stage reads or writes once; host->device copies are not "
                     "DRAM kernel traffic. ncu empties the caches before each kernel, so every kernel reads its "
                     "inputs from DRAM, and a stage of several kernels reads the inputs they share once per kernel "
                     "(over 1 without any kernel fetching twice). A kernel's writes stay in L2 until after ncu "
                     f"stops counting: {_writes_text(kernels)}. The model counts writes too, so a ratio under 1 "
                     "can be its writes, or reads it charges that the kernels do not make (overlay's refine: 64 B "
                     "of segments a candidate pair); and with the model's writes in its denominator the locality "
                     "test (a kernel over 1.25x the model) errs toward finding no issue. "
                     "Its FLOPs are the operations it "
                     "models (orientation filters, shoelace terms); ncu counts every fp64 add, multiply and fused "
                     "multiply-add (as two) the kernels ran, exact fallbacks and other arithmetic included, so a "
                     "ratio far from 1 says the event mode's roofline places that stage by a wrong operation "
                     "count."),
    ]


def _barrier_where(k) -> str | None:
    """The source line holding most of the kernel's barrier samples, with those samples' share of all the kernel's
    warp samples (ncu mode's hot-spot reader sets them), e.g. "69% on app/kernel/join/join_fused.cu:29"; None where
    unknown."""
    line, share = k.get("barrier_line"), k.get("barrier_line_pct", float("nan"))
    return f"{share:.0f}% on {line}" if isinstance(line, str) and line and share == share else None


def _barrier_issue(k) -> str:
    where = _barrier_where(k)
    return (f"{k['kernel']}: {k['barrier_stall_pct']:.0f}% of warp samples waiting at a barrier"
            + (f" ({where})" if where else ""))


def _barrier_cause(k) -> str:
    """The root cause's sentence for a stage whose kernel was sampled mostly at barriers (barrier_bound): over half
    its warps' time goes to waiting there, whatever its SM% and DRAM% say."""
    samples = k["warp_samples"]
    text = (f"Its kernel {k['kernel']} spent {k['barrier_stall_pct']:.1f}% of its warp samples "
            f"({round(k['barrier_stall_pct'] * samples / 100):,.0f} of {samples:,.0f}) waiting at a barrier")
    where = _barrier_where(k)
    if where:
        text += f" ({where})"
    cpi, waits = k.get("cycles_per_issue", float("nan")), k.get("barrier_cycles_per_issue", float("nan"))
    if cpi == cpi and waits == waits and 0 <= waits <= cpi:
        text += (f"; ncu counts {waits:.1f} of the {cpi:.1f} cycles a warp takes per issued instruction as waits "
                 "at a barrier")
    return text + ": its time goes to barrier waits, not to SM or DRAM throughput."


def _rates_text(summary: dict | None) -> str:
    """The iteration's rates as trace.json's summary stores them, each named by what it counts."""
    if not summary or summary.get("duration_us") is None:
        return ""
    parts = []
    if summary.get("achieved_tflops") is not None:
        split = [f"{p} {fmt_reading(summary[f'achieved_tflops_{p}'], 4)}" for p in ("fp64", "fp32")
                 if summary.get(f"achieved_tflops_{p}") is not None]
        parts.append(f"{fmt_reading(summary['achieved_tflops'], 4)} TFLOP/s counting fp64 and fp32 operations "
                     "together" + (f" ({', '.join(split)})" if split else ""))
    if summary.get("achieved_gbps") is not None:
        parts.append(f"{fmt(summary['achieved_gbps'])} GB/s of DRAM traffic")
    return f" Over the stage kernels' summed time: {'; '.join(parts)}." if parts else ""


def _pct(v) -> str:
    """A percentage for a sentence: "n/a", never "n/a%", where the reading is missing or flagged."""
    text = fmt_pct(v)
    return text if text == "n/a" else text + "%"


def _culprit(kernels, stage: str, excess: float) -> str:
    """The kernel of ``stage`` whose own DRAM bytes are ``excess`` times the stage's model (a stage's
    locality_excess)."""
    k = kernels[(kernels["stage"] == stage) & (kernels["kernel_dram_vs_model"] == excess)]
    return k["kernel"].iloc[0] if len(k) else "one kernel"


def _writes_text(kernels) -> str:
    """How much of the measured DRAM traffic ncu counted as writes, over the kernels with both readings."""
    known = kernels[kernels["dram_bytes"].notna() & kernels["dram_write_bytes"].notna()] \
        if "dram_write_bytes" in kernels else kernels.iloc[:0]
    total = float(known["dram_bytes"].sum()) if len(known) else 0.0
    if not total > 0:
        return "how much of the measured traffic was written is unknown here (dram__bytes_write.sum missing)"
    writes = float(known["dram_write_bytes"].sum())
    return (f"dram__bytes_write.sum counted {writes:,.0f} B of the {total / 1e6:,.2f} MB measured here "
            f"({100 * writes / total:.1f}%), the rest reads")


def _gain(op: dict) -> str:
    if op["gain_pct"] is None:
        return f"est. gain unknown ({DURATION} missing or flagged: the time it could save is unknown)"
    return f"est. {op['gain_pct']:.0f}% gain"


def _listing(title: str, what: str, kernels, col: str) -> Section:
    rows = [[k.stage or "-", k.kernel[:40], getattr(k, col)] for k in kernels.itertuples()
            if col in kernels and getattr(k, col)]
    return Section(title, columns=["Stage", "Kernel", what], rows=rows) if rows else Section(title, text="None.")


def _flops_row(stage: dict) -> list[str]:
    cost = stage.get("cost") or {}
    model = cost.get("flops") if cost.get("precision", "fp64") == "fp64" else None
    if not stage["ncu"].get("kernels") and cost.get("kind") == "host_link":
        return ["n/a (copies)", "n/a (copies)", "n/a"]
    if not stage["ncu"].get("kernels") and not stage["ncu"].get("unprofiled"):
        return ["n/a (no kernels)", f"{model / 1e6:,.3f}" if model is not None else "n/a", "n/a"]
    measured = stage["ncu"].get("fp64_flops")
    return [f"{measured / 1e6:,.3f}" if measured is not None else "n/a (fp64 instruction counts missing)",
            f"{model / 1e6:,.3f}" if model is not None else "n/a",
            f"{measured / model:.2f}" if measured is not None and model
            else "n/a (the model counts none)" if model == 0 and measured else "n/a"]


def _bytes_row(stage: dict) -> list[str]:
    measured, cost = stage["ncu"]["dram_bytes"], (stage.get("cost") or {}).get("bytes")
    if not stage["ncu"].get("kernels") and (stage.get("cost") or {}).get("kind") == "host_link":
        # the build's bytes are host->device copies, which an ncu capture (kernels only) does not measure
        return [stage["name"], "n/a (copies: ncu captures kernels only)",
                f"{cost / 1e6:,.2f}" if cost is not None else "n/a", "n/a", "n/a"]
    if not stage["ncu"].get("kernels") and not stage["ncu"].get("unprofiled"):
        return [stage["name"], "n/a (no kernels: ncu captures kernels only)",
                f"{cost / 1e6:,.2f}" if cost is not None else "n/a", "n/a", "n/a"]
    largest = stage["ncu"].get("kernel_dram_vs_model")
    return [stage["name"],
            f"{measured / 1e6:,.2f}" if measured is not None else "n/a (dram__bytes_read/write.sum missing)",
            f"{cost / 1e6:,.2f}" if cost is not None else "n/a",
            f"{measured / cost:.2f}" if measured is not None and cost else "n/a",
            f"{largest:.2f}" if largest is not None else "n/a"]


def _l2(k) -> str:
    value = fmt_pct(k.l2_hit_pct)
    return value if value == "n/a" or getattr(k, "l2_judged", True) else value + "*"


def render_report(trace, sections, headline) -> str:
    # a wrong or unverified output leads the report, above every counter it reads
    return render(trace["kernel"], trace["version"], with_verification_headline(trace, headline), sections)
