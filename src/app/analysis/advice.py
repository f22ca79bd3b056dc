"""Bottleneck class per stage and ranked opportunities, each naming the metric that triggered it.

Rules follow seed 004's Metric Interpretation and Bottleneck Classification
tables. In event mode the DRAM% and FLOP% are the cost model's traffic and operations
over the measured time (no counters); annotation mode replaces them with
measured values through the same functions.
"""
from __future__ import annotations

import math

from app.runtime.recorder import mid_plan_reads
from app.runtime.stats import MIN_CI_SAMPLES, intervals_apart, outlier_runs, robust_of

MEMORY_BOUND_PCT = 60.0      # "DRAM% high"
COMPUTE_BOUND_PCT = 60.0     # "TC%/SM% high"
ATTAINABLE = 0.7             # fraction of a roof a well-tuned kernel reaches: basis of gain estimates
UNCOVERED_PCT = 5.0
H2D_SHARE_PCT = 30.0
# A GPU stage whose host time (issuing its work, no wait for a read) is about its time, between these shares of
# it: the host issued it about as slowly as it ran, so its launches may have set its time (the stage chart's thin
# bar as long as the thick one) -- or its kernels took about as long: event mode cannot tell, nsys mode can. A host
# time well past the stage's means the GPU was still busy with earlier work while the host issued it (the join's
# bounds behind the build's copies).
HOST_PACED = (0.8, 1.25)


def two_digits(v: float) -> str:
    """``v`` to two significant digits, trailing zeros kept: 0.998 reads "1.0", as a table's one decimal gives it,
    not "1", and 0.499 "0.50", not "0.5"."""
    return f"{v:#.2g}".rstrip(".")      # '#' keeps a trailing zero: 0.2018 reads "0.20", not "0.2"; 12.4 "12"


def pct(value: float) -> str:
    """A percentage of peak to one decimal; under 1 to two significant digits, so a small reading is neither printed
    as zero (area_reconstruction's DRAM 0.047%) nor rounded to nearly twice itself (0.054% as 0.1%)."""
    return f"{value:.1f}" if value == 0 or abs(value) >= 1 else two_digits(value)


def classify(dram_pct: float | None, compute_pct: float | None) -> str:
    if dram_pct is None:
        return "n/a"
    if dram_pct >= MEMORY_BOUND_PCT and (compute_pct or 0) < COMPUTE_BOUND_PCT:
        return "memory-bound"
    if (compute_pct or 0) >= COMPUTE_BOUND_PCT:
        return "compute-bound"
    return "latency-bound"


def stage_findings(trace: dict, roof: dict) -> list[dict]:
    """Per stage: bottleneck class and its key issue, in plan order."""
    total = trace["total_elapsed_seconds"] or 1e-30
    marks_add = _marks_add(trace)
    out = []
    for s in trace["stages"]:
        point = roof.get("stages", {}).get(s["name"]) if roof.get("available") else None
        dram = point["dram_pct"] if point else None
        flop = point["flop_pct"] if point else None
        m = s["metadata"]
        if s["cost"]["kind"] == "host_link":
            where = "host->device" if s["device"] == "gpu" else "host copy"
            # the bytes the build copied (the transfers table's), where it copied any; else the plan's own bytes
            copied = m.get("h2d_bytes") if s["device"] == "gpu" and m.get("h2d_bytes") else None
            bneck, issue = "transfer", f"{(copied or m.get('owned_bytes', 0)) / 1e6:.1f} MB {where}"
        elif point and point["flags"]:
            bneck, issue = "n/a (flagged)", "flagged: " + "; ".join(point["flags"])
        else:
            bneck = classify(dram, flop)
            issues = []
            mid = mid_plan_reads(m)
            if mid:
                issues.append(f"{mid} host sync(s) for allocation sizes")
            if m.get("result_size_reads") and m.get("syncs"):
                issues.append("its time holds the result-length read's wait (a host round trip after all queued "
                              "work)")
            paced = host_paced(trace, s)
            if paced:
                issues.append(f"issued by the host in {paced[0] * 1e6:,.1f} of its {paced[1] * 1e6:,.1f} us: its "
                              "launches may set its time (nsys mode shows whether the GPU waited)")
            if dram is not None and bneck == "latency-bound":
                issues.append(f"DRAM {pct(dram)}% of peak")
            if s["spread"].get("stable") is False and s["spread"]["runs"] >= MIN_CI_SAMPLES:    # None: too few runs
                issues.append(f"unstable (±{100 * robust_of(s['spread']):.1f}% robust spread"
                              + (f", {outlier_runs(s['spread']['outliers'])})"
                                 if s["spread"].get("outliers") is not None else ")"))
            if s["name"] in marks_add:
                issues.append(marks_add[s["name"]])
            issue = "; ".join(issues) or "-"
        out.append({"stage": s["name"], "share_pct": 100 * s["elapsed_seconds"] / total,
                    "dram_pct": dram, "flop_pct": flop, "bottleneck": bneck, "key_issue": issue})
    return out


def _issue_share(trace: dict, stage: dict) -> float | None:
    """An event-mode GPU stage's host time issuing its work over its time, where it read nothing from the device
    (a read's wait is not issue time); None elsewhere, or where either time is missing."""
    host, took = stage.get("host_seconds"), stage["elapsed_seconds"]
    if (trace.get("mode") != "event" or stage.get("device") != "gpu" or not host or not took
            or stage["metadata"].get("syncs")):
        return None
    return host / took


def host_paced(trace: dict, stage: dict) -> tuple[float, float] | None:
    """(host seconds, stage seconds) of an event-mode GPU stage the host may have paced: its issue share is within
    HOST_PACED. Event mode sees no GPU idle time, so whether the launches or the kernels set the time stays open;
    nsys mode measures it."""
    share = _issue_share(trace, stage)
    low, high = HOST_PACED
    return (stage["host_seconds"], stage["elapsed_seconds"]) if share is not None and low <= share <= high else None


def _issued_early(trace: dict, stage: dict) -> bool:
    """Whether the host issued the stage's work in under the low end of HOST_PACED of its time: every launch was
    queued well before the stage ended."""
    share = _issue_share(trace, stage)
    return share is not None and share < HOST_PACED[0]


MARKS_ADD_SHARE = 0.10     # the other stage marks' share of a stage's time from which its Key Issue names it


def _marks_add(trace: dict) -> dict[str, str]:
    """Stages whose time with every stage marked the other marks measurably inflate by MARKS_ADD_SHARE or more of
    it: a Key Issue, since the stage's DRAM% is computed from that inflated time."""
    out, resolved = {}, _marks_added(trace)
    for o in (trace.get("timing", {}).get("one_mark") or {}).get("stages", []):
        add, marked = o["marks_add_seconds"], o["marked_seconds"]
        if o["name"] in resolved and marked > 0 and add >= MARKS_ADD_SHARE * marked:
            # Its share of the same runs' time (the paired runs with every stage marked), not of the Duration
            # column, which comes from the timed runs.
            out[o["name"]] = (f"the other stages' marks add {add * 1e6:.1f} us to its time ({100 * add / marked:.0f}% "
                              f"of its {marked * 1e6:,.1f} us in the runs that measured them)")
    return out


def _marks_added(trace: dict) -> dict[str, float]:
    """Seconds the other stage marks measurably add to each stage's time (timing.one_mark: the interval of what they
    add is above zero), by stage; a stage whose interval reaches zero is left out, as nothing is concluded from it."""
    return {o["name"]: o["marks_add_seconds"]
            for o in (trace.get("timing", {}).get("one_mark") or {}).get("stages", [])
            if o["marks_add_ci95"][0] > 0 and o["marks_add_seconds"] > 0}


def opportunities(trace: dict, roof: dict, findings: list[dict]) -> list[dict]:
    """All triggered opportunities, ranked by estimated gain (% of the plan's time)."""
    total = trace["total_elapsed_seconds"] or 1e-30
    ops = []
    by_name = {s["name"]: s for s in trace["stages"]}
    marks = _marks_added(trace)
    for f in findings:
        s = by_name[f["stage"]]
        if f["bottleneck"] == "transfer" and f["share_pct"] >= H2D_SHARE_PCT:
            # Inputs already staged through pinned memory: what is left is to hide the copies or skip them.
            # Inputs the backend copied pageable because they are small were measured slower through pinned
            # staging: advising it would contradict that measurement.
            staging = str(s["metadata"].get("staging", ""))
            if "straight from the caller's pinned memory" in staging:
                what = "Keep inputs device-resident across calls (they already go straight from pinned memory)"
            elif staging.startswith("pinned"):
                what = _staged_build_advice(trace, s, total)
            elif staging.startswith("pageable"):     # the backend's choice for inputs under its staging threshold
                what = "Keep inputs device-resident across calls (pinned staging measured slower at this size)"
            else:
                what = "Keep inputs device-resident across calls, or copy from pinned memory"
            link = _dma_alone(trace, s)
            ops.append({"name": f"{what} ({f['stage']})",
                        "gain_pct": f["share_pct"],
                        "trigger": f"h2d_share={f['share_pct']:.0f}%, h2d_gbps={_gbps(s):.1f}"
                                   + (f", dma_alone_gbps={link[0]:.1f}" if link else "")})
            continue
        point = roof.get("stages", {}).get(f["stage"]) if roof.get("available") else None
        if not point or point["flags"]:
            continue
        target = point["roofline_seconds"] / ATTAINABLE
        # The profiler's own marks are not the code's time: a gain that counted them would promise what no change
        # to the stage can give (join v4's bounds on an H200: 40.3 us marked, of which the other marks added 13.0).
        marked_cost = marks.get(f["stage"], 0.0)
        saved = s["elapsed_seconds"] - marked_cost - target
        if saved <= 0:
            continue
        reads = mid_plan_reads(s["metadata"])
        if f["bottleneck"] == "latency-bound" and reads:
            name = f"Remove host round-trips in {f['stage']} (fuse count+emit, upper-bound allocations)"
            trigger = f"allocation_size_reads={reads}, dram_pct={pct(point['dram_pct'])}"
        elif f["bottleneck"] == "latency-bound" and s["metadata"].get("result_size_reads"):
            # The result's length is read in this stage: the read waits for all the work queued before it and the
            # stage's end is marked after it returns, so its time is mostly that round trip (the join's output_sort:
            # 93.6 us with 10-14 us of kernels). Bigger launches would not shorten it, and the plan needs the length
            # to hand back its result: no opportunity, the Key Issue says what the time is.
            continue
        elif f["bottleneck"] == "latency-bound" and host_paced(trace, s):
            # Issued about as slowly as it ran: either the GPU waited for the launches (a faster kernel would end
            # no sooner) or the kernels took about as long (the default join's filter: 14.6 us of kernel in a 17.1
            # us stage issued in 14.8). Event mode sees no GPU idle time, so the advice names both and how to tell.
            host, took = host_paced(trace, s)
            kernels = s["metadata"].get("kernels_launched", ())
            what = (f"its one kernel, {kernels[0]}," if len(kernels) == 1 else
                    f"its {len(kernels)} kernels," if kernels else "it,")
            name = (f"Find whether the launches or the kernels set {f['stage']}'s time (the host took "
                    f"{host * 1e6:,.1f} us to issue {what} about the stage's {took * 1e6:,.1f} us; nsys mode shows "
                    "whether the GPU waited: if it did, fewer or cheaper launches, or the plan replayed as a CUDA "
                    "graph; if not, more independent work per thread)")
            trigger = f"host_us={host * 1e6:.1f}, stage_us={took * 1e6:.1f}, dram_pct={pct(point['dram_pct'])}"
        elif (f["bottleneck"] == "latency-bound" and len(s["metadata"].get("kernels_launched", ())) > 1
              and _issued_early(trace, s)):
            # The host had issued every launch well before the stage's end: the GPU, not the launches, most likely
            # set its time (overlay v4's filter: two kernels issued in 51.4 of its 115.8 us), so fusing them would
            # save little.
            host, took = s["host_seconds"], s["elapsed_seconds"]
            name = (f"Hide latency in {f['stage']}'s kernels (the host issued its "
                    f"{len(s['metadata']['kernels_launched'])} kernels in {host * 1e6:,.1f} of its {took * 1e6:,.1f} "
                    "us, so the GPU, not the launches, most likely set its time: more independent work per thread, "
                    "fewer dependent loads)")
            trigger = f"host_us={host * 1e6:.1f}, stage_us={took * 1e6:.1f}, dram_pct={pct(point['dram_pct'])}"
        elif f["bottleneck"] == "latency-bound" and len(s["metadata"].get("kernels_launched", ())) == 1:
            # One kernel: nothing to fuse, and its grid may fill the GPU (the default join's filter: 1,250 blocks,
            # about two waves): the time is its own dependent steps.
            name = (f"Hide latency in {f['stage']} (its one kernel, {s['metadata']['kernels_launched'][0]}: more "
                    "independent work per thread, fewer dependent loads)")
            trigger = f"dram_pct={pct(point['dram_pct'])}"
        elif f["bottleneck"] == "latency-bound":
            # What the time is spent on event mode cannot tell (no counters): launches, host round trips or the
            # kernels' own dependent steps; fewer, larger launches help the first two.
            name = f"Fuse or enlarge the launches of {f['stage']} (latency-bound: little of the memory or arithmetic " \
                   "peaks in use)"
            trigger = f"dram_pct={pct(point['dram_pct'])}"
        elif f["bottleneck"] == "compute-bound":
            name = f"Cut the arithmetic of {f['stage']} (fewer or cheaper operations per element)"
            trigger = f"flop_pct={pct(point['flop_pct'])}"
        else:
            name = f"Cut bytes moved in {f['stage']} (narrower types, fewer passes)"
            trigger = f"dram_pct={pct(point['dram_pct'])}"
        if marked_cost:
            trigger += f", the other marks' {marked_cost * 1e6:.1f} us left out"
        ops.append({"name": name, "gain_pct": 100 * saved / total, "trigger": trigger})
    graph = _graph_replay(trace, total)
    if graph:
        ops.append(graph)
    unc = trace["timing"]["uncovered_fraction"] * 100
    if unc >= UNCOVERED_PCT:
        ops.append({"name": "Find the work between stages (untimed host code or idle GPU)",
                    "gain_pct": unc, "trigger": f"uncovered={unc:.1f}%"})
    if trace["selected_runtime"] == "cpu":
        # Also where this machine has a usable GPU and the run was kept off it (--device cpu, or a GPU build that
        # failed under --device auto): the reason says which, and what to change.
        planner, reason = trace["metadata"]["planner_selected_runtime"], trace["metadata"]["selection_reason"]
        name = ("Profile on a GPU: this run used the numpy path" if planner == "cpu" else
                "Profile on this machine's GPU: this run used the numpy path")
        ops.append({"name": name, "gain_pct": None,
                    "trigger": f"selected_runtime=cpu, planner_selected_runtime={planner}, reason={reason!r}"})
    return sorted(ops, key=lambda o: -(o["gain_pct"] or 0.0))


def replay_resolved(replay: dict) -> bool:
    """Whether a graph replay's median and its interleaved eager runs' are told apart: both 95% intervals there,
    finite, and not overlapping."""
    g, e = replay.get("graph_ci95"), replay.get("eager_ci95")
    return bool(g and e and all(v is not None and math.isfinite(v) for v in (*g, *e)) and intervals_apart(g, e))


def _graph_replay(trace: dict, total: float) -> dict | None:
    """The stages after the build replayed as one CUDA graph, where the profile measured the replay (--graph)
    interleaved with eager runs and told the two apart, and the graph serves new data (no size read before the
    result's): one host call for all their launches, so what it saves is the host's issue time the GPU waited for.
    The gain is that measured difference as a share of the plan. No replay measured, or none resolved, no
    opportunity: the host's issue time beside the GPU's cannot tell a launch-paced stage from a GPU-bound one the
    host issued while the GPU was still busy (join v4 at 1M x 100k on H200 nodes: issued in 243 us, run in 293 us in
    a profile, and replayed 1.13x faster than eager in a benchmark)."""
    graph = (trace.get("timing") or {}).get("graph") or {}
    replay = graph.get("replay") or {}
    if not (replay.get("replayed") and graph.get("after_build")):    # a graph with taped size reads serves no new data
        return None
    g, e = replay["graph_after_build_seconds"], replay["eager_after_build_seconds"]
    if not replay_resolved(replay) or not 0 < g < e:
        return None
    return {"name": f"Replay the stages after the build as one CUDA graph for each new batch of the same counts "
                    f"(measured here: {g * 1e6:,.1f} against {e * 1e6:,.1f} us eager, interleaved): one host call "
                    "for all their launches",
            "gain_pct": 100 * (e - g) / total,
            "trigger": f"graph_after_build_us={g * 1e6:.1f}, eager_after_build_us={e * 1e6:.1f}"}


def _staged_build_advice(trace: dict, stage: dict, total: float) -> str:
    """A build that staged pageable inputs through pinned buffers. Keeping the inputs on the device saves all
    of it. Overlapping its copies with the stages after it can hide no more than those stages take. Inputs
    handed over in pinned memory leave the DMA alone, which the profile measured beside the build (when it
    did): the rest of the build is the host's own work, its copy into the staging buffers among it (an nsys capture
    of the join's build showed the host also quiet for about 100 us before its first DMA and after its last, which
    event mode cannot see: so no one part of it is named the cause)."""
    build = stage["elapsed_seconds"]
    after = _after_build(trace, stage)
    overlap = 100 * min(build, after) / total
    # The opportunity's gain is the whole build, which only device-resident inputs save: said in the name, so
    # the pinned estimate beside it is not read as the same figure.
    what = "Keep inputs device-resident across calls (saves the whole build)"
    link = _dma_alone(trace, stage)
    if link:
        gbps, dma = link
        what += (f", or hand them over in pinned memory (est. {100 * (build - dma) / total:.0f}%: the DMA alone "
                 f"runs at {gbps:.1f} GB/s, {dma * 1e6:,.0f} of the build's {build * 1e6:,.0f} us; the rest is the "
                 "host's own work in the build, its copy into the staging buffers among it)")
    return what + f"; overlapping the copies with the stages after them can hide at most {overlap:.0f}%"


def _after_build(trace: dict, build: dict) -> float:
    """The time of the stages after the build: the Timing table's "after the build" where the build is the only copy
    stage (the median of each run's rest, as the runs give it), not a sum of the stages' own medians, which differs
    by the runs' spread; that sum where the table has no such figure."""
    after = (trace["timing"].get("after_build") or {}).get("median") \
        if trace["timing"].get("build_stages") == [build["name"]] else None
    return after if after is not None else sum(s["elapsed_seconds"] for s in trace["stages"]
                                               if s is not build and s["cost"]["kind"] != "host_link")


def _dma_alone(trace: dict, stage: dict) -> tuple[float, float] | None:
    """(GB/s, seconds) of the staged build's bytes sent alone from pinned memory, measured after the timed runs;
    None when not measured, or when it took no less than the build that contains it: no conclusion from it."""
    dma = (trace.get("timing") or {}).get("staging_dma") or {}
    if not dma.get("gbps") or not str(stage["metadata"].get("staging", "")).startswith("pinned"):
        return None
    seconds = stage["metadata"].get("h2d_bytes", 0) / (dma["gbps"] * 1e9)
    return (dma["gbps"], seconds) if 0 < seconds < stage["elapsed_seconds"] else None


def _gbps(stage: dict) -> float:
    m = stage["metadata"]
    return m.get("h2d_bytes", 0) / stage["elapsed_seconds"] / 1e9 if stage["elapsed_seconds"] > 0 else 0.0


def overall(trace: dict, findings: list[dict], roof: dict) -> tuple[str, str]:
    """(bottleneck line, root cause in at most two sentences)."""
    device_stages = [f for f in findings if f["bottleneck"] not in ("transfer",)]
    if not device_stages:
        return "n/a", "No device stages were timed."
    top = max(device_stages, key=lambda f: f["share_pct"])
    transfer = [f for f in findings if f["bottleneck"] == "transfer"]
    # The copy is the bottleneck where it is the plan's largest stage and a share the advice acts on (H2D_SHARE_PCT):
    # overlay's 42% build beside a 20% area_reconstruction is not "latency-bound, led by area_reconstruction".
    if (transfer and trace["selected_runtime"] == "gpu" and transfer[0]["share_pct"] >= H2D_SHARE_PCT
            and transfer[0]["share_pct"] > top["share_pct"]):
        t = transfer[0]
        stage = next(s for s in trace["stages"] if s["name"] == t["stage"])
        rest = _after_build(trace, stage)
        link = _dma_alone(trace, stage)
        bound = (f"; the same bytes sent alone from its pinned staging buffers run at {link[0]:.1f} GB/s, so the "
                 "host's work in the build, not the DMA, is the bound" if link else "")
        copied = stage["metadata"].get("h2d_bytes", 0) / 1e6     # the bytes the rate beside it is of
        return ("Transfer-bound (host->device copy)",
                f"{t['stage']} copies {copied:.1f} MB at {_gbps(stage):.1f} GB/s and takes "
                f"{t['share_pct']:.0f}% of the plan{bound}. The device stages after it take {rest * 1e6:,.0f} us "
                f"together and are {top['bottleneck']}, led by {_leaders(trace, device_stages, top)}"
                f"{_launch_paced(trace)}.")
    if top["bottleneck"] == "n/a (flagged)":
        return ("unclassified (flagged values)",
                f"{top['stage']} takes {top['share_pct']:.0f}% of the plan, but its roofline figures are impossible "
                f"({top['key_issue'].removeprefix('flagged: ')}), so no bottleneck is drawn from them.")
    if top["bottleneck"] == "n/a":
        why = roof.get("why", "no roofline")
        return ("unclassified (no roofline)",
                f"{top['stage']} takes {top['share_pct']:.0f}% of the plan; without device peaks ({why}) "
                "its bottleneck cannot be classified.")
    kind = top["bottleneck"].split("-")[0].capitalize()
    tied = _tied_with(trace, device_stages, top)
    # Which stage leads is not resolved where another's time is level with it: the bottleneck named is the largest
    # one's, and the cause says the other is level.
    level = f" ({', '.join(tied)} level with it within their 95% intervals)" if tied else ""
    if top["bottleneck"] == "compute-bound":
        cause = (f"{top['stage']} takes {top['share_pct']:.0f}% of the plan{level} and runs its cost model's FLOPs at "
                 f"{pct(top['flop_pct'])}% of peak {roof.get('precision', 'fp64')} throughput (its bytes at "
                 f"{pct(top['dram_pct'])}% of peak DRAM bandwidth).")
        return f"{kind}-bound", cause
    cause = (f"{top['stage']} takes {top['share_pct']:.0f}% of the plan{level} and moves its cost model's bytes at "
             f"{pct(top['dram_pct'])}% of peak DRAM bandwidth.")
    if top["bottleneck"] == "latency-bound":
        cause += (" The GPU waits on launches, host round-trips and dependent steps rather than on "
                  "memory or arithmetic" + (f" ({top['key_issue']})" if top["key_issue"] != "-" else "")
                  + _launch_paced(trace) + ".")
    return f"{kind}-bound", cause


def _tied_with(trace: dict, device_stages: list[dict], top: dict) -> list[str]:
    """The device stages whose 95% interval of the median overlaps the largest one's: which of them leads is not
    resolved from the runs (overlay v3 on an H200: area_reconstruction 184.3 us [180.1, 204.4] against the
    filter's 182.3 [172.7, 204.2]; the one-mark runs put the filter first). None where a stage has no interval."""
    ci = {s["name"]: (s.get("spread") or {}).get("median_ci95") or [None, None] for s in trace["stages"]}
    lo, hi = ci.get(top["stage"], [None, None])
    if lo is None or hi is None:
        return []
    return [f["stage"] for f in device_stages if f is not top and None not in ci.get(f["stage"], [None])
            and ci[f["stage"]][0] <= hi and lo <= ci[f["stage"]][1]]


def _leaders(trace: dict, device_stages: list[dict], top: dict) -> str:
    tied = _tied_with(trace, device_stages, top)
    return top["stage"] + (f" and {', '.join(tied)} (level within their 95% intervals)" if tied else "")


def _launch_paced(trace: dict) -> str:
    """A clause for the root cause where a GPU plan's runs followed the host's launch pace (their totals rose and fell
    with an empty kernel's launch time taken before each: app.runtime.launch_pace) and no graph replay was measured:
    what the launches cost is then worth measuring (--graph), where a launch-bound stage and a GPU-bound one the
    host issued while the GPU was busy read alike from the stage times alone."""
    timing = trace.get("timing") or {}
    lp = timing.get("launch_pace") or {}
    if (trace.get("selected_runtime") != "gpu" or not lp.get("follows")
            or ((timing.get("graph") or {}).get("replay") or {}).get("replayed")):
        return ""
    return (f"; the runs followed the host's launch pace (rank correlation {lp['rank_correlation']:+.2f} over "
            f"{lp['runs']} runs), so --graph, which times the stages after the build replayed as one CUDA graph, "
            "would show what their launches cost")
