"""Times a plan run stage by stage and counts what crosses the host/device line.

A stage's backend method receives a ``StageContext``: it fills ``rows_in``,
``rows_out`` and ``meta``, and moves data only through ``to_device``,
``to_host`` and ``read_size`` so every copy and synchronisation is counted
(truth rule 5). The recorder brackets each stage with clock marks -- CUDA
events on the GPU, a monotonic clock on the CPU -- and the whole run with a
pair of its own. Adjacent stages share the mark between them: the stages tile
the run from its first mark. A KernelPlan's run ends as its last stage ends,
so that stage's end mark is the run's end; a plan with a run() of its own gets
a separate end mark, and the part of its run no stage covers is measured, not
assumed to be zero (truth rule 2).
"""
from __future__ import annotations

import math
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from app.kernel.plan import stages_tile_run
from app.runtime.nvtx import Nvtx


def _injected_delays() -> dict[str, float]:
    """Test hook for regression gates: APP_INJECT_STAGE_DELAY="stage=seconds[,stage=seconds]" makes those
    stages sleep, so a test can produce a genuinely slower run of unchanged code."""
    out = {}
    for item in filter(None, os.environ.get("APP_INJECT_STAGE_DELAY", "").split(",")):
        name, _, seconds = item.partition("=")
        try:
            out[name.strip()] = max(0.0, float(seconds))
        except ValueError:
            continue                # a malformed test hook is ignored, never a crash
    return out


_INJECTED_DELAY = _injected_delays()

# Device reads up to this size (the size reads: a few words) go through a pinned buffer kept per thread.
SMALL_READ_BYTES = 4096
_small_read_buffers = threading.local()


def read_to_host(xp, array) -> np.ndarray:
    """A device array to a new host array, waiting for the current stream to reach it (as cupy.asnumpy).

    A small one is copied into a pinned buffer with one queued copy and a wait on the stream, where
    cupy.asnumpy would have the driver stage it through pageable memory: after join v4's last launch at
    100k x 10k its size read returned in 43 against 55 us on an H200 node (no difference at 1M x 100k,
    where the host waits longer for the GPU). Every GPU plan's size reads take this path, in every mode.
    """
    nbytes = array.nbytes
    if nbytes > SMALL_READ_BYTES or not array.flags.c_contiguous:
        return xp.asnumpy(array)
    held = getattr(_small_read_buffers, "held", None)
    if held is None:  # portable pinned memory (CuPy's pool): valid whichever device the thread has current
        import cupyx

        buf = cupyx.empty_pinned(SMALL_READ_BYTES, np.uint8)
        # Its address is kept too: numpy's .ctypes builds an object on every call, and the read is on the plan's
        # critical path (a 112-byte read from an idle GPU took 11.7 against 14.2 us so on an H100 node).
        held = _small_read_buffers.held = (buf, buf.ctypes.data)
    buf, address = held
    stream = xp.cuda.get_current_stream()
    if nbytes:
        xp.cuda.runtime.memcpyAsync(address, array.data.ptr, nbytes, xp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
    stream.synchronize()
    return buf[:nbytes].view(array.dtype).reshape(array.shape).copy()


class CpuClock:
    def begin(self) -> None:
        pass

    def mark(self):
        return time.perf_counter()

    def finish(self) -> None:
        pass

    def seconds(self, a, b) -> float:
        return b - a


class GpuClock:
    """CUDA events on the current stream: GPU-timeline time between marks.

    Events are pooled and reused run after run (a run's times are read before
    the next run starts), so creating them adds no host time to the stages.

    ``untimed`` names marks, by their place in a run (0 is the run's first), to record as events without
    timing (cudaEventDisableTiming): the same host call at the same place in the stream, but no timestamp,
    which the GPU writes only once all work queued before it is done. The mark-cost benchmark
    (tests/benchmark/bench_marks.py) leaves the stage marks untimed and the run's first and last timed, to
    split a mark's cost between the host and the GPU. Time to or from an untimed mark is NaN.
    """

    def __init__(self, untimed=()):
        import cupy

        self._cp = cupy
        self._untimed = frozenset(untimed)
        self._untimed_events: set = set()
        self._record = cupy.cuda.runtime.eventRecord
        self._pool: list = []
        self._ptrs: list = []           # the events' handles, read once: a property read costs host time too
        self._next = 0
        self._stream = None

    def begin(self) -> None:
        self._next = 0
        self._stream = self._cp.cuda.get_current_stream().ptr

    def mark(self):
        i = self._next
        if i >= len(self._pool):
            self._grow(i)
        self._next = i + 1
        # The runtime call itself, not Event.record: a mark is on the host's critical path in a launch-bound
        # plan, and the wrapper's checks add to every stage's time.
        self._record(self._ptrs[i], self._stream)
        return self._pool[i]

    def _grow(self, i: int) -> None:
        """Events for the marks up to ``i``: a subclass may skip marks (bench_marks puts other things there)."""
        while len(self._pool) <= i:
            j = len(self._pool)
            self._pool.append(self._cp.cuda.Event(disable_timing=j in self._untimed))
            self._ptrs.append(self._pool[j].ptr)
            if j in self._untimed:
                self._untimed_events.add(self._ptrs[j])

    def finish(self) -> None:
        self._cp.cuda.get_current_stream().synchronize()

    def seconds(self, a, b) -> float:
        if self._untimed_events and (a.ptr in self._untimed_events or b.ptr in self._untimed_events):
            return math.nan
        return self._cp.cuda.get_elapsed_time(a, b) / 1e3


class SizeTape:
    """The allocation-size reads of one eager run, by stage, replayed in the same order by a run that must
    not read the device: the capture of a CUDA graph, which can hold device work only. A graph captured
    this way is valid for inputs of exactly these sizes (the same inputs, replayed)."""

    def __init__(self):
        self.reads: list[tuple[str, np.ndarray]] = []
        self.result_arrays: list = []     # the device arrays a replaying run reads the result's length from
        self.replaying = False
        self._next = 0

    def record(self, stage: str, value: np.ndarray) -> None:
        self.reads.append((stage, np.array(value, copy=True)))

    def replay(self) -> None:
        self.replaying, self._next = True, 0

    def take(self, stage: str) -> np.ndarray:
        if self._next >= len(self.reads) or self.reads[self._next][0] != stage:
            had = f"{self.reads[self._next][0]}'s" if self._next < len(self.reads) else "none"
            raise RuntimeError(f"{stage} reads a size where the eager run read {had}: the plan's size reads "
                               "differ from run to run, so no graph can replay it")
        self._next += 1
        return self.reads[self._next - 1][1].copy()


@dataclass
class StageContext:
    name: str
    category: str
    device: str
    xp: object                      # numpy or cupy
    rows_in: int = 0
    rows_out: int = 0
    meta: dict = field(default_factory=dict)
    h2d_copies: int = 0
    h2d_bytes: int = 0
    d2h_copies: int = 0
    d2h_bytes: int = 0
    syncs: int = 0
    size_reads: list = field(default_factory=list)
    result_reads: int = 0           # of the size reads, those that size the result after the plan's last launch
    tape: SizeTape | None = None    # records the size reads, or replays them without touching the device
    deferred: list = field(default_factory=list)   # bookkeeping to run once the run's clock has stopped

    @property
    def on_gpu(self) -> bool:
        return self.device == "gpu"

    def to_device(self, host_array):
        if not self.on_gpu:
            return np.ascontiguousarray(host_array)
        arr = self.xp.asarray(host_array)
        self.h2d_copies += 1
        self.h2d_bytes += arr.nbytes
        return arr

    def count_h2d(self, nbytes: int, copies: int = 1) -> None:
        """Host->device copies made by a backend's own staging (see app.kernel.staging): ``copies`` of them,
        ``nbytes`` in all."""
        self.h2d_copies += copies
        self.h2d_bytes += int(nbytes)

    def to_host(self, array) -> np.ndarray:
        if not self.on_gpu:
            return np.asarray(array)
        out = read_to_host(self.xp, array)   # blocking copy: a synchronisation too
        self.d2h_copies += 1
        self.d2h_bytes += out.nbytes
        self.syncs += 1
        return out

    def read_size(self, array, why: str) -> np.ndarray:
        """A device->host read that sizes an allocation: the only kind allowed mid-pipeline."""
        self.size_reads.append(why)
        if self.tape is not None and self.tape.replaying:
            return self.tape.take(self.name)
        out = self.to_host(array)
        if self.tape is not None:
            self.tape.record(self.name, out)
        return out

    def read_result_size(self, array, why: str) -> np.ndarray:
        """A size read made after the plan has queued all its device work, to cut the result to length.

        Nothing waits on it but the caller, so it does not keep the plan out of a CUDA graph: the graph
        ends before it, and the host reads the size after the replay (the tape keeps the array, so a timed
        replay reads it as an eager run does)."""
        self.result_reads += 1
        if self.tape is not None and self.tape.replaying:
            self.tape.result_arrays.append(array)
        return self.read_size(array, why)

    def later(self, fn) -> None:
        """Run ``fn`` -- the stage's bookkeeping: rows and metadata from counters already read -- once the
        run's last clock mark is recorded. After a plan's final read the GPU idles while the host works, so
        bookkeeping done in line would be timed as the plan's own: on an H200 node it was 16-24 us of join
        v4's time after the build. Outside a recorder's run (a graph capture) it runs when the stage ends."""
        self.deferred.append(fn)

    def counters(self) -> dict:
        return {"h2d_copies": self.h2d_copies, "h2d_bytes": self.h2d_bytes,
                "d2h_copies": self.d2h_copies, "d2h_bytes": self.d2h_bytes,
                "syncs": self.syncs, "allocation_size_reads": len(self.size_reads),
                "result_size_reads": self.result_reads}


def mid_plan_reads(counters: dict) -> int:
    """A stage's size reads that stall the plan: all but the result's length, read once every launch is queued.
    ``counters`` is StageContext.counters() or a trace stage's metadata (older traces lack result_size_reads)."""
    return counters.get("allocation_size_reads", 0) - counters.get("result_size_reads", 0)


@dataclass
class RunRecord:
    stages: list[dict]
    total_seconds: float        # clock marks around the whole run
    wall_seconds: float         # host monotonic clock, including the final synchronisation
    marks: int = 0              # clock marks the run recorded (CUDA events on the GPU)
    to_boundary: float | None = None    # OneMarkRecorder: from the run's first mark to its one stage mark
    end_to_end_seconds: float | None = None   # app.runtime.timing.copied_back: host clock, run and copy back

    @property
    def stage_sum(self) -> float:
        return sum(s["seconds"] for s in self.stages)


class Recorder:
    """``per_stage=False`` keeps only the pair of marks around the whole run: the bare plan, whose time
    next to the instrumented one measures what the per-stage marks cost. ``clock`` replaces the device's
    own (CUDA events on the GPU, the monotonic clock on the CPU)."""

    def __init__(self, device: str, xp, nvtx: Nvtx, per_stage: bool = True, tape: SizeTape | None = None,
                 clock=None):
        self.device, self.xp, self.nvtx, self.per_stage, self.tape = device, xp, nvtx, per_stage, tape
        self.clock = clock or (GpuClock() if device == "gpu" else CpuClock())
        # Ranges are pushed only when something records them (the nvtx package, or the range log of the
        # in-process CUPTI trace): otherwise the calls would only add host time to every stage.
        self._ranges = nvtx.active or nvtx.clock is not None
        self._marks: list = []
        self._last = None               # the latest clock mark of this run
        self._contexts: list | None = None    # the stages of the run in progress (their deferred bookkeeping)

    @contextmanager
    def ranges_off(self):
        """Runs with no ranges pushed, on this recorder's own clock: the worker's warm-up, which then runs straight
        into the ranged iterations with nothing new made between."""
        ranges, self._ranges = self._ranges, False
        try:
            yield self
        finally:
            self._ranges = ranges

    def defer(self) -> None:
        """Hold the bookkeeping of the stages run from now (``StageContext.later``) until ``settle``."""
        self._contexts = []

    def settle(self) -> None:
        """Run the held bookkeeping; stages run after this do theirs as they end."""
        contexts, self._contexts = self._contexts or [], None
        for st in contexts:
            for fn in st.deferred:
                fn()

    def stage(self, spec) -> "_Stage":
        """``with recorder.stage(spec) as st:`` -- the stage's context, and its marks when ``per_stage``."""
        st = StageContext(spec.name, spec.category, self.device, self.xp, tape=self.tape)
        if self._contexts is not None:
            self._contexts.append(st)
        return _Stage(self, st)

    def run(self, plan, inputs, backend):
        """One full plan run; returns (output, RunRecord)."""
        self._marks = []
        self.defer()
        try:
            self.clock.begin()
            wall0 = time.perf_counter()
            t0 = self._last = self.clock.mark()
            output = plan.run(inputs, backend, self)
            tiled = self._ends_at_last_stage(plan)
            t1 = self._last if tiled else self.clock.mark()
            self.clock.finish()
            wall = time.perf_counter() - wall0
        except BaseException:
            self._contexts = None
            raise
        self.settle()            # the clock has stopped: bookkeeping is not the plan's time
        stages = [{"name": st.name, "category": st.category, "device": st.device,
                   "seconds": self.clock.seconds(a, b), "rows_in": int(st.rows_in),
                   "rows_out": int(st.rows_out), "meta": dict(st.meta),
                   "counters": st.counters(), "size_reads": list(st.size_reads),
                   # Host time in the stage: issuing its work (near the device time means launch-bound), and
                   # waiting where it reads from the device (counters' syncs), which waits for all queued work.
                   "host_seconds": host}
                  for st, a, b, host in self._marks]
        # Tiled, the run's time is its stages' (t0 to t1 in steps): summed in the order stage_sum sums them,
        # so the time no stage covers is exactly zero, not a rounding residue of either sign.
        total = sum(s["seconds"] for s in stages) if tiled else self.clock.seconds(t0, t1)
        if math.isnan(total):      # stage marks with no timestamps (GpuClock's untimed): the run's own pair has them
            total = self.clock.seconds(t0, t1)
        # The run's first mark, one a stage, and the run's own end mark unless the last stage's is the end.
        marks = 1 + len(self._marks) + (0 if tiled else 1)
        return output, RunRecord(stages, total, wall, marks)

    def _ends_at_last_stage(self, plan) -> bool:
        """Whether the run's end is its last stage's end mark. KernelPlan.run returns its last stage's output
        as that stage ends, with no device work between, so a second mark there would measure nothing but
        itself: one more event record, a few microseconds of host time and a GPU bubble, which the bare run
        (no per-stage marks) does not pay. A plan with a run of its own may work after its last stage: it
        gets a mark of its own, and the time no stage covers is measured."""
        return self.per_stage and bool(self._marks) and stages_tile_run(plan)


class OneMarkRecorder(Recorder):
    """A bare run (no per-stage marks) with one stage mark: at the end of stage ``boundary`` (1 = the first).
    Its RunRecord's ``to_boundary`` is the time from the run's first mark to that one: what the stages up to
    and including ``boundary`` take with no other stage mark in the run (app.runtime.one_mark)."""

    def __init__(self, device: str, xp, nvtx: Nvtx, boundary: int, clock=None):
        super().__init__(device, xp, nvtx, per_stage=False, clock=clock)
        self.boundary = boundary
        self._seen = 0
        self._pair = None           # (the run's first mark, the stage mark) once the stage has ended

    def stage(self, spec) -> "_Stage":
        bracket = super().stage(spec)
        self._seen += 1
        return _BoundaryStage(self, bracket.st) if self._seen == self.boundary else bracket

    def run(self, plan, inputs, backend):
        self._seen, self._pair = 0, None
        output, record = super().run(plan, inputs, backend)
        if self._pair is not None:
            record.to_boundary = self.clock.seconds(*self._pair)
            record.marks += 1
        return output, record


class _Stage:
    """One stage's bracket. A plain object rather than a generator context manager: at the default sizes the
    plan is host-bound, so every microsecond of Python here lands in the plan's time, and the marked path
    must add as little as it can over the bare one (on H200 nodes one more generator layer measured 1.5-3 us
    a stage).

    One mark per stage boundary: a stage starts at the mark that ended the one before (the run's first mark
    for the first stage), so the stages tile the run and each costs one event record, not two. The marks
    still bracket the NVTX range: a trace's range holds the stage's own work only."""

    __slots__ = ("rec", "st", "start", "host0")

    def __init__(self, rec: Recorder, st: StageContext):
        self.rec, self.st = rec, st

    def __enter__(self) -> StageContext:
        rec = self.rec
        if rec.per_stage:
            self.start = rec._last
            self.host0 = time.perf_counter()
            if rec._ranges:
                rec.nvtx.push(self.st.name)
        return self.st

    def __exit__(self, exc_type, exc, tb) -> bool:
        rec = self.rec
        if exc_type is None and _INJECTED_DELAY and self.st.name in _INJECTED_DELAY:
            time.sleep(_INJECTED_DELAY[self.st.name])
        if rec.per_stage:
            if rec._ranges:
                rec.nvtx.pop()
            host = time.perf_counter() - self.host0
            end = rec._last = rec.clock.mark()
            if exc_type is None:
                rec._marks.append((self.st, self.start, end, host))
        if rec._contexts is None and exc_type is None:      # not in a recorder's run: nothing to wait for
            for fn in self.st.deferred:
                fn()
        return False


class _BoundaryStage(_Stage):
    """The marked stage of a OneMarkRecorder's run: a bare stage with a mark as it ends. The run has no other
    stage mark, so the recorder's last mark is still the run's first."""

    __slots__ = ()

    def __exit__(self, exc_type, exc, tb) -> bool:
        super().__exit__(exc_type, exc, tb)     # the bare stage's end: the tests' delay hook, held bookkeeping
        if exc_type is None:
            rec = self.rec
            rec._pair = (rec._last, rec.clock.mark())
        return False
