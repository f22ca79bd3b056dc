"""``python -m app.kernel calibrate``: measure this GPU's sustained DRAM bandwidth and fp64/fp32 FMA rates.

* Bandwidth: a device-to-device copy of 1 GiB (read + write = 2 GiB moved), far past L2.
* FMA rate: every thread runs 8 independent fused-multiply-add chains (2 FLOPs each), enough
  warps for every SM, so the FMA pipes -- not latency -- set the pace.

Each is timed with CUDA events, in batches of 10, until the robust spread of the repetitions
is at most 1% (or 200 repetitions); the median is the figure. Read-only for the GPU's
settings: clocks are whatever they are, and the clock state is recorded beside the result.
"""
from __future__ import annotations

import datetime as dt

from app.analysis import calibration
from app.runtime.stats import robust_rel_spread

COPY_BYTES = 1 << 30
BATCH, MAX_REPS, STABLE = 10, 200, 0.01
CHAINS, ITERS, THREADS = 8, 2048, 256

_SOURCE = r"""
template <typename T> __device__ void chains(T* out, int iters, T a, T b) {
    T x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3, x4 = x0 + 4, x5 = x0 + 5, x6 = x0 + 6, x7 = x0 + 7;
    for (int i = 0; i < iters; ++i) {
        x0 = fma(x0, a, b); x1 = fma(x1, a, b); x2 = fma(x2, a, b); x3 = fma(x3, a, b);
        x4 = fma(x4, a, b); x5 = fma(x5, a, b); x6 = fma(x6, a, b); x7 = fma(x7, a, b);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;   // keeps the work
}
extern "C" __global__ void fma64(double* out, int iters, double a, double b) { chains(out, iters, a, b); }
extern "C" __global__ void fma32(float* out, int iters, float a, float b) { chains(out, iters, a, b); }
"""


def _repeat(cp, launch) -> tuple[float, int, float]:
    """(median seconds, repetitions, robust spread) of ``launch`` timed with events until stable."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    launch()                                     # warm-up: module load, clocks ramping
    times: list[float] = []
    while len(times) < MAX_REPS:
        for _ in range(BATCH):
            start.record()
            launch()
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        if robust_rel_spread(times) <= STABLE:
            break
    times.sort()
    return times[len(times) // 2], len(times), robust_rel_spread(times)


def _copy(cp) -> tuple[float, int, float]:
    """A device-to-device copy of COPY_BYTES; the buffers are freed on return."""
    src = cp.ones(COPY_BYTES // 8, dtype=cp.float64)
    dst = cp.empty_like(src)
    stream = cp.cuda.get_current_stream()
    return _repeat(cp, lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, COPY_BYTES,
                                                            cp.cuda.runtime.memcpyDeviceToDevice, stream.ptr))


def measure(selection) -> dict:
    import cupy as cp

    from app.runtime.clocks import clock_snapshot

    props = cp.cuda.runtime.getDeviceProperties(0)
    before = clock_snapshot(selection)
    copy_s, copy_n, copy_sp = _copy(cp)
    module = cp.RawModule(code=_SOURCE, options=("--std=c++17",))
    blocks = props["multiProcessorCount"] * (props["maxThreadsPerMultiProcessor"] // THREADS)
    rates = {}
    for name, dtype in (("fp64", cp.float64), ("fp32", cp.float32)):
        out = cp.empty(blocks * THREADS, dtype=dtype)
        fn = module.get_function("fma64" if name == "fp64" else "fma32")
        args = (out, cp.int32(ITERS), dtype(0.999999), dtype(1e-7))
        secs, reps, sp = _repeat(cp, lambda: fn((blocks,), (THREADS,), args))
        flops = 2.0 * CHAINS * ITERS * blocks * THREADS
        rates[name] = {"tflops": flops / secs / 1e12, "reps": reps, "robust_spread": sp}
    info = selection.info
    return {
        "uuid": info.get("uuid") or "", "name": selection.device_name,
        "measured_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "memory_gbps": 2 * COPY_BYTES / copy_s / 1e9, "fp64_tflops": rates["fp64"]["tflops"],
        "fp32_tflops": rates["fp32"]["tflops"],
        "method": {"copy": {"bytes_moved": 2 * COPY_BYTES, "reps": copy_n, "robust_spread": copy_sp},
                   "fp64": rates["fp64"], "fp32": rates["fp32"],
                   "fma": f"{CHAINS} independent chains x {ITERS} iterations, {blocks} blocks x {THREADS} threads"},
        "driver_version": info.get("driver_version"), "clocks_before": before,
        "clocks_after": clock_snapshot(selection),
    }


def run_calibrate(argv: list[str]) -> int:
    import json

    from app.analysis.devices import match_device
    from app.errors import DeviceUnavailable, OneLineParser
    from app.runtime import device as devmod
    from app.runtime.lock import device_key, device_lock

    p = OneLineParser(help_command="python -m app.kernel", prog="python -m app.kernel calibrate", allow_abbrev=False,
                      description="Measure this GPU's sustained DRAM bandwidth and fp64/fp32 FMA rates and cache "
                                  "them per GPU UUID; rooflines on this GPU then use them (and say so).")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    args = p.parse_args(argv)
    usable, why, _ = devmod.probe_gpu()
    if not usable:
        raise DeviceUnavailable(f"calibrate measures this machine's GPU and needs a usable one: {why}")
    selection = devmod.select("gpu")
    with device_lock(device_key(selection)):
        cal = measure(selection)
    path = calibration.save(cal)
    if args.json:
        print(json.dumps(cal, indent=2))
        return 0
    key, spec = match_device(selection.device_name)
    sheet = {"memory_gbps": spec["memory_gbps"], "fp64_tflops": spec["peak_tflops"]["fp64"],
             "fp32_tflops": spec["peak_tflops"]["fp32"]} if spec else {}
    print(f"{selection.device_name} ({cal['uuid']}), {cal['measured_at']}; datasheet: {key or 'not in the table'}")
    print(f"  {'peak':<22} {'datasheet':>10} {'calibrated':>11} {'ratio':>6}  repetitions, robust spread")
    for field, label, how in (("memory_gbps", "DRAM GB/s", cal["method"]["copy"]),
                              ("fp64_tflops", "fp64 FMA TFLOP/s", cal["method"]["fp64"]),
                              ("fp32_tflops", "fp32 FMA TFLOP/s", cal["method"]["fp32"])):
        ds = sheet.get(field)
        print(f"  {label:<22} {ds if ds is not None else 'n/a':>10} {cal[field]:>11,.1f} "
              f"{(f'{cal[field] / ds:.2f}' if ds else 'n/a'):>6}  {how['reps']}, ±{100 * how['robust_spread']:.2f}%")
    print(f"cached at {path}; rooflines of profiles on this GPU now use the calibrated peaks and say so")
    return 0
