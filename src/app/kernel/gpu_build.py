"""Compile a stage's .cu with NVRTC through CuPy, and describe what was built.

``compile`` is timed apart from every run (truth rule 3). ``artifacts`` gives,
per stage, the CUDA source, the PTX NVRTC makes from it with the same options,
and each kernel's resource usage (registers, shared/local/const bytes) with the
theoretical occupancy at the chosen block size.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from app.kernel import hostcopy

OPTIONS = ("--std=c++17", "--fmad=false")
# Counter modes (annotation, ncu) set APP_LINEINFO=1 in the worker: the kernels then carry a line table, so
# ncu can name the CUDA source line of each SASS instruction. The #line directives in the module source point
# those lines at the real files of this package, which ncu --import-source reads.
LINEINFO_ENV = "APP_LINEINFO"


def compile_options() -> tuple:
    return OPTIONS + (("-lineinfo",) if os.environ.get(LINEINFO_ENV) == "1" else ())


def module_source(paths) -> str:
    """The files joined into one NVRTC program, each introduced by a #line directive naming its real path."""
    return "\n".join(f'#line 1 "{p.resolve()}"\n{p.read_text()}' for p in paths)
SCAN_SOURCE = Path(__file__).with_name("scan.cu")
COMMON_SOURCE = Path(__file__).with_name("common.cuh")
SCAN_KERNELS = ("scan_i32_i32", "scan_i32_i32_wide", "scan_i32_i64", "scan_i64_i64")
SCAN_STATE_HEAD = 2       # scan.cu's state: tile counter and blocks done, then a status word a tile
SCAN_WIDE_FROM = 1 << 20  # int32 scans this long or longer take scan.cu's wide shape (measured there)
# (input dtype, output dtype) -> (kernel, threads a block, items a thread, blocks an SM: as many as an SM's
# 2,048 threads hold), as scan.cu compiles them. Keyed by dtype objects: formatting dtype names on every call
# cost more host time than a kernel launch.
_SCAN_SHAPES = {(np.dtype(a), np.dtype(b)): (f"scan_{ta}_{tb}", 1024, 2, 2)
                for a, ta in (("int32", "i32"), ("int64", "i64")) for b, tb in (("int32", "i32"), ("int64", "i64"))
                if (a, b) != ("int64", "int32")}
_SCAN_WIDE = {(np.dtype("int32"), np.dtype("int32")): ("scan_i32_i32_wide", 512, 4, 4)}


class Workspace:
    """Scratch buffers reused from one run to the next, keyed by a tag.

    Each CuPy allocation costs ~3.5 us of host time and each cupy.zeros ~9 us;
    after a size read the GPU idles until the host launches again, so that time
    is on the critical path. Only scratch lives here: arrays handed to callers
    are always fresh.
    """

    def __init__(self, cupy):
        self.cp = cupy
        self._bufs: dict = {}

    def empty(self, tag: str, shape, dtype):
        arr = self._bufs.get(tag)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if arr is None or arr.shape != shape or arr.dtype != self.cp.dtype(dtype):
            arr = self._bufs[tag] = self.cp.empty(shape, dtype=dtype)
        return arr

    def zeros(self, tag: str, shape, dtype):
        arr = self.empty(tag, shape, dtype)
        if arr.nbytes:
            self.cp.cuda.runtime.memsetAsync(arr.data.ptr, 0, arr.nbytes, self.cp.cuda.get_current_stream().ptr)
        return arr

    def self_zeroing(self, tag: str, n: int, dtype):
        """At least ``n`` entries, zeroed when allocated and never again here: for state a kernel leaves zeroed
        when it is done (scan.cu's), so no memset is queued between runs."""
        arr = self._bufs.get(tag)
        if arr is None or len(arr) < n or arr.dtype != self.cp.dtype(dtype):
            arr = self._bufs[tag] = self.cp.zeros(n, dtype=dtype)
        return arr


class CudaModule:
    """One NVRTC module: scan.cu (prefix sums) + common.cuh (shared device code) + the kernel's .cu file(s).

    ``source`` is a path, or a tuple of paths compiled in that order (a kernel whose versions keep their
    kernels in files of their own)."""

    def __init__(self, source, stage_kernels: dict, library_calls: dict, scan_stages=(), shared_per_warp=None):
        import cupy

        self.cp = cupy
        self.source_paths = tuple(source) if isinstance(source, (tuple, list)) else (source,)
        self.source_path = self.source_paths[0]
        self.scan_stages = set(scan_stages)
        self.source = module_source((SCAN_SOURCE, COMMON_SOURCE, *self.source_paths))
        self.options = compile_options()
        self.stage_kernels = {s: tuple(k) + (SCAN_KERNELS if s in self.scan_stages else ())
                              for s, k in stage_kernels.items()}
        self.library_calls = library_calls
        self.shared_per_warp = dict(shared_per_warp or {})   # kernel -> dynamic shared memory bytes a warp
        self.module = cupy.RawModule(code=self.source, options=self.options)
        self.kernels: dict = {}     # name -> RawKernel: the kernel's attributes (registers, shared memory, ...)
        self.fn: dict = {}          # name -> its compiled Function on this device: what the stages launch
        self.ws = Workspace(cupy)
        self.sm_count = cupy.cuda.Device().attributes["MultiProcessorCount"]
        self._ptx: str | None = None

    def compile(self, blocks: dict) -> dict:
        t0 = time.perf_counter()
        for names in self.stage_kernels.values():
            for name in names:
                self.kernels[name] = self.module.get_function(name)   # NVRTC + module load on first call
                # Launches go through the Function, not the RawKernel, whose every call asks the runtime for the
                # current device to pick that device's Function. At the default sizes the plans are bound by
                # their host's launches, and in one process on an H100 node, launching this way ran join v4's
                # stages after the build in 307 against 325 us and overlay v3's in 555 against 577 us. A backend
                # is bound to the device it was built on anyway: its workspace buffers live there.
                # Nearer the driver gains little more. On an H200 node (its host loop at 43 us), the driver's
                # cuLaunchKernel with an argument block packed beforehand took 3.8 us a launch, the Function 4.4 us
                # with one argument and 6.2 us with fourteen (refine's); packing the block in Python at each launch
                # took 9.9 us. Keeping each site's block from run to run, and knowing when an argument changed, is
                # what a CUDA graph does for the whole plan (app.runtime.graph).
                self.fn[name] = self.kernels[name].kernel
        seconds = time.perf_counter() - t0
        occupancy = {stage: min(self.occupancy(self.kernels[n], blocks.get(stage, 256), n) or 0 for n in names) or None
                     for stage, names in self.stage_kernels.items()}
        return {"total_seconds": seconds, "compiler": "NVRTC via cupy.RawModule", "options": list(self.options),
                "kernels": sorted(self.fn), "occupancy": occupancy,
                "note": "includes CuPy's on-disk kernel cache: a warm cache makes this a module load"}

    def inclusive_scan(self, x, out_dtype, tag: str, n_dev=None):
        """Inclusive prefix sum of a 1-D int array on the current stream, in one launch (no host sync).

        The result lives in the workspace under ``tag``: valid until the next scan with that tag.
        ``n_dev``, a one-element int64 device array, makes the scan cover only its first
        ``n_dev[0]`` entries (at most ``len(x)``), a length the host never reads.
        """
        n = len(x)
        out = self.ws.empty(tag, n, out_dtype)
        if n == 0:
            return out
        key = (x.dtype, out.dtype)
        # The wide shape for long scans of the whole buffer only. A scan whose length the device reads (n_dev)
        # is mostly far shorter than its buffer (join's cell table at 1M x 100k), and the wide shape's twice as
        # many blocks would mostly start, find nothing left and return. Fixed for a buffer: a graph replays it.
        name, threads, items, per_sm = _SCAN_WIDE[key] if n >= SCAN_WIDE_FROM and n_dev is None and \
            key in _SCAN_WIDE else _SCAN_SHAPES[key]
        tile = threads * items
        tiles = (n + tile - 1) // tile
        state = self.scan_state(tag, n, tile)
        nd = np.intp(0) if n_dev is None else n_dev
        blocks = min(tiles, per_sm * self.sm_count)
        self.fn[name]((blocks,), (threads,), (x, _i64(n), nd, out, state))
        return out

    def scan_state(self, tag: str, n: int, tile: int):
        """The state of a scan of ``n`` entries in tiles of ``tile`` run inside a kernel of the caller's (scan.cu's
        scan_single_pass, which leaves it zeroed when done), under ``tag``."""
        return self.ws.self_zeroing(tag + ".state", SCAN_STATE_HEAD + (n + tile - 1) // tile, np.uint64)

    def resources(self, fn) -> dict:
        out = {}
        for attr in ("num_regs", "shared_size_bytes", "local_size_bytes", "const_size_bytes",
                     "max_threads_per_block", "ptx_version", "binary_version"):
            try:
                out[attr] = int(getattr(fn, attr))
            except Exception:  # attribute missing in this CuPy: leave it out, don't guess
                pass
        return out

    def shared_bytes(self, name: str, block: int) -> int:
        """Dynamic shared memory kernel ``name`` is launched with at ``block`` threads."""
        return self.shared_per_warp.get(name, 0) * (block // 32)

    def resident_blocks(self, fn, block: int, name: str = "") -> int:
        """Blocks of ``block`` threads an SM holds at once, with the kernel's dynamic shared memory: the driver's
        occupancy calculator. ``fn`` is a RawKernel (RawModule.get_function), as compile keeps them."""
        from cupy.cuda import driver

        handle = getattr(getattr(fn, "kernel", fn), "ptr")      # a RawKernel's driver handle is its .kernel.ptr
        return driver.occupancyMaxActiveBlocksPerMultiprocessor(handle, block, self.shared_bytes(name, block))

    def occupancy(self, fn, block: int, name: str = "") -> float | None:
        """Theoretical occupancy (%) at ``block`` threads, with the kernel's dynamic shared memory: resident
        warps / max warps per SM."""
        try:
            from cupy.cuda import runtime

            blocks = self.resident_blocks(fn, block, name)
            max_threads = runtime.getDeviceProperties(runtime.getDevice())["maxThreadsPerMultiProcessor"]
            return 100.0 * blocks * block / max_threads
        except Exception:
            return None

    def launched(self, run, stage_of) -> set[tuple[str, str]]:
        """(stage, kernel) for each kernel of ours ``run`` launches: it runs once with each Function wrapped to note
        its name and ``stage_of()``, the stage running then. The wrapper costs host time: for an untimed run only."""
        seen, fns = set(), self.fn
        self.fn = {n: (lambda *a, _n=n, _f=f, **k: (seen.add((stage_of(), _n)), _f(*a, **k))[1])
                   for n, f in fns.items()}
        try:
            run()
        finally:
            self.fn = fns
        return seen

    def occupancy_of(self, blocks: dict, launched: set[tuple[str, str]]) -> dict:
        """{stage: (the lowest theoretical occupancy among the kernels it launched, those kernels)}: a stage
        registers every version's kernels (join's candidate_filter, five candidate_fill widths) and the scans any
        scanning stage may run, and those its run did not launch say nothing about it. Stages that launched none
        of ours are left out."""
        out = {}
        for stage, names in self.stage_kernels.items():
            ran = sorted(n for n in names if (stage, n) in launched)
            if ran:
                occ = [self.occupancy(self.kernels[n], blocks.get(stage, 256), n) for n in ran]
                out[stage] = (min(occ) if None not in occ else None, ran)
        return out

    def ptx(self) -> str:
        """The PTX NVRTC makes from the same source and options, for a virtual arch of this GPU."""
        if self._ptx is None:
            try:
                from cupy.cuda import device
                from cupy_backends.cuda.libs import nvrtc

                arch = f"--gpu-architecture=compute_{device.Device().compute_capability}"
                prog = nvrtc.createProgram(self.source, self.source_path.name, [], [])
                try:
                    try:
                        nvrtc.compileProgram(prog, [*self.options, arch])
                    except Exception as exc:        # the compiler's own words, not only its error code
                        log = nvrtc.getProgramLog(prog)
                        log = log.decode(errors="replace") if isinstance(log, bytes) else str(log)
                        raise RuntimeError(f"{exc}: {log.strip()[-400:]}") from None
                    ptx = nvrtc.getPTX(prog)
                finally:
                    nvrtc.destroyProgram(prog)
                self._ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
            except Exception as exc:
                self._ptx = f"// PTX unavailable: {type(exc).__name__}: {exc}\n"
        return self._ptx

    def artifacts(self, blocks: dict) -> dict:
        out = {}
        for stage, names in self.stage_kernels.items():
            block = blocks.get(stage, 256)
            res = {n: self.resources(self.kernels[n]) | {"block": block,
                                                         "dynamic_shared_bytes": self.shared_bytes(n, block),
                                                         "theoretical_occupancy_pct": self.occupancy(self.kernels[n],
                                                                                                     block, n)}
                   for n in names}
            out[stage] = {
                **{path.name: path.read_text() for path in self.source_paths},
                self.source_path.stem + ".ptx": self.ptx(),
                "resources.json": json.dumps({"kernels": res, "compile_options": list(self.options),
                                              "library_calls": self.library_calls.get(stage, "")}, indent=2),
            }
            out[stage][COMMON_SOURCE.name] = COMMON_SOURCE.read_text()
            if stage in self.scan_stages:
                out[stage][SCAN_SOURCE.name] = SCAN_SOURCE.read_text()
        for stage, calls in self.library_calls.items():
            if stage not in out:
                out[stage] = {"resources.json": json.dumps({"kernels": {}, "library_calls": calls}, indent=2)}
        return out


class GpuBackend:
    """What every kernel's GPU backend shares: its module, compile, artifacts, launches.

    Subclasses set SOURCE, STAGE_KERNELS, LIBRARY_CALLS and SCAN_STAGES, and add one
    method per plan stage.
    """

    device = "gpu"
    SOURCE: Path | tuple      # the kernel's .cu file, or files compiled in order
    STAGE_KERNELS: dict
    LIBRARY_CALLS: dict
    SCAN_STAGES: tuple = ()
    SHARED_PER_WARP: dict = {}   # kernel -> dynamic shared memory bytes a warp (launch and occupancy both use it)

    def __init__(self, tiling: dict, version: str = "v1"):
        import cupy

        self.cp = cupy
        self.tiling = tiling
        self.version = version
        self.mod = CudaModule(self.SOURCE, self.STAGE_KERNELS, self.LIBRARY_CALLS, scan_stages=self.SCAN_STAGES,
                              shared_per_warp=self.SHARED_PER_WARP)
        self.sm_count = self.mod.sm_count      # fixed grids are sized in blocks an SM
        self._staging = None          # pinned host buffers for the inputs, made on the first run
        self._resident: dict = {}     # (kernel, block) -> blocks an SM holds: a cooperative launch's limit

    def _blocks(self) -> dict:
        return {s: t.get("block", 256) for s, t in self.tiling.items()}

    def compile(self) -> dict:
        info = self.mod.compile(self._blocks())
        # The staging's C library (app.kernel.hostcopy) is built here on first use, so that the compiler's
        # time is the compile step's, not the cold run's; later processes find it cached and only load it.
        t0 = time.perf_counter()
        lib, how = hostcopy.load()
        seconds = time.perf_counter() - t0
        info["total_seconds"] += seconds
        info["host_copy"] = {"seconds": seconds, "loaded": lib is not None, "how": how}
        return info

    def artifacts(self) -> dict:
        return self.mod.artifacts(self._blocks())

    def launched_occupancy(self, run) -> dict:
        """CudaModule.occupancy_of for the kernels ``run`` (one untimed run of the plan) launches, each stage's
        own: the stage methods are wrapped for that run to say which stage is running."""
        current = [None]
        stages = [name for name in self.tiling if callable(getattr(self, name, None))]

        def marked(name, method):
            def stage(*a, **k):
                current[0] = name
                return method(*a, **k)
            return stage

        for name in stages:
            setattr(self, name, marked(name, getattr(self, name)))
        try:
            launched = self.mod.launched(run, lambda: current[0])
        finally:
            for name in stages:
                delattr(self, name)
        return self.mod.occupancy_of(self._blocks(), launched)

    def outputs_to_host(self, arrays) -> tuple:
        """A run's result columns to host arrays, all waited for at once: each column's copy is queued on the
        current stream into pinned memory from CuPy's pinned pool (the copy runs at the link's speed instead
        of through the driver's pageable staging, and the pool keeps the pages pinned for the next result),
        then the stream is waited for once. Synchronous for the caller, as cupy.asnumpy is. On an H200 node,
        against a synchronous copy a column: join's two columns 64 against 102 us at 100k x 10k and 164
        against 169 us at 1M x 100k, overlay's three 132 against 158 us at 100k x 100k."""
        import cupyx

        stream = self.cp.cuda.get_current_stream()
        arrays = [self.cp.ascontiguousarray(a) for a in arrays]
        host = tuple(cupyx.empty_pinned(a.shape, a.dtype) for a in arrays)
        for array, out in zip(arrays, host):
            if array.size:
                array.get(out=out, stream=stream, blocking=False)
        stream.synchronize()
        return host

    def stage_in(self, st, **arrays) -> dict:
        """Host arrays to the device through pinned staging, ``name=(array, dtype)``; see app.kernel.staging."""
        if self._staging is None:
            from app.kernel.staging import PinnedStaging

            self._staging = PinnedStaging(self.cp)
        return self._staging.to_device(st, arrays)

    def staging_dma(self) -> dict | None:
        """The last run's staged inputs sent again from their pinned buffers, with no host copy: the link's
        share of the build (app.kernel.staging.PinnedStaging.dma_alone). None when nothing was staged."""
        return self._staging.dma_alone() if self._staging is not None else None

    def _launch(self, name, n, block, args):
        if n > 0:
            self.mod.fn[name](((n + block - 1) // block,), (block,), args)

    def barrier_word(self, kernel: str):
        """The word a cooperative kernel's grid barrier counts arrivals in (common.cuh's grid_barrier): zeroed
        once, and every barrier leaves it as it found it but for its top bit, so no run resets it."""
        return self.mod.ws.self_zeroing(kernel + ".barrier", 1, np.uint32)

    def _launch_cooperative(self, name, n, block, args):
        """A kernel that waits for its whole grid at barriers, launched cooperatively so that every block
        is resident at once: a block a ``block`` of the ``n`` items, at most as many as the SMs hold (the kernel
        strides over the rest), and at least one."""
        key = (name, block)
        per_sm = self._resident.get(key)
        if per_sm is None:
            per_sm = self._resident[key] = self.mod.resident_blocks(self.mod.kernels[name], block, name)
        blocks = max(1, min((n + block - 1) // block, per_sm * self.sm_count))
        self.mod.fn[name]((blocks,), (block,), args, enable_cooperative_groups=True)


def _i64(v):
    return np.int64(v)
