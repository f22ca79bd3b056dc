"""timeline.json in the Chrome trace-event format: open it in Perfetto (ui.perfetto.dev) or chrome://tracing.

Host ranges go on one track per thread, GPU ops on one track per stream, with
the correlation id in each op's args so a kernel can be traced back to the
API call that launched it.
"""
from __future__ import annotations


# The nsys reader makes correlation ids unique across processes by putting the process id above bit 32;
# the low 32 bits are the id the capture itself shows (in nsys's GUI, say).
CAPTURE_ID = 0xFFFFFFFF


def chrome_trace(tl, window: tuple[int, int], label: str) -> dict:
    lo, hi = window
    t0 = lo

    def us(t):
        return (int(t) - t0) / 1e3

    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": f"{label}: host"}},
              {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": f"{label}: GPU"}}]
    r = tl.ranges
    for x in r[(r["end"] > lo) & (r["start"] < hi)].itertuples():
        events.append({"ph": "X", "pid": 1, "tid": int(x.tid), "name": x.name, "cat": x.domain or "nvtx",
                       "ts": us(x.start), "dur": (x.end - x.start) / 1e3})
    a = tl.api
    for x in a[(a["end"] > lo) & (a["start"] < hi)].itertuples():
        events.append({"ph": "X", "pid": 1, "tid": int(x.tid), "name": x.name, "cat": "cuda_api",
                       "ts": us(x.start), "dur": (x.end - x.start) / 1e3, "args": {"correlation": int(x.corr) & CAPTURE_ID}})
    o = tl.ops
    for x in o[(o["end"] > lo) & (o["start"] < hi)].itertuples():
        args = {"correlation": int(x.corr) & CAPTURE_ID, "kind": x.kind}
        if x.kind != "kernel":
            args |= {"bytes": int(x.bytes), "copy": x.copy, "host_memory": x.host_mem}
        events.append({"ph": "X", "pid": 2, "tid": int(x.stream), "name": x.name, "cat": x.kind,
                       "ts": us(x.start), "dur": (x.end - x.start) / 1e3, "args": args})
    for stream in sorted(set(o["stream"].tolist())):
        events.append({"ph": "M", "name": "thread_name", "pid": 2, "tid": int(stream),
                       "args": {"name": f"stream {stream}"}})
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"source": tl.source}}
