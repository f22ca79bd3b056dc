"""The automated GPU performance audit: findings with a severity and the evidence behind them.

Works on the wall-time accounting of range instances (analysis.timeline), so it
runs the same on this project's plans and on any nsys capture with NVTX ranges.
Severity follows the audit checklist the tool grew from:

* BLOCKING -- stops the path from scaling as GPU code at all (a stage on the CPU,
  a synchronisation that drains the GPU with no host read to wait for);
* HIGH -- caps throughput or destroys overlap (spans dominated by host time,
  large pageable copies, large device->host copies mid-pipeline);
* MEDIUM -- a repeated anti-pattern that compounds (allocation-size reads, many
  tiny launches);
* LOW -- worth a look, measure before acting.

Rules look at leaf ranges only (a range that holds no other analysed range of its
domain), so a parent range does not repeat its children's findings. Each rule reads
the median instance of a range (the one whose span is the median), the instance the
accounting tables show, so a finding's figures are the tables' own.
"""
from __future__ import annotations

from app.analysis.timeline import median_instance

SEVERITIES = ("BLOCKING", "HIGH", "MEDIUM", "LOW")
HOST_DOMINATED = 0.5          # idle share of a span above which a stage is host-dominated
MIN_SPAN_NS = 20_000          # below this a stage is too short to audit for host time
TINY_KERNELS = 5              # kernels < 10 us per instance before "many tiny launches" fires
SMALL_READ_BYTES = 64         # a device->host read this small per copy is an allocation-size read
PAGEABLE_HIGH_BYTES = 1 << 20




def _unread_syncs(rec) -> int:
    """Synchronisations with no device->host copy issued between the previous sync's start (or the
    range's start) and their own end: a blocking copy is its own read, and the stream sync CuPy
    issues right after a copy belongs to that read."""
    count, since = 0, rec["start_ns"]
    for s in rec["syncs"]:
        if not any(since <= t <= s["start_ns"] + s["dur_ns"] for t in rec["d2h_launches_ns"]):
            count += 1
        since = s["start_ns"]
    return count


def audit(instances: list[dict], stage_info: dict | None = None, terminal: set | None = None) -> list[dict]:
    """Findings, most severe first.

    ``stage_info`` maps a range name to {"category", "device"} where the plan is known (this
    project's stages); ``terminal`` names the ranges whose device->host copies are the output.
    """
    stage_info = stage_info or {}
    groups: dict[tuple, list[dict]] = {}
    for r in instances:
        if r.get("leaf", True):
            groups.setdefault((r["domain"], r["name"]), []).append(r)
    if terminal is None:        # a foreign capture: the last leaf range to open is the output
        terminal = {max(groups.items(), key=lambda kv: kv[1][0]["start_ns"])[0][1]} if groups else set()
    findings = []

    def add(sev, rule, stage, evidence, advice):
        findings.append({"severity": sev, "rule": rule, "stage": stage, "evidence": evidence, "advice": advice})

    for (_, name), recs in groups.items():
        info = stage_info.get(name, {})
        n = len(recs)
        rep = median_instance(recs)
        span = rep["span_ns"]
        if info.get("device") not in (None, "gpu"):
            add("BLOCKING", "CPU fallback", name, f"the stage ran on {info['device']} in {n} of {n} instances",
                "make the stage's GPU path cover this input, or say why it cannot")
        unread = _unread_syncs(rep)
        wait = rep["idle_ns"]["sync_wait"] / 1e3
        if unread:
            add("BLOCKING", "synchronization with no host read", name,
                f"{unread:g} sync(s) per instance with no device->host copy before them; "
                f"sync round trips {wait:,.1f} us per instance",
                "drop the synchronize: same-stream work is already ordered; sync only right before a host read")
        d2h = rep["copies"].get("DtoH")
        if d2h and name not in terminal and info.get("category") != "emit":
            count, nbytes = d2h["count"], d2h["bytes"]
            small = nbytes <= SMALL_READ_BYTES * count
            add("MEDIUM" if small else "HIGH", "device->host copy inside a compute stage", name,
                f"{count:g} DtoH copies, {nbytes:,.0f} B per instance; sync round trips {wait:,.1f} us per instance",
                "size outputs from an upper bound or keep the count on the device, so the stage needs no host read"
                if small else "keep the data on the device until the output stage")
        idle = sum(rep["idle_ns"].values())
        if span >= MIN_SPAN_NS and idle > HOST_DOMINATED * span:
            causes = rep["idle_ns"]
            top = max(causes, key=causes.get)
            add("HIGH", "span dominated by host time", name,
                f"GPU idle {idle / 1e3:,.1f} of {span / 1e3:,.1f} us ({100 * idle / span:.0f}%); "
                f"largest cause {top} {causes[top] / 1e3:,.1f} us",
                host_time_advice({c: v / 1e3 for c, v in causes.items()}, rep["ops"], len(rep["syncs"]),
                                 rep["copies"], rep["memcpy_ns"] > rep["kernel_ns"], info.get("staging", ""),
                                 output=name in terminal, size_reads=info.get("size_reads", 0),
                                 host=_host_times(rep)))
        tiny = rep["short_kernels"]
        if tiny >= TINY_KERNELS:
            kernels = rep["kernels"]
            add("MEDIUM", "many tiny launches", name, f"{tiny:g} of {kernels:g} kernels per instance run < 10 us",
                "fuse the small kernels or capture the stage as a CUDA graph")
        pageable = rep["copies"].get("HtoD", {})
        pb = pageable.get("pageable_bytes", 0)
        if pb:
            pc = pageable.get("pageable", 0)
            add("HIGH" if pb >= PAGEABLE_HIGH_BYTES else "LOW", "pageable host->device copy", name,
                f"{pc:g} copies, {pb / 1e6:,.2f} MB per instance from pageable memory",
                "stage the inputs in pinned memory (cupy.cuda.alloc_pinned_memory) and copy asynchronously")
        if rep["ops"] == 0 and span >= MIN_SPAN_NS and not info:
            add("LOW", "range with no GPU work", name, f"{span / 1e3:,.1f} us per instance, no GPU op launched",
                "if this range should run on the GPU, it does not")
    return sorted(findings, key=lambda f: SEVERITIES.index(f["severity"]))


def _host_times(rep: dict) -> dict:
    """What the trace shows of the host's side of an instance (us): how long it made no CUDA call at the start,
    and over how long it issued its ops."""
    first = rep.get("first_op_start_ns")
    return {"quiet_us": rep.get("quiet_start_ns", 0) / 1e3, "issue_us": rep.get("issue_span_ns", 0) / 1e3,
            "first_op_us": first / 1e3 if first is not None else None}


def host_time_advice(idle_us: dict, ops: int, syncs: int, copies: dict, copies_lead: bool, staging: str = "",
                     most: int = 4, output: bool = False, size_reads: int = 0, host: dict | None = None) -> str:
    """What to do about a stage whose span is mostly GPU idle, naming only what its capture shows: round trips where
    it synchronised, fusing where it launched more than once, pinned memory where a copy was pageable. Its causes
    in order of their time. ``copies_lead``: its copies take longer than its kernels; ``staging``: the stage's own
    account of how it moved its inputs (this project's stages), which the capture cannot see; ``output``: the stage
    hands back the plan's result, so its reads are the result's, which the plan cannot do without; ``size_reads``:
    how many of them the stage counted as reads of the result's size; ``host``: _host_times()."""
    families = [
        (idle_us.get("sync_wait", 0.0), "sync"),
        (sum(idle_us.get(c, 0.0) for c in ("launch_gap", "launch_call", "launch_latency")), "launch"),
        (idle_us.get("before_first_op", 0.0), "before"),
        (idle_us.get("after_last_op", 0.0), "after"),
    ]
    said = []
    for v, family in sorted(families, key=lambda x: -x[0]):
        if v < 0.05:
            continue
        if family == "sync" and syncs and output:
            what = "the result's size" if size_reads and size_reads >= syncs else "the result"
            said.append(f"{v:,.1f} us of GPU idle while the host sat in its read of {what}, which the plan "
                        "needs to hand back its result")
        elif family == "sync" and syncs:
            said.append(f"{v:,.1f} us of GPU idle around its {syncs:g} host round trip(s): issue its work without "
                        "them (outputs sized from upper bounds, counts kept on the device)")
        elif family == "launch":
            said.append(_launch_advice(idle_us, ops, copies, copies_lead))
        elif family == "before":
            said.append(_preparation_advice(v, copies, copies_lead, staging, host or {}))
        elif family == "after":
            said.append(f"{v:,.1f} us of host work after its last GPU op: move it off the stage's path")
    return "; ".join(said[:most]) or "-"


def _launch_advice(idle_us: dict, ops: int, copies: dict, copies_lead: bool) -> str:
    """The GPU idle around the stage's launches, split where the trace splits it: before the issuing call (a host
    gap), inside it (the host issuing the op), after it returned (the launch's latency). An H200 overlay's
    'launch latency' had been mostly the host inside cuLaunchKernel (16.5 of 16.7 us)."""
    gap, call, latency = (idle_us.get(c, 0.0) for c in ("launch_gap", "launch_call", "launch_latency"))
    if ops <= 1:        # one launch: nothing to fuse within the stage
        what = " and ".join(x for x in (
            f"{call:,.1f} us with the host inside the call that issued it" if call >= 0.05 else "",
            f"{latency:,.1f} us from that call's return to its start (launch latency)" if latency >= 0.05 else "")
            if x) or f"{call + latency:,.1f} us around its launch"      # each part under the 0.05 us shown
        return (f"its one GPU op kept the GPU idle {what}: capture it with the neighbouring stages' launches in one "
                "CUDA graph")
    what = ", ".join(x for x in (f"{gap:,.1f} us of host gaps between them" if gap >= 0.05 else "",
                                 f"{call:,.1f} us with the host inside the calls that issue them" if call >= 0.05
                                 else "",
                                 f"{latency:,.1f} us of launch latency after those calls returned" if latency >= 0.05
                                 else "") if x) or f"{gap + call + latency:,.1f} us around its launches"
    if copies_lead:     # copies are not fused; what helps is fewer of them, back to back
        n = sum(d.get("count", 0) for d in copies.values())
        mix = "all copies" if n == ops else f"{n:g} of them copies" if n else "copies taking most of their time"
        return f"across its {ops:g} GPU ops, {mix}, {what}: fewer, larger copies issued back to back pay it fewer times"
    return f"across its {ops:g} GPU ops, {what}: fuse them or capture them as one CUDA graph"


def _preparation_advice(wait: float, copies: dict, copies_lead: bool, staging: str, host: dict) -> str:
    """The GPU idle before the stage's first op. For a stage that moves its data: what the trace shows of the host
    then (no CUDA call, then the copies issued close together), beside the stage's own account of its staging, with
    no cause the trace cannot show: an H200 join's build made no CUDA call for 99-528 us before its first DMA and
    issued all 8 within 52-128 us of it, while its staging queues the first DMA after one 128 KiB slice, so the
    copy into pinned buffers does not explain the wait."""
    if not copies_lead:
        return (f"{wait:,.1f} us of host work before its first GPU op: do it once, outside the timed path, or "
                "while earlier GPU work runs")
    htod = copies.get("HtoD", {})
    n, pageable = htod.get("count", 0), htod.get("pageable", 0)
    # Each figure for what it is: 'before first op' ends at the host's first call, and the GPU waits on through
    # that call and its latency until the copy starts (an H200 join: no call for 111.2 us, the copy at 117.7).
    first = host.get("first_op_us")
    text = (f"the first copy starts {first:,.1f} us into the stage" if first is not None else
            f"the GPU is idle {wait:,.1f} us before the host issues the first copy")
    quiet, issue = host.get("quiet_us"), host.get("issue_us")
    if quiet:
        text += (f"; the host makes no CUDA call for the first {quiet:,.1f} us of the stage"
                 + (f", then issues its {n:g} copies within {issue:,.1f} us" if n > 1 and issue else ""))
    # nsys mode captures with CPU sampling off: the trace holds CUDA calls and ranges, not the host's own work.
    text += ("; what the host does before the first copy the trace does not show (a capture with CPU sampling "
             "on would)")
    if pageable:
        text += (f"; {pageable:g} of its {n:g} host->device copies read pageable memory: keep those host arrays in "
                 "pinned memory")
    elif n:
        per_call = ", one DMA per call" if htod.get("calls") == n else ""
        text += f"; its {n:g} host->device copies already read pinned memory{per_call}"
    return text + (f" (the stage's staging: {staging})" if staging else "")


def copy_bound(s: dict) -> bool:
    """A stage (summary entry) whose own copies take longer than its kernels."""
    return s["memcpy_us"] > s["kernel_us"]


def mid_plan_sync_us(stages: list[dict], terminal: set) -> float:
    """GPU idle around the host reads of the stages that do not hand back the result (summarise() entries): what
    removing round trips can save. The output stage's read of the result stays, and the iteration's own figure
    also holds the time after the last stage closes, which is the profiler's (its end-of-run record and wait)."""
    return sum(s["idle_us"]["sync_wait"] for s in stages if s["name"] not in terminal and s["syncs"])


def answers(iteration: dict, stages: list[dict], findings: list[dict], stage_info: dict | None = None,
            terminal: set | None = None) -> tuple[str, str]:
    """The audit's two questions, answered from the accounting of the whole iteration.

    ``iteration`` and ``stages`` are analysis.timeline.summarise() entries (microseconds), ``stages`` that
    iteration's own stage instances (the figures of one sentence are one iteration's); ``stage_info`` and
    ``terminal`` as audit() takes them (no stage hands back the result when ``terminal`` is None)."""
    terminal = terminal or set()
    span, busy = iteration["span_us"], iteration["busy_us"]
    idle = iteration["idle_us"]
    ranked = sorted(((v, c) for c, v in idle.items() if v > 0), reverse=True)
    severe = [f for f in findings if f["severity"] in ("BLOCKING", "HIGH")]
    share = 100 * busy / span if span else 0.0
    if share >= 70:
        q1 = (f"Little does: the GPU is busy {share:.0f}% of the iteration ({busy:,.1f} of {span:,.1f} us), "
              "so the time is kernel and copy work rather than host orchestration.")
    else:
        parts = [f"{v:,.1f} us {c.replace('_', ' ')}" for v, c in ranked[:3]]
        rules: dict[str, list[str]] = {}
        for f in severe:
            rules.setdefault(f"{f['severity']} {f['rule']}", []).append(f["stage"])
        q1 = (f"The host. The GPU is busy only {share:.0f}% of the iteration ({busy:,.1f} of {span:,.1f} us); "
              f"the rest is {', '.join(parts)}" + ("; findings: " + "; ".join(f"{r} ({', '.join(st)})"
                                                                             for r, st in rules.items())
                                                  if rules else "") + ".")
    # The change named is for the largest cause the plan's stages hold: the iteration's stages' own accounting,
    # summed, where the analysis gave it (its time outside every stage is the run's own, no change to the plan), and
    # the stage with the most of that cause. An H200 overlay, largest cause its launch gaps, was told to change the
    # build's staging, the stage with the most idle time of any cause.
    own = iteration.get("idle_in_stages_us") or idle
    ranked_own = sorted(((v, c) for c, v in own.items() if v > 0), reverse=True)
    # The result's read is no round trip to remove: where it is the only one, the next cause is the change to make.
    mid = mid_plan_sync_us(stages, terminal)
    actionable = [c for v, c in ranked_own if c != "sync_wait" or mid >= 0.05]
    top = actionable[0] if actionable and stages else None
    launch = ("launch_gap", "launch_call", "launch_latency")
    if share >= 70 or top is None:
        s = max(stages, key=lambda s: s["kernel_us"]) if stages else None
        q2 = ("None needed for the plan's shape: optimise the kernels themselves, starting with "
              f"{s['name']} ({s['kernel_us']:,.1f} us of kernels; run --prof_type ncu)." if s else
              "None needed for the plan's shape.")
    elif top == "sync_wait":
        s = max((s for s in stages if s["name"] not in terminal), key=lambda s: s["idle_us"]["sync_wait"])
        q2 = ("Remove the mid-plan host reads: size outputs from upper bounds or keep counts on the device, so "
              f"the plan is issued without a round trip (largest in the median iteration in {s['name']}, "
              f"{s['idle_us']['sync_wait']:,.1f} us). With no host read left the plan can be captured as one CUDA graph.")
    elif top in ("launch_gap", "before_first_op") and copy_bound(s := max(stages, key=lambda s: s["idle_us"][top])):
        # Its largest cause only, in the audit's words for it: what the capture and the stage's staging show.
        advice = host_time_advice(s["idle_us"], s["ops"], s["syncs"], s.get("copies", {}), True,
                                  ((stage_info or {}).get(s["name"]) or {}).get("staging", ""), most=1,
                                  host={"quiet_us": s.get("quiet_start_us"), "issue_us": s.get("issue_span_us"),
                                        "first_op_us": s.get("first_op_us")})
        q2 = (f"Get the inputs to the GPU without it waiting: {s['name']} moves its data with copies and spends "
              f"{sum(s['idle_us'].values()):,.1f} us of the median iteration with the GPU idle around them; {advice}.")
    elif top in launch:
        s = max(stages, key=lambda s: sum(s["idle_us"][c] for c in launch))
        q2 = (f"Issue fewer, larger launches: {iteration['ops']:g} GPU ops are issued one by one per iteration; "
              f"fuse the launch-bound kernels (most GPU idle around launches in the median iteration in {s['name']}, "
              f"{sum(s['idle_us'][c] for c in launch):,.1f} us) or capture the plan as a CUDA graph.")
    elif top == "before_first_op":
        s = max(stages, key=lambda s: s["idle_us"]["before_first_op"])
        q2 = (f"Take host preparation off the critical path: in the median iteration {s['name']} spends "
              f"{s['idle_us']['before_first_op']:,.1f} us on the host before its first GPU op; do that work once, "
              "outside the timed path, or while earlier GPU work runs.")
    else:
        s = max(stages, key=lambda s: s["idle_us"][top])
        q2 = (f"Shrink the host work around the GPU ops: in the median iteration {s['name']} has {s['idle_us'][top]:,.1f} us of "
              f"{top.replace('_', ' ')}.")
    return q1, q2
