"""What a stage does after its work -- rows and metadata from counters it already read -- is not timed as the
plan's: a recorder's run does it once its last clock mark is taken. And size reads through the pinned buffer
bring back exactly the device's words."""
import math
import time

import numpy as np
import pytest

from app.runtime.nvtx import Nvtx
from app.runtime.recorder import SMALL_READ_BYTES, Recorder, read_to_host

SLOW = 0.2      # seconds of bookkeeping: far above a plan of two trivial stages


class _Spec:
    def __init__(self, name):
        self.name, self.category = name, "compute"


class _Plan:
    kernel = "demo"
    stages = [_Spec("work"), _Spec("finish")]

    def __init__(self, log):
        self.log = log

    def run(self, inputs, backend, recorder):
        for spec in self.stages:
            with recorder.stage(spec) as st:
                st.rows_in = len(inputs)
                if spec.name == "finish":
                    def book(st=st):
                        time.sleep(SLOW)
                        st.rows_out = 7
                        st.meta["booked"] = True
                        self.log.append("booked")
                    st.later(book)
                self.log.append(spec.name)
        self.log.append("returned")
        return inputs


def test_a_runs_bookkeeping_comes_after_its_clock_and_still_fills_the_record():
    log = []
    out, rec = Recorder("cpu", np, Nvtx(False, "demo")).run(_Plan(log), [1, 2, 3], None)
    assert log == ["work", "finish", "returned", "booked"]
    assert rec.total_seconds < SLOW and rec.wall_seconds < SLOW      # the sleep is outside both clocks
    finish = rec.stages[1]
    assert finish["rows_out"] == 7 and finish["meta"] == {"booked": True} and finish["seconds"] < SLOW


def test_outside_a_recorders_run_bookkeeping_runs_when_its_stage_ends():
    """A graph capture runs the stages straight through the plan: each stage's bookkeeping is done as it ends."""
    log = []
    recorder = Recorder("cpu", np, Nvtx(False, "demo"))
    _Plan(log).run([1], None, recorder)
    assert log == ["work", "finish", "booked", "returned"]


def test_a_stage_that_fails_leaves_no_held_bookkeeping_behind():
    class Failing(_Plan):
        def run(self, inputs, backend, recorder):
            with recorder.stage(_Spec("finish")) as st:
                st.later(lambda: self.log.append("booked"))
            raise ValueError("bad input")

    log = []
    recorder = Recorder("cpu", np, Nvtx(False, "demo"))
    with pytest.raises(ValueError):
        recorder.run(Failing(log), [1], None)
    assert log == []
    _Plan(log).run([1], None, recorder)            # the next stages are not held for a run that ended
    assert log == ["work", "finish", "booked", "returned"]


@pytest.mark.gpu
def test_small_reads_through_the_pinned_buffer_equal_the_device_words():
    import cupy as cp

    ledger = cp.arange(14, dtype=cp.uint64) * 3
    for array in (ledger, ledger[8:10], cp.asarray([2.5, -1.0]), cp.zeros(0, cp.int32), cp.arange(6).reshape(2, 3),
                  ledger[::2], cp.arange(SMALL_READ_BYTES // 8 + 1, dtype=cp.int64)):
        got = read_to_host(cp, array)
        np.testing.assert_array_equal(got, cp.asnumpy(array))
        assert got.dtype == array.dtype and got.shape == array.shape
    first = read_to_host(cp, ledger)
    read_to_host(cp, ledger[:3] + 100)          # the buffer is reused: an earlier result is a copy, unchanged
    assert first.tolist() == [3 * i for i in range(14)]
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:                                # queued on the current stream: the read waits for its kernels
        x = cp.zeros(4, cp.int64)
        for _ in range(50):
            x += 1
        assert read_to_host(cp, x).tolist() == [50] * 4


class _Clock:
    """A CPU clock that counts its marks: each returns the next integer."""

    def __init__(self):
        self.marks = 0

    def begin(self):
        pass

    def mark(self):
        self.marks += 1
        return float(self.marks)

    def finish(self):
        pass

    def seconds(self, a, b):
        return b - a


def test_a_kernel_plans_run_ends_at_its_last_stages_mark_and_a_plan_of_its_own_gets_one_more():
    """A KernelPlan returns as its last stage ends: the run takes one mark a stage plus its first, and its
    stages add up to its total exactly. A plan with its own run() may work after its last stage: it gets
    a separate end mark, and what no stage covers is measured (here the clock steps once more)."""
    from app.kernel.plan import KernelPlan

    class Tiled(KernelPlan):
        kernel, version = "demo", "v1"
        stages = [_Spec("work"), _Spec("finish")]

        def __init__(self):
            self.tiling = {"work": {}, "finish": {}}

    class Backend:
        def work(self, state, st, tiling):
            state["output"] = [1]

        def finish(self, state, st, tiling):
            st.rows_out = 1

    for plan, marks, uncovered in ((Tiled(), 3, 0.0), (_Plan([]), 4, 1.0)):
        recorder = Recorder("cpu", np, Nvtx(False, "demo"))
        recorder.clock = _Clock()
        _, rec = recorder.run(plan, [1, 2], Backend())
        assert recorder.clock.marks == marks
        assert [s["seconds"] for s in rec.stages] == [1.0, 1.0]
        assert rec.total_seconds - rec.stage_sum == uncovered
    bare = Recorder("cpu", np, Nvtx(False, "demo"), per_stage=False)
    bare.clock = _Clock()
    _, rec = bare.run(Tiled(), [1], Backend())
    assert bare.clock.marks == 2 and rec.total_seconds == 1.0 and rec.stages == []


def test_stage_marks_without_timestamps_leave_the_run_timed_by_its_own_pair():
    """The mark-cost benchmark records the stage marks without timestamps (GpuClock's ``untimed``): each stage's
    time is then NaN, never a number, and the run's total comes from its first and last marks."""
    from app.kernel.plan import KernelPlan

    class Tiled(KernelPlan):
        kernel, version = "demo", "v1"
        stages = [_Spec("a"), _Spec("b"), _Spec("c")]

        def __init__(self):
            self.tiling = {"a": {}, "b": {}, "c": {}}

    class Backend:
        def a(self, state, st, tiling):
            state["output"] = [1]

        b = c = a

    class Untimed(_Clock):       # marks 2 and 3 (the stage marks between the run's first and last) untimed
        def seconds(self, a, b):
            return math.nan if {a, b} & {2.0, 3.0} else b - a

    recorder = Recorder("cpu", np, Nvtx(False, "demo"), clock=Untimed())
    _, rec = recorder.run(Tiled(), [1], Backend())
    assert rec.marks == 4 and all(math.isnan(s["seconds"]) for s in rec.stages)
    assert rec.total_seconds == 3.0


def test_ranges_off_runs_with_no_ranges_then_restores_them():
    """The nsys worker warms up on the recorder it profiles with, its ranges off, so nothing is made between the
    warm-up and the first ranged iteration. With a range log (the CUPTI backend's clock), a run inside
    ``ranges_off`` logs none and the next run logs one a stage."""
    log = []
    nvtx = Nvtx(False, "demo", clock=time.perf_counter_ns)
    nvtx.prepare(["work", "finish"])           # no domain without the nvtx package's: nothing to register
    rec = Recorder("cpu", np, nvtx)
    with rec.ranges_off():
        _, quiet = rec.run(_Plan(log), [1, 2], None)
    assert nvtx.log == [] and [s["name"] for s in quiet.stages] == ["work", "finish"]
    _, ranged = rec.run(_Plan(log), [1, 2], None)
    assert [r[0] for r in nvtx.log] == ["work", "finish"]
