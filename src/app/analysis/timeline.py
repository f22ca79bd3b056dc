"""Wall-time accounting of NVTX ranges from a CUDA trace (nsys export or CUPTI records).

For every instance of a range (one stage of one iteration) the window
[start, end) of the range on its host thread is cut into pieces that add up to
the span exactly:

* GPU busy -- the union of every kernel, memcpy and memset interval on any
  stream inside the window (never their sum); split into the range's own ops
  and work launched earlier that was still running;
* idle time, by cause:
  - ``before_first_op``: the host had not yet issued the range's first GPU op
    (host preparation, e.g. staging pageable memory before a copy);
  - ``launch_gap``: between two ops, the GPU waited for the host to issue the
    next one (Python/driver overhead);
  - ``sync_wait``: the GPU drained while the host was blocked in a
    synchronising call, and stayed idle until the host issued the next op or
    closed the range (the round trip of a host read or an explicit
    synchronize); in a range that hands back the result (``finishing``), after
    its last op only the time the host sat in the call: what follows is the
    host finishing, ``after_last_op``;
  - ``launch_call``: the host was inside the API call that issues the next
    op (the call started, had not returned): host time spent issuing it;
  - ``launch_latency``: the call that issued the next op had returned, the
    op had not started (the device's side of a launch);
  - ``after_last_op``: the range's last op had finished, the host (not blocked
    in a sync) had not yet closed the range;
  - ``no_gpu_work``: the range issued no GPU op at all.

A GPU op belongs to the range that was open on the launching thread when its
API call **started** (runtime/driver record -> correlation id -> GPU op), not
to whatever range its execution happens to overlap.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from app.analysis.intervals import clip, covered_at_least, gaps, measure, union
from app.runtime.stats import robust_rel_spread

CAUSES = ("before_first_op", "launch_gap", "sync_wait", "launch_call", "launch_latency", "after_last_op",
          "no_gpu_work")
CAUSE_TEXT = {
    "before_first_op": "before the first GPU op (host preparation)",
    "launch_gap": "host launch gaps (GPU waited for the CPU)",
    "sync_wait": "synchronization round trips",
    "launch_call": "host inside the call issuing the next op (the call had not returned)",
    "launch_latency": "launch latency (the issuing call had returned, the op not yet started)",
    "after_last_op": "after the last GPU op",
    "no_gpu_work": "no GPU work in the range",
}
SHORT_KERNEL_NS = 10_000
MARK_WINDOW_NS = 50_000       # how far outside a range a bracketing cudaEventRecord may sit
# Calls that block the host until the GPU catches up. Blocking copies to pageable memory are
# added from the trace itself (their DtoH op), and so are calls named in synchronisation records.
SYNC_NAME = re.compile(r"Synchronize|^cudaMemcpy$|^cudaMemcpy2D$|^cuMemcpyDtoH$|^cuMemcpyHtoD$")
# Calls that land in the synchronisation records but never block the host: an event query returns at once,
# and a stream waiting on an event makes the GPU wait, not the CPU. (The records' own sync type is no help:
# nsys 2025.3's export labels cudaStreamSynchronize's records "stream wait event".)
NEVER_BLOCKS = re.compile(r"Query|StreamWaitEvent|StreamWaitValue")
RANGE_COLUMNS = ("name", "domain", "start", "end", "tid")
API_COLUMNS = ("start", "end", "name", "corr", "tid")
OP_COLUMNS = ("start", "end", "kind", "name", "corr", "stream", "device", "bytes", "copy", "host_mem")


def api_name(raw: str) -> str:
    """cudaStreamSynchronize_v3020 -> cudaStreamSynchronize."""
    return re.sub(r"_v\d+$", "", raw or "")


@dataclass
class Timeline:
    """A trace in one shape, whatever produced it. Times are integer nanoseconds on one clock.

    ranges: name, domain, start, end, tid    (NVTX push/pop or start/end ranges)
    api:    start, end, name, corr, tid      (CUDA runtime and driver calls)
    ops:    start, end, kind (kernel|memcpy|memset), name, corr, stream, device, bytes,
            copy (HtoD|DtoH|DtoD|...), host_mem (pageable|pinned|'')
    """
    ranges: pd.DataFrame
    api: pd.DataFrame
    ops: pd.DataFrame
    sync_corr: frozenset = frozenset()
    source: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self.ranges = _frame(self.ranges, RANGE_COLUMNS).sort_values("start", kind="stable").reset_index(drop=True)
        self.api = _frame(self.api, API_COLUMNS).sort_values("start", kind="stable").reset_index(drop=True)
        self.ops = _frame(self.ops, OP_COLUMNS).sort_values("start", kind="stable").reset_index(drop=True)
        self.api["name"] = self.api["name"].map(api_name)


def _frame(data, columns) -> pd.DataFrame:
    df = data if isinstance(data, pd.DataFrame) else pd.DataFrame(list(data), columns=list(columns))
    for c in columns:
        if c not in df:
            df[c] = "" if c in ("name", "domain", "kind", "copy", "host_mem") else 0
    return df


class Accountant:
    """Indexes a Timeline once, then accounts for any number of range instances."""

    def __init__(self, tl: Timeline):
        self.tl = tl
        api, ops = tl.api, tl.ops
        self.api_start = api["start"].to_numpy(np.int64)
        self.api_end = api["end"].to_numpy(np.int64)
        self.api_tid = api["tid"].to_numpy(np.int64)
        self.api_corr = api["corr"].to_numpy(np.int64)
        launch = dict(zip(self.api_corr.tolist(), self.api_start.tolist()))
        returned = dict(zip(self.api_corr.tolist(), self.api_end.tolist()))
        self.op_start = ops["start"].to_numpy(np.int64)
        self.op_end = ops["end"].to_numpy(np.int64)
        self.op_launch = np.array([launch.get(c, s) for c, s in zip(ops["corr"].tolist(), self.op_start.tolist())],
                                  dtype=np.int64)
        # Where the issuing call returned: until then an idle GPU waits on the host inside that call (an H200
        # overlay's cuLaunchKernel lasted 16.45 us and its kernel started 0.27 us after it returned).
        self.op_call_end = np.array([returned.get(c, s) for c, s in zip(ops["corr"].tolist(),
                                                                         self.op_start.tolist())], dtype=np.int64)
        self.op_attributed = ops["corr"].isin(launch.keys()).to_numpy()
        self.ops_by_corr: dict[int, list[int]] = {}
        for i, c in enumerate(ops["corr"].tolist()):
            self.ops_by_corr.setdefault(int(c), []).append(i)
        blocking_copies = set(ops.loc[(ops["copy"] == "DtoH") & (ops["host_mem"] == "pageable"), "corr"].tolist())
        names = api["name"].tolist()
        self.is_mark = np.array([n in ("cudaEventRecord", "cuEventRecord") for n in names], dtype=bool)
        self.is_sync = np.array([(bool(SYNC_NAME.search(n)) or c in tl.sync_corr or c in blocking_copies)
                                 and not NEVER_BLOCKS.search(n) for n, c in zip(names, self.api_corr.tolist())],
                                dtype=bool)

    def _api_in(self, tid: int, s: int, e: int) -> np.ndarray:
        lo, hi = np.searchsorted(self.api_start, [s, e], side="left")
        idx = np.arange(lo, hi)
        return idx[self.api_tid[lo:hi] == tid]

    def _event_marks(self, tid: int, s: int, e: int) -> tuple[int, int]:
        """Where CUDA events recorded just outside [s, e) on the thread were issued (their calls' ends), or
        the range's own edges when there are none within MARK_WINDOW_NS."""
        lo = int(np.searchsorted(self.api_start, s - MARK_WINDOW_NS, side="left"))
        hi = int(np.searchsorted(self.api_start, e + MARK_WINDOW_NS, side="right"))
        before = [i for i in range(lo, hi) if self.is_mark[i] and self.api_tid[i] == tid and self.api_end[i] <= s]
        after = [i for i in range(lo, hi) if self.is_mark[i] and self.api_tid[i] == tid and self.api_start[i] >= e]
        return (int(self.api_end[before[-1]]) if before else s), (int(self.api_end[after[0]]) if after else e)

    def _inner_marks(self, tid: int, s: int, e: int) -> tuple[int, int]:
        """Where the first and last CUDA event records inside [s, e) on the thread were issued: a range that holds
        other marked ranges (the iteration) is timed from its first record to its last, so its time before the
        first and after the last is no part of its event time. The range's own edges where it holds none."""
        idx = self._api_in(tid, s, e)
        marks = idx[self.is_mark[idx]]
        return (int(self.api_end[marks[0]]), int(self.api_end[marks[-1]])) if len(marks) else (s, e)

    def account(self, name: str, domain: str, s: int, e: int, tid: int, event_marks: str | bool = False,
                finishing: bool = False) -> dict:
        """``event_marks``: where the CUDA event records that time the range sit: "outside" (True) just outside its
        edges, "inside" its first and last within it; False: none, the estimate runs from edge to edge."""
        s, e, tid = int(s), int(e), int(tid)
        api_idx = self._api_in(tid, s, e)
        own = sorted((i for c in self.api_corr[api_idx].tolist() for i in self.ops_by_corr.get(int(c), ())),
                     key=lambda i: (self.op_start[i], i))
        window = np.nonzero((self.op_start < e) & (self.op_end > s))[0]
        win_iv = [(int(self.op_start[i]), int(self.op_end[i])) for i in window]
        own_iv = [(int(self.op_start[i]), int(self.op_end[i])) for i in own]
        busy_union = union(clip(win_iv, s, e))
        busy = measure(busy_union)
        busy_own = measure(union(clip(own_iv, s, e)))
        pieces: dict[str, list] = {c: [] for c in CAUSES}
        syncs = api_idx[self.is_sync[api_idx]]
        if own:
            self._classify_idle(pieces, s, e, busy_union, own, syncs, finishing)
        else:
            pieces["no_gpu_work"] = gaps(s, e, busy_union)
        idle = {c: measure(pieces[c]) for c in CAUSES}
        ops = self.tl.ops
        kinds = ops["kind"].to_numpy()[own] if own else np.array([])
        dur = (self.op_end[own] - self.op_start[own]) if own else np.array([], dtype=np.int64)
        last_end = int(self.op_end[own].max()) if own else e
        ms, me = (self._inner_marks(tid, s, e) if event_marks == "inside" else
                  self._event_marks(tid, s, e) if event_marks else (s, e))
        earlier = np.nonzero((self.op_launch < ms) & (self.op_end > ms) & self.op_attributed)[0]
        gpu_free_at = max(ms, int(self.op_end[earlier].max())) if len(earlier) else ms
        # The closing record fires once the range's ops issued before it have run: the later of the two ends,
        # never their sum (the record's issue lies inside the GPU's overrun when the GPU ends later).
        closing = [i for i in own if self.op_launch[i] < me]
        event_end = max(me, int(self.op_end[closing].max())) if closing else me
        rec = {
            "name": name, "domain": domain, "start_ns": s, "end_ns": e, "tid": tid, "span_ns": e - s,
            "busy_ns": busy, "busy_own_ns": busy_own, "busy_earlier_ns": busy - busy_own,
            "kernel_ns": int(dur[kinds == "kernel"].sum()) if own else 0,
            "memcpy_ns": int(dur[kinds == "memcpy"].sum()) if own else 0,
            "memset_ns": int(dur[kinds == "memset"].sum()) if own else 0,
            "gpu_after_end_ns": max(0, last_end - e),
            "concurrent_ns": covered_at_least(win_iv, 2, s, e),
            "idle_ns": idle,
            "ops": len(own), "kernels": int((kinds == "kernel").sum()) if own else 0,
            "short_kernels": int(((kinds == "kernel") & (dur < SHORT_KERNEL_NS)).sum()) if own else 0,
            "launch_latency_med_ns": float(np.median(self.op_start[own] - self.op_launch[own])) if own else None,
            # What CUDA events recorded at the range's edges would measure: from the moment the GPU is
            # free of earlier work to the later of the closing record's issue and the own ops finishing. It is
            # span + event_open - queued_behind_earlier + event_close, exactly: the report's parts of the gap.
            "event_estimate_ns": event_end - gpu_free_at,
            "queued_behind_earlier_ns": gpu_free_at - ms,
            "event_marks_outside_ns": max(0, s - ms) + max(0, me - e),
            "event_open_ns": s - ms,                # < 0: the opening record lies inside the range
            "event_close_ns": event_end - e,        # < 0: the timing ends before the range closes
            "event_close_by_gpu": event_end > me,   # the own ops, not the record's issue, end the timing
            "syncs": [self._sync_doc(i) for i in syncs.tolist()],
            "copies": self._copies(own),
            "d2h_launches_ns": [int(self.op_launch[i]) for i in own if ops["copy"].iat[i] == "DtoH"],
            # Each cause's idle pieces: where each figure of idle_ns lies, to set beside the API calls around it.
            "idle_iv": {c: [(int(a), int(b)) for a, b in iv] for c, iv in pieces.items() if iv},
            # How long the host made no CUDA call at the range's start, and over how long it issued its ops (first
            # op's call to the last's): all a trace shows of the host's work before and between the copies.
            "quiet_start_ns": (int(self.api_start[api_idx[0]]) - s) if len(api_idx) else e - s,
            "issue_span_ns": int(self.op_launch[own].max() - self.op_launch[own].min()) if own else 0,
            # When its first op started on the GPU: later than the host's first call by that call and its latency,
            # so the GPU's wait for the first copy is this, not the host's quiet time (111.2 against 117.7 us).
            "first_op_start_ns": (int(self.op_start[own[0]]) - s) if own else None,
        }
        rec["accounted_ns"] = rec["busy_ns"] + sum(idle.values())
        return rec

    def _classify_idle(self, pieces, s, e, busy_union, own, syncs, finishing: bool = False) -> None:
        """Cuts every gap of the GPU's busy union in [s, e) into the causes' pieces (``pieces[cause]`` lists)."""
        first = own[0]
        first_start = int(self.op_start[first])
        last_end = int(self.op_end[own].max())
        own_starts = self.op_start[own]
        sync_iv = union((int(self.api_start[i]), int(self.api_end[i])) for i in syncs.tolist())

        def add(cause, a, b):
            if b > a:
                pieces[cause].append((a, b))

        def issued(a, b, op):
            """[a, b) before ``op`` started: until its call starts the host had not issued it (``gap``), inside
            the call the host was issuing it, after the call returned the launch was the device's to start."""
            launch, returned = int(self.op_launch[op]), int(self.op_call_end[op])
            return min(b, launch), min(b, max(launch, returned))

        for a, b in gaps(s, e, busy_union):
            if a < first_start:                       # before the range's first op started
                hb = min(b, first_start)
                call, ret = issued(a, hb, first)
                add("before_first_op", a, call)
                add("launch_call", max(a, call), ret)
                add("launch_latency", max(a, ret), hb)
                a = hb
            if a >= b:
                continue
            blocked = any(sa <= a <= sb for sa, sb in sync_iv)
            if b > last_end:                          # after the range's last op finished
                ta = max(a, last_end)
                if finishing:
                    # A range that hands back the result (the plan's last stage, the whole iteration): only the
                    # time the host sits in a synchronising call; once it returns, the host is finishing (the
                    # result assembled, the run's end), no round trip that a later op waited for.
                    waited = clip(sync_iv, ta, b)
                    pieces["sync_wait"].extend(waited)
                    pieces["after_last_op"].extend(gaps(ta, b, waited))
                else:
                    add("sync_wait" if blocked and ta == a else "after_last_op", ta, b)
                b = ta
                if a >= b:
                    continue
            # Between ops, a gap that opens while the host is blocked in a sync is the read's whole round trip,
            # to the next launch: the host could not issue that op before the read returned.
            k = int(np.searchsorted(own_starts, a, side="left"))
            if k < len(own):
                call, ret = issued(a, b, own[k])
            else:
                call = ret = b
            add("sync_wait" if blocked else "launch_gap", a, call)
            add("launch_call", max(a, call), ret)
            add("launch_latency", max(a, ret), b)

    def _sync_doc(self, i: int) -> dict:
        return {"name": self.tl.api["name"].iat[i], "start_ns": int(self.api_start[i]),
                "dur_ns": int(self.api_end[i] - self.api_start[i]), "corr": int(self.api_corr[i])}

    def _copies(self, own: list[int]) -> dict:
        out = {}
        if not own:
            return out
        ops = self.tl.ops.iloc[own]
        calls: dict[str, set] = {}
        for r in ops[ops["kind"] == "memcpy"].itertuples():
            d = out.setdefault(r.copy or "other", {"count": 0, "calls": 0, "bytes": 0, "ns": 0, "pageable": 0,
                                                   "pageable_bytes": 0})
            d["count"] += 1
            # API calls behind the copies: a copy the driver splits shows as more copies than calls.
            calls.setdefault(r.copy or "other", set()).add(int(r.corr))
            d["calls"] = len(calls[r.copy or "other"])
            d["bytes"] += int(r.bytes)
            d["ns"] += int(r.end - r.start)
            if r.host_mem == "pageable":
                d["pageable"] += 1
                d["pageable_bytes"] += int(r.bytes)
        return out


def account_ranges(tl: Timeline, domain: str | None = None, names=None, event_marks: bool = False,
                   finishing=frozenset()) -> list[dict]:
    """Every range instance (optionally of one domain / some names), in start order, numbered per name.

    ``event_marks``: the leaf ranges are bracketed by CUDA event records (as this project's recorder
    does), so their event-time estimate starts and ends at those records rather than at the range's edges; a
    range holding leaves (the iteration) is timed from its first record inside it to its last. ``finishing``:
    names of the ranges that hand back the result (sync wait after their last op is only the host's time in the
    call)."""
    acc = Accountant(tl)
    rows = tl.ranges
    if domain is not None:
        rows = rows[rows["domain"] == domain]
    if names is not None:
        rows = rows[rows["name"].isin(list(names))]
    rows = rows[rows["end"].notna() & (rows["end"] > rows["start"])]
    starts, ends, tids = (rows[c].to_numpy(np.int64) for c in ("start", "end", "tid"))
    doms = rows["domain"].to_numpy(object)
    seen: dict[tuple, int] = {}
    out = []
    for j, r in enumerate(rows.itertuples()):
        key = (r.domain, r.name)
        # A leaf range holds no other analysed range of its own domain: audit rules look at leaves, so a
        # parent range does not repeat its children's findings (and only leaves are bracketed by marks). A
        # library's range inside a stage (a CCCL scan's, say) is another view of the same time, not a child.
        inner = (tids == r.tid) & (starts >= r.start) & (ends <= r.end) & (doms == r.domain)
        inner[j] = False
        leaf = not inner.any()
        rec = acc.account(r.name, r.domain, r.start, r.end, r.tid, ("outside" if leaf else "inside") if event_marks
                          else False, finishing=r.name in finishing)
        rec["leaf"] = leaf
        rec["instance"] = seen.get(key, 0)
        seen[key] = rec["instance"] + 1
        out.append(rec)
    return out


def time_outside_stages(iteration: dict, instances: list[dict], stage_names) -> int:
    """An iteration instance's span less the spans of the stage ranges inside it (ns): its time outside every stage,
    per iteration as event mode counts it (a median span less the sum of median spans is no one iteration's
    remainder)."""
    return iteration["span_ns"] - sum(r["span_ns"] for r in stages_of(iteration, instances, stage_names))


def stages_of(iteration: dict, instances: list[dict], stage_names) -> list[dict]:
    """The stage range instances inside one iteration instance (same thread), in start order."""
    return [r for r in instances if r["name"] in stage_names and r["tid"] == iteration["tid"]
            and iteration["start_ns"] <= r["start_ns"] and r["end_ns"] <= iteration["end_ns"]]


def median_instance(recs: list[dict]) -> dict:
    """The instance whose span is the median (the lower middle one for an even count): a real iteration,
    so the parts read from it add up to its span, which medians taken column by column need not do."""
    return sorted(recs, key=lambda r: r["span_ns"])[(len(recs) - 1) // 2]


def summarise(instances: list[dict]) -> list[dict]:
    """Per range name: the instance count, the median instance's accounting (microseconds) and the spread
    of the spans over every instance."""
    groups: dict[tuple, list[dict]] = {}
    for rec in instances:
        groups.setdefault((rec["domain"], rec["name"]), []).append(rec)
    out = []
    for (domain, name), recs in groups.items():
        spans = [r["span_ns"] / 1e3 for r in recs]
        r = median_instance(recs)
        med = r["span_ns"] / 1e3
        mid = statistics.median(spans)     # the spread is over every span: relative to their median, not one's
        errs = [abs(x["accounted_ns"] - x["span_ns"]) / x["span_ns"] for x in recs if x["span_ns"]]
        out.append({
            "name": name, "domain": domain, "instances": len(recs), "median_instance": r["instance"],
            "span_us": med, "busy_us": r["busy_ns"] / 1e3, "kernel_us": r["kernel_ns"] / 1e3,
            "memcpy_us": r["memcpy_ns"] / 1e3, "memset_us": r["memset_ns"] / 1e3, "ops": r["ops"],
            "idle_us": {c: r["idle_ns"][c] / 1e3 for c in CAUSES},
            "busy_earlier_us": r["busy_earlier_ns"] / 1e3, "gpu_after_end_us": r["gpu_after_end_ns"] / 1e3,
            "concurrent_us": r["concurrent_ns"] / 1e3, "kernels": r["kernels"], "short_kernels": r["short_kernels"],
            # None, not zero, when the instance launched no GPU op: there is no latency to show.
            "launch_latency_us": (r["launch_latency_med_ns"] / 1e3 if r["launch_latency_med_ns"] is not None
                                  else None),
            "event_estimate_us": r["event_estimate_ns"] / 1e3,
            "queued_behind_earlier_us": r["queued_behind_earlier_ns"] / 1e3,
            "event_marks_outside_us": r["event_marks_outside_ns"] / 1e3,
            "event_open_us": r["event_open_ns"] / 1e3, "event_close_us": r["event_close_ns"] / 1e3,
            "event_close_by_gpu": r["event_close_by_gpu"],
            "syncs": len(r["syncs"]), "copies": r["copies"],
            "quiet_start_us": r["quiet_start_ns"] / 1e3, "issue_span_us": r["issue_span_ns"] / 1e3,
            "first_op_us": (r["first_op_start_ns"] / 1e3 if r.get("first_op_start_ns") is not None else None),
            "span_spread": {"median_us": mid, "min_us": min(spans), "max_us": max(spans),
                            "stdev_us": statistics.stdev(spans) if len(spans) > 1 else 0.0,
                            "rel_stdev": (statistics.stdev(spans) / mid) if len(spans) > 1 and mid else 0.0,
                            "robust_rel_spread": robust_rel_spread(spans) if spans else 0.0},
            "accounting_max_error_pct": 100 * max(errs) if errs else 0.0,
        })
    return out


def capture_summary(tl: Timeline) -> dict:
    """Whole-capture facts: op counts and how many ops no API record claims."""
    ops = tl.ops
    launched = set(tl.api["corr"].tolist())
    return {"source": tl.source, "ranges": int(len(tl.ranges)), "api_calls": int(len(tl.api)),
            "ops": int(len(ops)), "kernels": int((ops["kind"] == "kernel").sum()),
            "memcpys": int((ops["kind"] == "memcpy").sum()), "memsets": int((ops["kind"] == "memset").sum()),
            "ops_without_api_record": int((~ops["corr"].isin(launched)).sum())} | tl.meta
