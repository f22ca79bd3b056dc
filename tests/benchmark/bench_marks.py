"""What a stage mark costs at the kernels' default sizes, and where that cost goes, side by side in one run.

    python -m tests.benchmark.bench_marks [--sizes join=100k:10k;overlay=10k:10k] [--rounds 200]

A profile times its plan with a CUDA event at every stage boundary, and its report compares such runs with
bare ones (one pair of events around the whole plan): that difference is the instrumentation overhead. Here,
for each kernel's default version at each size, five kinds of run take turns in a shuffled order every round,
the L2 flushed before each. Each is timed by the recorder's own pair of CUDA events, the run's first mark and
its last (as the report's runs are):

- **bare**: no stage marks between the two (the report's bare runs);
- **marked**: a mark at every stage boundary (every profile's timed runs);
- **untimed**: the same stage marks as CUDA events created without timing (cudaEventDisableTiming): the same
  host calls at the same places in the stream, but no timestamp for the GPU to write;
- **side stream**: at every stage boundary the same timed record call, on another, idle stream: the host
  does what a marked run does, and nothing enters the plan's stream;
- **busy-wait**: at every stage boundary the host spins for as long as a timed record call takes on an idle
  stream (measured first, the same loop as below), and calls nothing.

(These two take a little more Python a boundary than a marked run: a function call around what they do.)

marked - bare is what the marks cost. untimed - bare is their host side: the recorder's Python and the
event-record calls. marked - untimed is what the timestamps add: a timed record call's longer host call, and
the GPU's wait (before it writes a timing event's timestamp the GPU finishes everything queued before it, and
the kernel queued after it starts from an idle stream). side stream - bare and busy-wait - bare say whether
the plan's stream has anything to do with it: where both cost what the marks do, a mark costs its host time,
whatever fills it, and no other kind of event could be cheaper. Each is the median of the rounds' paired
differences with its ~95% interval, per extra mark and as a share of the bare plan; they are separate medians,
so they need not add up exactly.

Beside them run the runs event mode takes its stage times without the other marks from
(app.runtime.one_mark): bare runs with a single stage mark, at the end of one stage each (one such run a stage
but the last, every round). Their cost against the bare run of their round is the instrumentation overhead of
those stage times, judged against 2% as the marks' is; and each stage's time from them is printed beside its
time with every stage marked.

Then the stages after the build (the host's copies in) run as one CUDA graph, in turns, each timed as event
mode's graph replay is (app.runtime.graph): bare, and with a CUDA event record node at every boundary between
them, timed events and untimed. Nothing runs on the host at a boundary there, so the difference is the GPU's
side of a stage mark on its own, in the plan itself; every graph's output is checked against shapely's too.

A chain of short kernels with a mark after each, queued far enough ahead that the GPU is the bound, gives the
GPU's side of one mark on its own, and a loop of record calls on an idle stream the host's.

Every output is checked: each kind of run's against shapely's. Holds the device lock for the whole run. The last
lines give each plan's two verdicts against the 2% target, every stage marked and one mark a run, a line a plan.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from app.kernel.plan import get_plan_class  # noqa: E402
from app.runtime.device import select  # noqa: E402
from app.runtime.execute import backend_for  # noqa: E402
from app.runtime.graph import AfterBuild  # noqa: E402
from app.runtime.lock import device_key, device_lock  # noqa: E402
from app.runtime.nvtx import Nvtx  # noqa: E402
from app.runtime.one_mark import from_rounds  # noqa: E402
from app.runtime.recorder import GpuClock, OneMarkRecorder, Recorder  # noqa: E402
from app.runtime.stats import median_interval  # noqa: E402
from app.runtime.timing import L2Flush  # noqa: E402
from tests.benchmark.bench_ab import shuffled_rounds  # noqa: E402
from tests.benchmark.bench_all import _inputs_and_reference, parse_sizes  # noqa: E402

DEFAULT_SIZES = "join=100k:10k;overlay=10k:10k"
TARGET = 0.02            # the marks' cost the tool aims to stay under, as a share of the bare plan
ARMS = ("bare", "marked", "untimed", "side", "busy")
CU_EVENT_RECORD_EXTERNAL = 1    # cuEventRecordWithFlags: captured, an event record node (not a dependency)
_STAND_IN = object()     # what a StandInClock returns for the marks it does not record


class StandInClock(GpuClock):
    """The stage clock with ``action()`` in place of every stage mark (marks 1 .. ``stages`` - 1): the run's
    first mark and its last, the last stage's end, stay the plan stream's timed events, so the run is timed
    as a marked one is, by the same recorder path, with something else at each boundary."""

    def __init__(self, stages: int, action):
        super().__init__()
        self._stages, self._action = stages, action

    def mark(self):
        i = self._next
        if 0 < i < self._stages:
            self._next = i + 1
            self._action()
            return _STAND_IN
        return super().mark()

    def seconds(self, a, b) -> float:
        return math.nan if a is _STAND_IN or b is _STAND_IN else super().seconds(a, b)


def spin(seconds: float) -> None:
    """Busy-wait: host time spent and nothing called."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def record_call(stream, event, repeats: int = 9) -> float:
    """A record call's host time on an idle ``stream``, in us: the median of ``repeats`` loops of 1,000."""
    import cupy as cp

    calls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(1000):
            cp.cuda.runtime.eventRecord(event.ptr, stream.ptr)
        calls.append((time.perf_counter() - t0) / 1000 * 1e6)
        stream.synchronize()
    return statistics.median(calls)


def paired(a: list[float], b: list[float], extra: int, bare_median: float) -> dict:
    """The median of the paired differences a - b with its ~95% interval, in seconds, per extra mark and as a
    share of the bare plan's median."""
    diffs = [x - y for x, y in zip(a, b)]
    mid, (lo, hi) = statistics.median(diffs), median_interval(diffs)
    return {"seconds": mid, "ci": (lo, hi), "per_mark": mid / extra, "per_mark_ci": (lo / extra, hi / extra),
            "share": mid / bare_median, "share_ci": (lo / bare_median, hi / bare_median)}


def verdict(share_ci: tuple[float, float], target: float = TARGET) -> str:
    """Whether the interval puts the marks' cost under the target, over it, or cannot tell."""
    lo, hi = share_ci
    if lo != lo:            # NaN: under six rounds there is no 95% interval
        return "no 95% interval (under 6 rounds): not resolved"
    if hi <= target:
        return f"under the {target:.0%} target"
    if lo > target:
        return f"over the {target:.0%} target"
    return f"the interval spans the {target:.0%} target: not resolved"


def summarise(times: dict[str, list[float]], extra: int) -> dict:
    """``times``: each arm's run times, in seconds, round by round (paired by index)."""
    bare = statistics.median(times["bare"])
    out = {"bare": bare, "bare_ci": median_interval(times["bare"]), "extra_marks": extra,
           "cost": paired(times["marked"], times["bare"], extra, bare),
           "host": paired(times["untimed"], times["bare"], extra, bare),
           "timestamps": paired(times["marked"], times["untimed"], extra, bare)}
    for arm in ("side", "busy"):
        if arm in times:
            out[arm] = paired(times[arm], times["bare"], extra, bare)
    return out


def measure_plan(kernel: str, a: int, b: int, rounds: int, warm: int, seed: int) -> dict:
    import cupy as cp

    version = get_plan_class(kernel).version
    params, inputs, _, ok = _inputs_and_reference(kernel, version, a, b, 16, 1)
    plan = get_plan_class(kernel, version)(params)
    sel = select("gpu")
    backend, _ = backend_for(plan, sel)
    nvtx = Nvtx(False, kernel)
    names = [s.name for s in plan.stages]
    n = len(names)
    # A run's marks: its first (0), one at each stage's end, the last stage's end the run's (tiled, see Recorder).
    side = cp.cuda.Stream(non_blocking=True)
    side_event = cp.cuda.Event()
    call = record_call(side, side_event) * 1e-6
    arms = {"bare": Recorder("gpu", cp, nvtx, per_stage=False), "marked": Recorder("gpu", cp, nvtx),
            "untimed": Recorder("gpu", cp, nvtx, clock=GpuClock(untimed=range(1, n))),
            "side": Recorder("gpu", cp, nvtx, clock=StandInClock(
                n, lambda: cp.cuda.runtime.eventRecord(side_event.ptr, side.ptr))),
            "busy": Recorder("gpu", cp, nvtx, clock=StandInClock(n, lambda: spin(call)))}
    ones = list(range(1, n))        # bare runs with one stage mark, at the end of stage k, named k as from_rounds reads
    arms |= {k: OneMarkRecorder("gpu", cp, nvtx, k) for k in ones}
    checked = {}
    for name, rec in arms.items():
        out, _ = rec.run(plan, inputs, backend)
        checked[name] = ok(backend.outputs_to_host(out))    # read now: the next run reuses the result's buffers
    flush = L2Flush("gpu", "flush", sel.info.get("l2_bytes"))
    seen, got = [], {}                 # each counted round's RunRecords by arm
    for name, counted in shuffled_rounds(arms, rounds, warm, seed):
        flush()
        _, rec = arms[name].run(plan, inputs, backend)
        if counted:
            got[name] = rec
            if len(got) == len(arms):
                seen.append(got)
                got = {}
    times = {name: [r[name].total_seconds for r in seen] for name in arms}
    marks = {name: seen[-1][name].marks for name in arms}
    extra = marks["marked"] - marks["bare"]
    if any(marks[k] != marks["marked"] for k in ARMS[2:]) or any(marks[k] != marks["bare"] + 1 for k in ones):
        raise RuntimeError(f"the runs recorded other marks than planned: {marks}")
    one = from_rounds(names, seen, "count")
    return {"kernel": kernel, "version": version, "size": f"{a:,} x {b:,}", "rounds": rounds,
            "ok": {"all arms": all(checked.values())} | {nm: checked[nm] for nm in ARMS}, "card": sel.device_name,
            "call_us": call * 1e6,
            "one": _one_mark_cost(one) if ones else None, "one_stages": one["stages"],
            "graph": graph_nodes(plan, inputs, backend, ok, flush, rounds, warm, seed)} \
        | summarise({k: times[k] for k in ARMS}, extra)


def node_recorder():
    """``record(event, stream)``: the driver's cuEventRecordWithFlags with CU_EVENT_RECORD_EXTERNAL, which CuPy
    does not expose. In a stream capture it adds an event record node to the graph, which a replay records
    as an eager record call would; a plain record call there only joins streams."""
    import ctypes

    call = ctypes.CDLL("libcuda.so.1").cuEventRecordWithFlags
    call.argtypes, call.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint], ctypes.c_int

    def record(event, stream) -> None:
        err = call(event.ptr, stream.ptr, CU_EVENT_RECORD_EXTERNAL)
        if err:
            raise RuntimeError(f"cuEventRecordWithFlags returned CUresult {err}")
    return record


def graph_nodes(plan, inputs, backend, ok, flush, rounds: int, warm: int, seed: int) -> dict | None:
    """The stages after the build as one CUDA graph, replayed bare and with an event record node at each
    boundary between them (timed events, then untimed ones), in turns, each timed as event mode's graph
    replay is. None where a stage keeps the plan out of a graph (a host read other than a size)."""
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stages, blockers = AfterBuild.from_eager_run(plan, inputs, backend, stream)
        if blockers:
            return None
        nodes, record = len(stages.after) - 1, node_recorder()
        events = {"timed": [cp.cuda.Event() for _ in range(nodes)],
                  "untimed": [cp.cuda.Event(disable_timing=True) for _ in range(nodes)]}
        graphs = {"bare": stages.capture()}
        for kind, evs in events.items():
            graphs[kind] = stages.capture(lambda k, evs=evs: record(evs[k], stream))
        checked = {}
        for name, graph in graphs.items():
            graph.replay()
            checked[name] = ok(backend.outputs_to_host(graph.state["output"]))
        times = {name: [] for name in graphs}
        for name, counted in shuffled_rounds(graphs, rounds, warm, seed):
            t = stages.timed(graphs[name].replay, flush)
            if counted:
                times[name].append(t)
    bare = statistics.median(times["bare"])
    return {"stages": len(stages.after), "nodes": nodes, "bare": bare, "bare_ci": median_interval(times["bare"]),
            "ok": checked, "timed": paired(times["timed"], times["bare"], nodes, bare),
            "untimed": paired(times["untimed"], times["bare"], nodes, bare)}


def _one_mark_cost(one: dict) -> dict:
    """The one-mark runs' cost against the bare run of their round, as from_rounds measures it for the report,
    in paired()'s form: one extra mark a run."""
    bare, (lo, hi) = one["bare_median_seconds"], one["overhead_ci95"]
    ci = (lo * bare, hi * bare)
    return {"seconds": one["overhead_seconds"], "ci": ci, "per_mark": one["overhead_seconds"], "per_mark_ci": ci,
            "share": one["overhead_fraction"], "share_ci": (lo, hi)}


CHAIN_KERNEL = r'''extern "C" __global__ void spin(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long)ns);
}'''


def chain(kernels: int = 50, kernel_us: float = 20.0, repeats: int = 9) -> dict:
    """The GPU's side of one mark with the GPU as the bound: ``kernels`` kernels of ``kernel_us`` each, queued
    behind a long one so the host stays ahead, with nothing, an untimed or a timed event after each. GPU time a
    mark (us), median of ``repeats`` chains of each kind."""
    import cupy as cp

    spin = cp.RawKernel(CHAIN_KERNEL, "spin")
    stream = cp.cuda.Stream(non_blocking=True)
    events = {"untimed": [cp.cuda.Event(disable_timing=True) for _ in range(kernels)],
              "timed": [cp.cuda.Event() for _ in range(kernels)]}
    a, b = cp.cuda.Event(), cp.cuda.Event()
    lead_ns = int(kernels * (kernel_us + 10) * 1e3)       # longer than the host takes to queue the chain
    out = {}
    with stream:
        for mode in ("none", "untimed", "timed") * 2:     # twice each, the first time as a warm-up
            runs = []
            for _ in range(repeats):
                spin((1,), (1,), (cp.int64(lead_ns),))
                a.record(stream)
                for i in range(kernels):
                    spin((1,), (32,), (cp.int64(int(kernel_us * 1e3)),))
                    if mode != "none":
                        cp.cuda.runtime.eventRecord(events[mode][i].ptr, stream.ptr)
                b.record(stream)
                b.synchronize()
                runs.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / kernels)
            out[mode] = statistics.median(runs)
    host = {mode: record_call(stream, events[mode][0], repeats) for mode in ("untimed", "timed")}
    return {"kernels": kernels, "kernel_us": kernel_us, "untimed": out["untimed"] - out["none"],
            "timed": out["timed"] - out["none"], "host_untimed": host["untimed"], "host_timed": host["timed"]}


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def _part(label: str, p: dict, whole: str = "the bare plan", each: str = "a mark") -> str:
    lo, hi = p["ci"]
    plo, phi = p["per_mark_ci"]
    slo, shi = p["share_ci"]
    return (f"  {label:<34} {p['seconds'] * 1e6:7.2f} us [{lo * 1e6:.2f}, {hi * 1e6:.2f}]  "
            f"{p['share'] * 100:+6.2f}% [{slo * 100:+.2f}, {shi * 100:+.2f}] of {whole}  "
            f"{p['per_mark'] * 1e6:5.2f} us {each} [{plo * 1e6:.2f}, {phi * 1e6:.2f}]")


def lines(r: dict) -> list[str]:
    ok = " ".join(f"{name} ok={r['ok'][name]}" for name in ("all arms",) + ARMS)
    out = [f"{r['kernel']} {r['version']} {r['size']} ({r['card']}, {r['rounds']} rounds): bare plan "
           f"{_us(r['bare'])} [{r['bare_ci'][0] * 1e6:,.1f}-{r['bare_ci'][1] * 1e6:,.1f}]; {r['extra_marks']} "
           f"marks the bare plan does not record; {ok}",
           _part("marks' cost (marked - bare)", r["cost"]) + f"  -- {verdict(r['cost']['share_ci'])}",
           _part("host side (untimed - bare)", r["host"]),
           _part("timestamps (marked - untimed)", r["timestamps"])]
    if "side" in r:
        out += [_part("same call, idle side stream (- bare)", r["side"]),
                _part(f"busy-wait {r['call_us']:.2f} us (- bare)", r["busy"])]
    if r["one"]:
        out.append(_part("one stage mark a run (- bare)", r["one"]) + f"  -- {verdict(r['one']['share_ci'])}")
        out.append("  each stage, every stage marked -> one mark a run (the times without the other marks, "
                   "~95% interval):")
        for s in r["one_stages"]:
            lo, hi = s["ci95"]
            out.append(f"    {s['name']:<28} {s['marked_seconds'] * 1e6:9.1f} -> {s['seconds'] * 1e6:9.1f} us "
                       f"[{lo * 1e6:.1f}, {hi * 1e6:.1f}]" + ("" if s["resolved"] else "  not resolved"))
    g = r.get("graph")
    if g:
        ok = " ".join(f"{name} ok={v}" for name, v in g["ok"].items())
        out.append(f"  the {g['stages']} stages after the build as one CUDA graph, no host call at a boundary: bare "
                   f"replay {_us(g['bare'])} [{g['bare_ci'][0] * 1e6:,.1f}-{g['bare_ci'][1] * 1e6:,.1f}]; "
                   f"{g['nodes']} event record nodes; {ok}")
        out += [_part("event nodes, timed (- bare replay)", g["timed"], "the bare replay", "a node"),
                _part("event nodes, untimed (- bare replay)", g["untimed"], "the bare replay", "a node")]
    elif "graph" in r:
        out.append("  no graph replay: a stage reads the device other than for a size (see --graph's report)")
    return out


def summary_line(r: dict) -> str:
    """A plan's two verdicts in one line: every stage marked, and one mark a run."""
    def share(p: dict) -> str:
        lo, hi = p["share_ci"]
        return f"{p['share'] * 100:+.2f}% [{lo * 100:+.2f}, {hi * 100:+.2f}] ({verdict(p['share_ci'])})"
    one = f"one stage mark a run {share(r['one'])}" if r["one"] else "no runs with one stage mark"
    return (f"  {r['kernel']} {r['version']} {r['size']} ({r['card']}), bare plan {_us(r['bare'])}: every stage "
            f"marked {share(r['cost'])}; {one}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES, metavar="KERNEL=A:B[,A:B];...",
                    help=f"kernels and sizes, each kernel's default version (default {DEFAULT_SIZES})")
    ap.add_argument("--rounds", type=int, default=200, metavar="N", help="rounds of the kinds of run")
    ap.add_argument("--warm", type=int, default=40, metavar="N", help="rounds run first and not counted")
    ap.add_argument("--seed", type=int, default=0, help="seed of the rounds' shuffled order")
    args = ap.parse_args(argv)
    if args.rounds < 3:
        print("bench_marks: --rounds must be at least 3 (a median's interval needs them)", file=sys.stderr)
        return 2
    sizes = parse_sizes(args.sizes)
    sel = select("auto")
    if sel.selected != "gpu":
        print("bench_marks: needs a GPU (on the CPU a stage mark is a clock read; every CPU profile's report "
              "gives its cost)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    with device_lock(device_key(sel)):
        results = [measure_plan(kernel, a, b, args.rounds, args.warm, args.seed)
                   for kernel, pairs in sizes.items() for a, b in pairs]
        gpu_bound = chain()
    print(f"\nWhat a stage mark costs ({time.perf_counter() - t0:.0f} s; medians of paired differences, ~95% "
          "intervals in brackets)")
    for r in results:
        print("\n".join(lines(r)))
    print(f"a chain of {gpu_bound['kernels']} kernels of {gpu_bound['kernel_us']:.0f} us, the GPU the bound: a "
          f"timed event after each adds {gpu_bound['timed']:.2f} us of GPU time, an untimed one "
          f"{gpu_bound['untimed']:.2f} us; the record call itself takes {gpu_bound['host_timed']:.2f} us of host "
          f"time (timed), {gpu_bound['host_untimed']:.2f} us (untimed), on an idle stream")
    # The verdicts again, a line a plan, last: the per-plan blocks above run past a screen, and a terminal or
    # a log that keeps only the tail should still hold every plan's answer.
    print("against the 2% target:")
    print("\n".join(summary_line(r) for r in results))
    graphs_ok = all(all(r["graph"]["ok"].values()) for r in results if r["graph"])
    return 0 if graphs_ok and all(all(r["ok"].values()) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
