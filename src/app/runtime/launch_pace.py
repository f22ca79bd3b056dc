"""The host's launch pace during the timed runs (GPU only): a few launches of an empty kernel, their host time
taken just before every timed run, outside its timed region.

Why, beside the fixed Python loop (app.runtime.host_pace): at their default sizes the plans are bound by their
host's launches, and on the lent cloud hosts what a launch costs moves by itself, where the loop often does not
see it. On one H200 host, three profiles of the default join run back to back in three processes read 180, 255
and 291 us after the build while the loop read 78.2, 80.1 and 80.7 us. Ten processes of a probe on that host
ran the same plan 124 to 251 us after the build: the four fast ones launched this empty kernel in 5.1-5.5 us of
host time, the six slow ones in 6.8-7.4 us. The loop told those two groups apart too (45-47 against 67-82 us),
but among the slow ones it ran in no order with the plan (67 us beside 247 us after the build, 82 beside 230).
On another H200 host four profiles back to back ran 620, 468, 387 and 409 us, their launches 7.6, 6.9, 5.4 and
6.4 us (the plan's order), their loops 81.5, 80.8, 44.5 and 73.8 us: between the first two only the launches
moved. A plan of nine launches, their event records and its reads pays a launch's change many times over, so the
compare command and the report's baseline section say when the launches themselves got slower or faster between
two profiles, instead of calling it the code's change.

What it cannot see: a slowdown of the GPU's own work, or of a copy. The launches are queued on the plan's stream
and waited for before the run starts, so they never overlap a timed run.
"""
from __future__ import annotations

import time

from app.runtime import host_pace

LAUNCHES = 16       # ~80-120 us of host time on the lent hosts: small beside a flush
SOURCE = r'extern "C" __global__ void launch_pace_nop(int* x) { if (threadIdx.x == 1024) x[0] = 1; }'
HOW = (f"host clock around {LAUNCHES} launches of an empty kernel (one block of 32 threads, one pointer argument, "
       "launched as the plans launch theirs) just before every timed run, outside its timed region: the same "
       "launches each time, so their time is the host's launch pace")


class LaunchPace:
    """Times ``LAUNCHES`` launches of an empty kernel on the current stream; ``seconds()`` is one launch's share."""

    def __init__(self, cp):
        self._stream = cp.cuda.get_current_stream
        self._kernel = cp.RawKernel(SOURCE, "launch_pace_nop")
        self._arg = cp.zeros(1, dtype=cp.int32)
        self._kernel((1,), (32,), (self._arg,))     # compiled and loaded here, not in the first timing
        self._stream().synchronize()

    def seconds(self) -> float:
        kernel, args = self._kernel, (self._arg,)
        t0 = time.perf_counter()
        for _ in range(LAUNCHES):
            kernel((1,), (32,), args)
        seconds = (time.perf_counter() - t0) / LAUNCHES
        self._stream().synchronize()    # untimed: the launches are done before the run (with --l2 keep too)
        return seconds


def summarise(pace: list[float], totals: list[float]) -> dict:
    """The launch times beside the runs they preceded: as host_pace.summarise does for the loop's."""
    return host_pace.summarise(pace, totals, what={"launches": LAUNCHES, "how": HOW})


CPU_WHY = "CPU run: the plan launches no kernels"


class Paces:
    """Both of the host's paces, timed before each timed run: the fixed loop always, the launches on a GPU.
    Event mode and the nsys worker take them the same way, so `compare` reads the same figures from either."""

    def __init__(self, device: str, xp):
        self.loop: list[float] = []
        self.launches: list[float] | None = [] if device == "gpu" else None
        self._launcher = LaunchPace(xp) if device == "gpu" else None

    def warm(self) -> None:
        """The launches once, untimed: after a tracer starts, its first launches pay its set-up."""
        if self._launcher is not None:
            self._launcher.seconds()

    def sample(self) -> None:
        """One timing of each; call it outside the timed region, just before a timed run."""
        self.loop.append(host_pace.loop_seconds())
        if self._launcher is not None:
            self.launches.append(self._launcher.seconds())


def timing(loop: list[float], launches: list[float] | None, totals: list[float]) -> dict:
    """trace.json's ``timing.host_pace`` and ``timing.launch_pace`` from the raw timings (``launches`` None: a CPU
    run) beside the runs' totals, in the order the runs ran."""
    return {"host_pace": host_pace.summarise(loop, totals),
            "launch_pace": summarise(launches, totals) if launches is not None else {"why": CPU_WHY}}
