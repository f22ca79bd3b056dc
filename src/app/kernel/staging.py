"""Host arrays to the device through pinned staging buffers, the host copy overlapped with the DMA.

A copy from pageable host memory makes the driver stage it through a small pinned buffer of its own,
one piece after another, with the host thread waiting: about 7 GB/s on an H200 node, 8-10x the
join's compute at 1M x 100k. Here each input is copied in pieces, on a few threads at once, into a
pinned buffer, and each piece's DMA is queued on the plan's stream as soon as its bytes are in, so
the host copy of the next pieces runs while the previous ones cross the link. A dtype change
(int64 offsets to the kernels' int32) happens in the same host pass. Inputs under a few MB in all
(COMPILED_MIN_STAGED_BYTES, or MIN_STAGED_BYTES for numpy's copy) take the driver's pageable copy
instead: measured faster there.

An input that already lives in pinned (page-locked) host memory -- ``pin_inputs`` makes such copies,
as a loader that reads into pinned buffers would -- with the kernel's dtype is not copied on the host at
all: its DMA is queued straight from the caller's array.

The host copy is the bound: on an H200 node the DMA from pinned memory runs at 52-55 GB/s, and the copy
into pinned memory shares the host's memory with it. Two ways to make that copy:

- **compiled** (``app.kernel.hostcopy``, built on first use with the system's C compiler): threads in C
  copy 128 KiB slices, in order, with streaming stores (the pinned lines are not read before they are
  written), and the calling thread queues each DMA the moment its slices are in: the first DMA one slice,
  each next twice the last, up to 4 MiB. So the link starts after one slice's copy, and the DMAs stay few
  (each costs ~2.5 us of the copy engine beyond its bytes'). With 1 MiB chunks, each its own DMA, as
  before, against this (interleaved on an H200 node): join v4 at 1M x 100k 1.76 against 1.63 ms end to end
  (the build 1.32 against 1.19 ms), overlay v3 at 100k x 100k 2.95 against 2.80 ms (1.76 against 1.60 ms).
  It also narrows int64 offsets to int32. Against numpy's copy (below), measured interleaved on H200 nodes,
  join v4 at 1M x 100k end to end: 2.35 against 3.00 ms and 2.20 against 2.99 ms; staging of 2 MB and more
  this way beats the driver's pageable copy. Python hands the library
  one row an array and the library cuts the pieces: cutting them here, with numpy's ``ctypes`` address
  lookups for every piece, kept the first byte waiting 0.2-0.4 ms into the build (join v4 end to end on
  one H200 node, interleaved: 760 against 611 us at 100k x 10k, 2.39 against 2.05 ms at 1M x 100k).
- **numpy** (no C compiler, or ``APP_HOST_COPY=numpy``): numpy copies 4 MiB chunks on a few Python
  threads, the main thread woken as each lands to queue its DMA. The threads start one after another, as
  each takes the interpreter's lock, and glibc's memcpy streams only past its x86_non_temporal_threshold
  (158 MB on those hosts), so it is the slower way; from 16 MiB only, below which the driver's pageable
  copy is faster. GLIBC_TUNABLES setting that threshold to 1 MiB made the numpy build of join 1M x 100k
  2.11-2.29 against 2.56-2.60 ms (docs/modes/event.md); it is a process-wide setting read at start-up,
  so it is documented, not set here.

An array the compiled copy does not take (a strided one, a dtype change other than int64 to int32) is
copied by numpy in the same build. The build's ``staging`` metadata says which way each part went, and why.

The host copy is inside the timed build: the plan's inputs are ordinary (pageable) numpy arrays, as
a caller has them. The pinned buffers themselves are allocated on the first run and reused (the cold
run pays for them, and it is reported apart); reuse is safe because every run ends with a
synchronisation of its stream, so no DMA from the previous run is still reading them.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from app.errors import AppError
from app.kernel import hostcopy

CHUNK_BYTES = 4 << 20        # numpy copies: measured best on an H200 node against 256 KiB and 1 MiB (more hand-offs)
# The compiled copy's threads take COMPILED_SLICE_BYTES at a time, in order, and the DMAs send whole slices:
# the first one slice, each next one twice the last, up to COMPILED_DMA_BYTES. A first DMA of one slice starts
# the link after a slice's copy instead of a full DMA's (a thread copies ~9 GB/s: 1 MiB took ~115 us), and the
# later DMAs stay large because each costs ~2.5 us of the copy engine's time beyond its bytes'.
COMPILED_SLICE_BYTES = 128 << 10
COMPILED_DMA_BYTES = 4 << 20
MAX_THREADS = 8              # both copies release the GIL: a few threads fill the host's memory bandwidth
# Below this many bytes in all, the driver's own pageable copy is faster: on an H200 node 5 MB took 686 us
# that way against 800-940 us staged (the host copy runs at ~6 GB/s a thread, and the threads do not
# scale on a few chunks), while 50 MB took 7.9 ms against 2.2 ms staged with 4-8 threads.
MIN_STAGED_BYTES = 16 << 20
# With the compiled copy (app.kernel.hostcopy) staging wins from a few MB: on an H200 node 2 MB took 223 us
# staged against 237 us pageable, 4 MB 346 against 516 us; 1 MB 200 against 148 us.
COMPILED_MIN_STAGED_BYTES = 2 << 20


class PinnedStaging:
    def __init__(self, cupy, threads: int | None = None):
        self.cp = cupy
        self.threads = threads or max(1, min(MAX_THREADS, (os.cpu_count() or 2) // 2))
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="staging") if self.threads > 1 else None
        self._pinned: dict = {}
        self._last_staged: list = []     # the pinned arrays the last staged copy filled (for dma_alone)

    def _buffer(self, tag: str, shape, dtype) -> np.ndarray:
        """A pinned host array for ``tag``, kept from run to run (reallocated when the size changes). The view
        is kept too while the shape and dtype stay: making it again cost microseconds of the build's time."""
        dtype = np.dtype(dtype)
        mem, size, view = self._pinned.get(tag, (None, -1, None))
        if view is not None and view.shape == shape and view.dtype == dtype:
            return view
        nbytes = math.prod(shape) * dtype.itemsize
        if size < nbytes:
            mem, size = self.cp.cuda.alloc_pinned_memory(max(nbytes, 1)), nbytes
        view = np.frombuffer(mem, np.uint8, nbytes).view(dtype).reshape(shape)
        self._pinned[tag] = (mem, size, view)
        return view

    def to_device(self, st, arrays: dict) -> dict:
        """``{tag: (host_array, dtype)}`` -> ``{tag: device array}``, every DMA queued on the current stream.

        The copies are counted in the stage context ``st`` (one per array, with its bytes).
        """
        cp = self.cp
        stream = cp.cuda.get_current_stream()
        out, direct = {}, []
        self._last_staged = []
        for tag, (host, dtype) in arrays.items():
            host = np.asarray(host)
            if host.nbytes and host.dtype == np.dtype(dtype) and host.flags.c_contiguous and is_pinned(cp, host):
                dev = out[tag] = cp.empty(host.shape, dtype=dtype)
                st.count_h2d(dev.nbytes)
                cp.cuda.runtime.memcpyAsync(dev.data.ptr, host.ctypes.data, host.nbytes,
                                            cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
                direct.append(tag)
        rest = {tag: v for tag, v in arrays.items() if tag not in out}
        how = [f"{len(direct)} of {len(arrays)} arrays straight from the caller's pinned memory"] if direct else []
        out |= self._staged(st, rest, stream, how)
        st.meta["staging"] = "; ".join(how)
        return out

    def _staged(self, st, arrays: dict, stream, how: list) -> dict:
        """Arrays in pageable host memory (or needing a dtype change): pinned staging from a few MB."""
        if not arrays:
            return {}
        cp = self.cp
        total = sum(np.asarray(host).size * np.dtype(dtype).itemsize for host, dtype in arrays.values())
        lib, why = hostcopy.load()
        htod = hostcopy.driver_htod() if lib is not None else None
        if lib is not None and htod is None:
            lib, why = None, "the CUDA driver's cuMemcpyHtoDAsync_v2 was not found"
        least = COMPILED_MIN_STAGED_BYTES if lib is not None else MIN_STAGED_BYTES
        if total < least:
            how.append(f"pageable copies ({total / 1e6:.1f} MB, under the {least >> 20} MiB from which "
                       "pinned staging is faster)")
            return {tag: st.to_device(np.ascontiguousarray(host, dtype=dtype)) for tag, (host, dtype) in arrays.items()}
        out, rows, by_numpy = {}, [], []
        for tag, (host, dtype) in arrays.items():
            host = np.asarray(host)
            pinned = self._buffer(tag, host.shape, dtype)
            self._last_staged.append(pinned)
            dev = out[tag] = cp.empty(host.shape, dtype=dtype)
            row = hostcopy.row_of(host, pinned, dev.data.ptr) if lib is not None else None
            if row is None:
                by_numpy.append((host, pinned, dev))
            else:
                rows.append(row)
        threads = _count(self.threads, "host thread")
        if lib is not None:
            err, dmas = hostcopy.stage(lib, rows, COMPILED_SLICE_BYTES, COMPILED_DMA_BYTES, self.threads, htod,
                                       stream.ptr) if rows else (0, 0)
            if err == hostcopy.NOT_STARTED:
                raise AppError("the compiled host copy could not start its threads (out of threads or memory); "
                               f"set {hostcopy.DISABLE_ENV}=numpy to stage with numpy instead")
            if err:
                raise RuntimeError(f"the host->device copy of staged bytes failed (CUDA driver error {err})")
            # Each DMA is a copy of its own, as a trace of the run shows it.
            st.count_h2d(sum(row[3] for row in rows), copies=dmas)
            how.append(f"pinned, {_dma_text(dmas, [row[3] for row in rows])}, written in slices of "
                       f"{_size(COMPILED_SLICE_BYTES)} by {threads}, compiled copy with streaming stores ({why})")
        if by_numpy or lib is None:
            n = self._numpy_copies(st, by_numpy, stream)
            how.append(f"pinned, {_count(n, 'chunk')} of up to {_size(CHUNK_BYTES)}, {threads}, numpy copies ("
                       + ("a strided array or a dtype change the compiled copy does not make" if lib is not None
                          else why) + ")")
        return out

    def _numpy_copies(self, st, arrays: list, stream) -> int:
        """``(host, pinned, device)`` triples copied by numpy on the pool's threads in CHUNK_BYTES pieces, each
        piece's DMA queued as soon as it is in pinned memory. Returns the number of pieces."""
        cp, jobs = self.cp, []
        for host, pinned, dev in arrays:
            flat_src, flat_pin = host.reshape(-1), pinned.reshape(-1)
            step = max(1, CHUNK_BYTES // pinned.itemsize)
            for lo in range(0, flat_pin.size, step):
                hi = min(lo + step, flat_pin.size)
                jobs.append((flat_src[lo:hi], flat_pin[lo:hi], dev.data.ptr + lo * pinned.itemsize))
        pending = [self._pool.submit(_copy_into, src, pin) for src, pin, _ in jobs] if self._pool else None
        for i, (src, pin, dst) in enumerate(jobs):
            if pending is None:
                _copy_into(src, pin)
            else:
                pending[i].result()          # this chunk is in pinned memory: its DMA can start
            cp.cuda.runtime.memcpyAsync(dst, pin.ctypes.data, pin.nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                        stream.ptr)
            st.count_h2d(pin.nbytes)         # each piece's DMA is a copy of its own
        return len(jobs)

    def dma_alone(self, repeats: int = 5) -> dict | None:
        """The last staged copy's DMA with no host copy before it: the same bytes sent again from the pinned
        buffers they were staged in, into device scratch, timed with CUDA events (median of ``repeats``).
        Beside the build's own time it splits the build into the link and the host copy. None when the last
        run staged nothing (small inputs took the pageable copy, or the inputs were pinned already)."""
        if not self._last_staged:
            return None
        cp = self.cp
        stream = cp.cuda.get_current_stream()
        nbytes = sum(p.nbytes for p in self._last_staged)
        scratch = cp.empty(max(nbytes, 1), dtype=cp.uint8)
        times = []
        for _ in range(max(1, repeats)):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            offset = 0
            for pinned in self._last_staged:
                cp.cuda.runtime.memcpyAsync(scratch.data.ptr + offset, pinned.ctypes.data, pinned.nbytes,
                                            cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
                offset += pinned.nbytes
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        seconds = float(np.median(times))
        return {"bytes": int(nbytes), "seconds": seconds, "gbps": nbytes / seconds / 1e9 if seconds > 0 else None,
                "runs": len(times), "samples": times,
                "how": "the last run's staged bytes sent again from their pinned buffers, no host copy before "
                       "them; CUDA events, median of the runs"}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def dma_sizes(lengths: list[int], slice_bytes: int, dma_bytes: int) -> list[int]:
    """The bytes of each DMA the compiled copy cuts from arrays of ``lengths`` bytes (hostcopy.c's cut_runs): the
    k-th of the call min(dma_bytes, slice_bytes << k), an array's last one shorter, both sizes rounded down to a
    multiple of 8."""
    step = lambda b: 8 if b < 16 else b - b % 8     # noqa: E731  (hostcopy.c's step_of)
    size, most, out = step(slice_bytes), step(max(dma_bytes, slice_bytes)), []
    for n in lengths:
        lo = 0
        while lo < n:
            out.append(min(size, n - lo))
            lo += out[-1]
            size = min(2 * size, most)
    return out


def _dma_text(dmas: int, lengths: list[int]) -> str:
    """The DMAs as sent: their count and the smallest and largest, then the rule that cut them. The rule's sizes are
    no bounds on them (an array's last DMA is shorter: an H200 join's 8 DMAs were 40,004 to 1,600,000 bytes, not
    '128 KiB to 4 MiB'), nor an order (each is issued as its slices are written, by several threads). Where the
    library's count disagrees with the rule, only the count and the rule are given."""
    sizes = dma_sizes(lengths, COMPILED_SLICE_BYTES, COMPILED_DMA_BYTES)
    # The rule that cut them, not an order they run in: the host threads issue each as its slices are written, and
    # an array's last DMA is what is left of it (a 40,004-byte tail, then the next array's 1,600,000 bytes).
    rule = (f"cut in sizes from one slice of {_size(COMPILED_SLICE_BYTES)} doubling up to {_size(COMPILED_DMA_BYTES)}, "
            "an array's last what is left of it; each issued as its slices are written")
    if len(sizes) != dmas or not sizes:
        return f"{_count(dmas, 'DMA')} ({rule})"
    span = f"{min(sizes):,} bytes" if min(sizes) == max(sizes) else f"{min(sizes):,} to {max(sizes):,} bytes"
    return f"{_count(dmas, 'DMA')} of {span} ({rule})"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _size(nbytes: int) -> str:
    if nbytes % (1 << 20) == 0:
        return f"{nbytes >> 20} MiB"
    return f"{nbytes >> 10} KiB" if nbytes % (1 << 10) == 0 else f"{nbytes:,} bytes"


def _copy_into(src: np.ndarray, pinned: np.ndarray) -> None:
    np.copyto(pinned, src, casting="same_kind")


def is_pinned(cupy, host: np.ndarray) -> bool:
    """Whether ``host`` lives in page-locked memory the GPU can read by DMA (cudaHostAlloc'd or registered)."""
    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(host.ctypes.data)
    except Exception:      # pageable memory on an old driver answers with an error: not pinned
        return False
    return attrs.type == cupy.cuda.runtime.memoryTypeHost


def pin_inputs(obj):
    """A copy of a plan's inputs with every numpy array in pinned host memory (CuPy's pinned pool), fields
    of nested dataclasses included: the inputs as a loader that reads into pinned buffers hands them over."""
    import dataclasses

    import cupyx

    if isinstance(obj, np.ndarray):
        out = cupyx.empty_pinned(obj.shape, obj.dtype)
        out[...] = obj
        return out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: pin_inputs(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                           if f.init})
    return obj
